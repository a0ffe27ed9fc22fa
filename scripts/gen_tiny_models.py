#!/usr/bin/env python3
"""Write tiny random-weight GGUF models for fast engine tests.

    scripts/gen_tiny_models.py OUTDIR [--list] [--only NAMES] [--arch]

Each model is a complete Llama-architecture GGUF (all llama.* hyper-parameters,
a byte-level BPE tokenizer with ChatML special tokens and pre=smollm, a chat
template) small enough that a forward pass takes milliseconds, so most of the
reference suite can run on them. The set covers the engine's shape and type
cases:

  mha      n_head_kv == n_head
  gqa      8 heads sharing 2 KV heads; Q4_1 matrices with a Q8_0 token
           embedding, the same mix as SmolLM2-135M-Instruct.Q4_1
  mqa      one KV head
  untied   a separate output.weight (tied models reuse token_embd)
  odd      n_embd 96 (3 heads of 32), n_ff 224, vocab 301, other rope base/eps
  hd64     head size 64 (f16), hd128 head size 128 (q8_0): the sizes with
           their own attention kernels
  type-*   one model per weight type for the big matrices:
           f32, f16, bf16, q8_0, q4_0, q4_1 (norm weights are always F32)
  kquant   the mix of a Q4_K_M file (Q4_K, Q6_K for V, FFN down and output;
           Q5_K for K here, to cover every K-quant format)
  q5       Q5_0 and Q5_1, which K-quant files use for rows that are not a
           multiple of 256

With --arch, the models of the other architectures (ARCH_VARIANTS, written
only when asked for, by --arch or --only, until every backend runs them):

  qwen2    Q/K/V biases, NEOX RoPE, untied output
  qwen3    per-head Q/K norms, head size 64 with n_embd 128 and 4 heads
  gemma3   six layers (five local with a window of 5 positions, one global),
           GeGLU, Q/K norms, post-attention and post-FFN norms, embedding
           scale, RoPE bases 10000 (local) and 1e6 (global)
  llama3   Llama 3.x RoPE: a rope_freqs tensor and linear scaling (factor 2)
  mistral  llama with attention.sliding_window 5 on every layer

Written only by name (--only), SHAPE_VARIANTS:

  hd256    head size 256 (2 heads sharing one KV head), the widest with its
           own attention kernels

Every matmul's inner dimension is a multiple of 32, the quantization block
(256, the super-block, for K-quants). Quantization to Q8_0 / Q4_0 / Q4_1 /
Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K / BF16 is done here in NumPy from the ggml
block formats; K-quant packing is checked against gguf-py's decoder as it is
written. Q and K weights are written in GGUF's llama layout: the engine
applies "normal" RoPE pairing (2i, 2i+1) to the stored rows; for random
weights no converter permutation is involved.

Output is deterministic (fixed seeds): re-running gives byte-identical files.
A file is rewritten only if its content would change, so a cached directory
is cheap to refresh.
"""

import argparse
import hashlib
import os
import sys
import tempfile

import numpy as np
import gguf

GT = gguf.GGMLQuantizationType
QK = 32
EMB_STD = 0.1
BLOCK_GAIN = 2.0
OUT_GAIN = 6.0

# name -> hyper-parameters and types. "wtype" is the type of the big matrices,
# "etype" of token_embd, "otype" of output.weight (untied models only).
VARIANTS = {
    "mha":      dict(n_layer=2, n_embd=128, n_head=4, n_head_kv=4, n_ff=256, n_vocab=300,
                     wtype="f16", etype="f16"),
    "gqa":      dict(n_layer=3, n_embd=256, n_head=8, n_head_kv=2, n_ff=512, n_vocab=300,
                     wtype="q4_1", etype="q8_0"),
    "mqa":      dict(n_layer=2, n_embd=128, n_head=4, n_head_kv=1, n_ff=384, n_vocab=300,
                     wtype="q4_0", etype="q4_0"),
    "untied":   dict(n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_vocab=300,
                     wtype="q8_0", etype="f32", otype="q8_0"),
    "odd":      dict(n_layer=3, n_embd=96, n_head=3, n_head_kv=1, n_ff=224, n_vocab=301,
                     wtype="q4_1", etype="q4_1", rope_base=500000.0, eps=1e-6),
    # head sizes with their own attention kernels (64, 128)
    "hd64":     dict(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=256, n_vocab=300,
                     wtype="f16", etype="f16"),
    "hd128":    dict(n_layer=2, n_embd=256, n_head=2, n_head_kv=1, n_ff=256, n_vocab=300,
                     wtype="q8_0", etype="q8_0"),
    # the K-quant mix of a Q4_K_M file: Q4_K, with Q6_K for V, FFN down and
    # the output, and Q5_K for K to cover all three super-block formats
    "kquant":   dict(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=300,
                     wtype="q4_k", etype="q4_k", otype="q6_k",
                     types={"attn_v": "q6_k", "ffn_down": "q6_k", "attn_k": "q5_k"}),
    # the 32-element fallbacks of K-quant files (rows not a multiple of 256)
    "q5":       dict(n_layer=2, n_embd=160, n_head=5, n_head_kv=1, n_ff=320, n_vocab=300,
                     wtype="q5_0", etype="q5_1", types={"attn_v": "q5_1", "ffn_down": "q5_1"}),
}
for _t in ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"):
    VARIANTS["type-" + _t] = dict(n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=320,
                                  n_vocab=300, wtype=_t, etype=_t)

# Other architectures. "arch" picks the GGUF architecture; the rest of the
# structure follows from it (see the docstring); "window" is shorter than the
# reference suite's prompts so that local attention is exercised.
ARCH_VARIANTS = {
    "qwen2":    dict(arch="qwen2", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_vocab=300,
                     wtype="q8_0", etype="f16", otype="q8_0", rope_base=1000000.0, eps=1e-6),
    "qwen3":    dict(arch="qwen3", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, head_dim=64, n_ff=256,
                     n_vocab=300, wtype="f16", etype="f16", rope_base=1000000.0, eps=1e-6),
    "gemma3":   dict(arch="gemma3", n_layer=6, n_embd=128, n_head=2, n_head_kv=1, head_dim=64, n_ff=256,
                     n_vocab=300, wtype="q8_0", etype="q8_0", rope_base=1000000.0, eps=1e-6, window=5),
    "llama3":   dict(arch="llama", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_vocab=300,
                     wtype="f16", etype="f16", rope_base=500000.0, rope_freqs=True, rope_linear=2.0),
    "mistral":  dict(arch="llama", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_vocab=300,
                     wtype="q8_0", etype="q8_0", window=5),
}
# Shapes written only when asked for by name (--only), for tests that sweep
# a dimension (tests/integration/t_matrix.sh: head sizes 32 .. 256).
SHAPE_VARIANTS = {
    "hd256":    dict(n_layer=2, n_embd=512, n_head=2, n_head_kv=1, n_ff=256, n_vocab=300,
                     wtype="q8_0", etype="q8_0"),
}
ALL_VARIANTS = dict(VARIANTS, **ARCH_VARIANTS, **SHAPE_VARIANTS)

FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "bf16": 32, "q4_k": 15}

# --------------------------------------------------------------------------
# quantizers (ggml block layouts; little-endian)


def _f16_bytes(a):
    return a.astype("<f2").view(np.uint8).reshape(a.shape[0], 2)


def _safe_inv(d):
    return np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0).astype(np.float32)


def quant_q8_0(w):
    """Q8_0 block: f16 d, 32 x int8 q; value = q * d."""
    b = w.reshape(-1, QK).astype(np.float32)
    amax = np.abs(b).max(axis=1)
    d = amax / 127.0
    d16 = d.astype(np.float16)
    q = np.clip(np.rint(b * _safe_inv(d16.astype(np.float32))[:, None]), -127, 127).astype(np.int8)
    return np.concatenate([_f16_bytes(d16), q.view(np.uint8)], axis=1)


def _pack_nibbles(q):
    """q: (nb, 32) values 0..15 -> (nb, 16) bytes; element j in the low nibble
    of byte j, element 16+j in the high nibble."""
    q = q.astype(np.uint8)
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def quant_q4_0(w):
    """Q4_0 block: f16 d, 16 bytes of nibbles; value = (q - 8) * d.
    d = (signed value of largest magnitude) / -8, so that value maps to q = 0."""
    b = w.reshape(-1, QK).astype(np.float32)
    idx = np.argmax(np.abs(b), axis=1)
    mx = b[np.arange(b.shape[0]), idx]
    d16 = (mx / -8.0).astype(np.float16)
    q = np.clip(np.floor(b * _safe_inv(d16.astype(np.float32))[:, None] + 8.5), 0, 15)
    return np.concatenate([_f16_bytes(d16), _pack_nibbles(q)], axis=1)


def quant_q4_1(w):
    """Q4_1 block: f16 d, f16 m, 16 bytes of nibbles; value = q * d + m."""
    b = w.reshape(-1, QK).astype(np.float32)
    mn = b.min(axis=1)
    mx = b.max(axis=1)
    d16 = ((mx - mn) / 15.0).astype(np.float16)
    m16 = mn.astype(np.float16)
    q = np.clip(np.rint((b - m16.astype(np.float32)[:, None]) * _safe_inv(d16.astype(np.float32))[:, None]), 0, 15)
    return np.concatenate([_f16_bytes(d16), _f16_bytes(m16), _pack_nibbles(q)], axis=1)


def _pack_q5(q):
    """q: (nb, 32) values 0..31 -> (nb, 4) qh bytes (bit j: the fifth bit of
    element j, little-endian) and (nb, 16) nibble bytes as for Q4."""
    q = q.astype(np.uint32)
    qh = np.zeros(q.shape[0], dtype=np.uint32)
    for j in range(QK):
        qh |= ((q[:, j] >> 4) & 1) << j
    return qh.astype("<u4").view(np.uint8).reshape(-1, 4), _pack_nibbles(q & 0xF)


def quant_q5_0(w):
    """Q5_0 block: f16 d, 4 bytes qh, 16 bytes of nibbles; value = (q - 16) * d,
    d = (signed value of largest magnitude) / -16."""
    b = w.reshape(-1, QK).astype(np.float32)
    idx = np.argmax(np.abs(b), axis=1)
    mx = b[np.arange(b.shape[0]), idx]
    d16 = (mx / -16.0).astype(np.float16)
    q = np.clip(np.floor(b * _safe_inv(d16.astype(np.float32))[:, None] + 16.5), 0, 31)
    qh, qs = _pack_q5(q)
    return np.concatenate([_f16_bytes(d16), qh, qs], axis=1)


def quant_q5_1(w):
    """Q5_1 block: f16 d, f16 m, 4 bytes qh, 16 bytes of nibbles; value = q * d + m."""
    b = w.reshape(-1, QK).astype(np.float32)
    mn, mx = b.min(axis=1), b.max(axis=1)
    d16 = ((mx - mn) / 31.0).astype(np.float16)
    m16 = mn.astype(np.float16)
    q = np.clip(np.rint((b - m16.astype(np.float32)[:, None]) * _safe_inv(d16.astype(np.float32))[:, None]), 0, 31)
    qh, qs = _pack_q5(q)
    return np.concatenate([_f16_bytes(d16), _f16_bytes(m16), qh, qs], axis=1)


QK_K = 256


def _k_scales(w, nlevels):
    """Shared part of Q4_K / Q5_K: per sub-block of 32, an unsigned range
    [mn, mx] with mn <= 0 <= mx; its step (mx - mn) / nlevels and offset -mn
    quantized to 6 bits against the super-block's f16 d and dmin. Returns
    (blocks (nb, 8, 32), d16, dmin16, sc, m, q)."""
    b = w.reshape(-1, QK_K // QK, QK).astype(np.float32)
    mn = np.minimum(b.min(axis=2), 0)
    mx = np.maximum(b.max(axis=2), 0)
    step = (mx - mn) / nlevels
    off = -mn
    d16 = (step.max(axis=1) / 63).astype(np.float16)
    dmin16 = (off.max(axis=1) / 63).astype(np.float16)
    sc = np.clip(np.rint(step * _safe_inv(d16.astype(np.float32))[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(off * _safe_inv(dmin16.astype(np.float32))[:, None]), 0, 63).astype(np.uint8)
    S = d16.astype(np.float32)[:, None] * sc
    M = dmin16.astype(np.float32)[:, None] * m
    q = np.clip(np.rint((b + M[:, :, None]) * _safe_inv(S)[:, :, None]), 0, nlevels).astype(np.uint8)
    return d16, dmin16, sc, m, q


def _pack_k_scales(sc, m):
    """8 six-bit scales and mins -> ggml's 12 bytes (get_scale_min_k4 inverse)."""
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    for j in range(4):
        out[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        out[:, j + 4] = (m[:, j] & 63) | ((m[:, j + 4] >> 4) << 6)
        out[:, j + 8] = (sc[:, j + 4] & 0xF) | ((m[:, j + 4] & 0xF) << 4)
    return out


def _k_nibbles(q):
    """(nb, 8, 32) values -> (nb, 128) bytes: sub-blocks 2i and 2i+1 are the
    low and high nibbles of bytes 32i .. 32i+31."""
    lo = q[:, 0::2, :] & 0xF
    hi = q[:, 1::2, :] & 0xF
    return (lo | (hi << 4)).reshape(q.shape[0], 128).astype(np.uint8)


def quant_q4_k(w):
    """Q4_K super-block (256): f16 d, f16 dmin, 12 bytes scales/mins, 128 bytes nibbles."""
    d16, dmin16, sc, m, q = _k_scales(w, 15)
    return np.concatenate([_f16_bytes(d16), _f16_bytes(dmin16), _pack_k_scales(sc, m), _k_nibbles(q)], axis=1)


def quant_q5_k(w):
    """Q5_K super-block: as Q4_K with 32 bytes qh (bit j of qh[l]: the fifth
    bit of element l of sub-block j) before the nibbles."""
    d16, dmin16, sc, m, q = _k_scales(w, 31)
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for j in range(8):
        qh |= (((q[:, j, :] >> 4) & 1) << j).astype(np.uint8)
    return np.concatenate([_f16_bytes(d16), _f16_bytes(dmin16), _pack_k_scales(sc, m), qh, _k_nibbles(q)], axis=1)


def quant_q6_k(w):
    """Q6_K super-block: 128 bytes ql, 64 bytes qh, 16 int8 scales (sub-blocks
    of 16), f16 d; value = d * scale * (q - 32)."""
    b = w.reshape(-1, 16, 16).astype(np.float32)
    s = np.abs(b).max(axis=2) / 31
    d16 = (s.max(axis=1) / 127).astype(np.float16)
    sc = np.clip(np.rint(s * _safe_inv(d16.astype(np.float32))[:, None]), 0, 127).astype(np.int8)
    S = d16.astype(np.float32)[:, None] * sc
    q = (np.clip(np.rint(b * _safe_inv(S)[:, :, None]), -32, 31) + 32).astype(np.uint8).reshape(-1, 256)
    nb = q.shape[0]
    ql = np.zeros((nb, 128), dtype=np.uint8)
    qh = np.zeros((nb, 64), dtype=np.uint8)
    for h in range(2):
        e = q[:, 128 * h:128 * h + 128]
        ql[:, 64 * h:64 * h + 32] = (e[:, 0:32] & 0xF) | ((e[:, 64:96] & 0xF) << 4)
        ql[:, 64 * h + 32:64 * h + 64] = (e[:, 32:64] & 0xF) | ((e[:, 96:128] & 0xF) << 4)
        qh[:, 32 * h:32 * h + 32] = ((e[:, 0:32] >> 4) | ((e[:, 32:64] >> 4) << 2) |
                                     ((e[:, 64:96] >> 4) << 4) | ((e[:, 96:128] >> 4) << 6))
    return np.concatenate([ql, qh, sc.view(np.uint8), _f16_bytes(d16)], axis=1)


KQUANT = {"q4_k": (quant_q4_k, GT.Q4_K), "q5_k": (quant_q5_k, GT.Q5_K), "q6_k": (quant_q6_k, GT.Q6_K)}


def to_bf16_bytes(w):
    """float32 -> bfloat16 with round-to-nearest-even, as raw bytes."""
    u = w.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype("<u2").view(np.uint8)


def encode(w, wtype):
    """2-D float32 (rows, cols) -> (array, raw_dtype) for GGUFWriter.add_tensor."""
    rows, cols = w.shape
    if wtype == "f32":
        return w.astype(np.float32), None
    if wtype == "f16":
        return w.astype(np.float16), None
    if wtype == "bf16":
        return to_bf16_bytes(w).reshape(rows, cols * 2), GT.BF16
    if wtype in KQUANT:
        assert cols % QK_K == 0, "K-quant rows must be a multiple of 256 long"
        fn, raw = KQUANT[wtype]
        q = fn(w)
        # the packing is checked against gguf-py's own decoder
        back = gguf.quants.dequantize(q.reshape(-1), raw).reshape(rows, cols)
        err = np.abs(back - w).max()
        assert err <= 0.2 * np.abs(w).max() + 1e-6, "%s packing error %g" % (wtype, err)
        return q.reshape(rows, -1), raw
    assert cols % QK == 0, "quantized rows must be a multiple of 32 long"
    q = {"q8_0": quant_q8_0, "q4_0": quant_q4_0, "q4_1": quant_q4_1, "q5_0": quant_q5_0,
         "q5_1": quant_q5_1}[wtype](w)
    raw = {"q8_0": GT.Q8_0, "q4_0": GT.Q4_0, "q4_1": GT.Q4_1, "q5_0": GT.Q5_0, "q5_1": GT.Q5_1}[wtype]
    return q.reshape(rows, -1), raw


# --------------------------------------------------------------------------
# tokenizer: GPT-2 byte-level BPE, 256 byte tokens + merges + ChatML specials


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


MERGES = [
    "Ġ t", "Ġ a", "h e", "i n", "r e", "o n", "Ġt he", "e r", "Ġ s", "a t", "e n", "o r",
    "Ġ w", "Ġ o", "i s", "Ġ c", "n d", "e s", "a n", "Ġ b", "Ġ f", "Ġ p", "o u", "i t",
    "Ġ m", "a l", "Ġ d", "e d", "Ġa nd", "in g", "Ġ h", "Ġo f", "Ġ i", "l e", "Ġt o",
    "Ġ l", "a r", "i c", "Ġ n", "Ġ y", "Ġy ou", "Ġ is", "o m", "Ġ (", "Ġ =", "Ċ Ġ",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                 "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def build_vocab(n_vocab):
    b2u = bytes_to_unicode()
    tokens = list(SPECIALS) + [b2u[b] for b in range(256)]
    types = [3] * len(SPECIALS) + [1] * 256     # 3 = control, 1 = normal
    have = set(tokens)
    merges = []
    for m in MERGES:
        if len(tokens) >= n_vocab:
            break
        a, b = m.split(" ")
        assert a in have and b in have, m
        merges.append(m)
        tokens.append(a + b)
        have.add(a + b)
        types.append(1)
    if len(tokens) != n_vocab:
        raise ValueError("n_vocab %d needs more merges than the list holds" % n_vocab)
    return tokens, types, merges


# --------------------------------------------------------------------------


def build(name, cfg, path):
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
    rng = np.random.default_rng(seed)
    L, E, H, HKV, F, V = (cfg[k] for k in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "n_vocab"))
    D = cfg.get("head_dim", E // H)
    arch = cfg.get("arch", "llama")
    wtype, etype = cfg["wtype"], cfg["etype"]
    otype = cfg.get("otype")
    over = cfg.get("types", {})

    def ty(short):
        return over.get(short, wtype)

    def mat(n_out, n_in, scale=1.0):
        return (rng.standard_normal((n_out, n_in)) * (scale / np.sqrt(n_in))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(path, arch)
    w.add_name("kvd-tiny-" + name)
    w.add_block_count(L)
    w.add_context_length(512)
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_rope_freq_base(cfg.get("rope_base", 10000.0))
    w.add_layer_norm_rms_eps(cfg.get("eps", 1e-5))
    w.add_rope_dimension_count(D)
    if D != E // H:
        w.add_key_length(D)
        w.add_value_length(D)
    if cfg.get("window"):
        w.add_sliding_window(cfg["window"])
    if cfg.get("rope_linear"):
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(cfg["rope_linear"])
    w.add_vocab_size(V)
    w.add_file_type(FILE_TYPE[wtype])
    tokens, types, merges = build_vocab(V)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def put(tname, arr, ttype):
        data, raw = encode(arr, ttype)
        w.add_tensor(tname, data, raw_dtype=raw)

    # Scales: embedding rows are small (std EMB_STD) next to what the blocks add
    # (attention and FFN outputs scaled by BLOCK_GAIN), so a tied model does not
    # just echo its last input token; the final norm's gain (OUT_GAIN) gives
    # logits a std of a few units, keeping greedy top-2 gaps far above rounding.
    put("token_embd.weight", (EMB_STD * rng.standard_normal((V, E))).astype(np.float32), etype)
    if cfg.get("rope_freqs"):
        # Llama 3.x style divisors: 1 for high frequencies rising to 8 for low ones
        w.add_tensor("rope_freqs.weight", np.geomspace(1.0, 8.0, D // 2).astype(np.float32))
    for i in range(L):
        p = "blk.%d." % i
        w.add_tensor(p + "attn_norm.weight", norm(E))
        put(p + "attn_q.weight", mat(H * D, E), ty("attn_q"))
        put(p + "attn_k.weight", mat(HKV * D, E), ty("attn_k"))
        put(p + "attn_v.weight", mat(HKV * D, E), ty("attn_v"))
        if arch == "qwen2":
            for t, n in (("attn_q", H * D), ("attn_k", HKV * D), ("attn_v", HKV * D)):
                w.add_tensor(p + t + ".bias", (0.5 * rng.standard_normal(n)).astype(np.float32))
        if arch in ("qwen3", "gemma3"):
            w.add_tensor(p + "attn_q_norm.weight", norm(D))
            w.add_tensor(p + "attn_k_norm.weight", norm(D))
        put(p + "attn_output.weight", mat(E, H * D, BLOCK_GAIN), ty("attn_output"))
        if arch == "gemma3":
            w.add_tensor(p + "post_attention_norm.weight", norm(E))
        w.add_tensor(p + "ffn_norm.weight", norm(E))
        put(p + "ffn_gate.weight", mat(F, E), ty("ffn_gate"))
        put(p + "ffn_up.weight", mat(F, E), ty("ffn_up"))
        put(p + "ffn_down.weight", mat(E, F, BLOCK_GAIN), ty("ffn_down"))
        if arch == "gemma3":
            w.add_tensor(p + "post_ffw_norm.weight", norm(E))
    w.add_tensor("output_norm.weight", (OUT_GAIN if not otype else 1.0) * norm(E))
    if otype:
        put("output.weight", mat(V, E, scale=4.0), otype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def generate(outdir, names=None):
    """Write every variant (or `names`) into outdir as tiny-<name>.gguf;
    return {name: path}. Unchanged files are left untouched."""
    os.makedirs(outdir, exist_ok=True)
    out = {}
    for name in names or VARIANTS:
        path = os.path.join(outdir, "tiny-%s.gguf" % name)
        fd, tmp = tempfile.mkstemp(dir=outdir, suffix=".tmp")
        os.close(fd)
        try:
            build(name, ALL_VARIANTS[name], tmp)
            new = open(tmp, "rb").read()
            if os.path.exists(path) and open(path, "rb").read() == new:
                os.unlink(tmp)
            else:
                os.chmod(tmp, 0o644)
                os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        out[name] = path
    return out


def main():
    ap = argparse.ArgumentParser(description="write tiny random-weight GGUF models")
    ap.add_argument("outdir")
    ap.add_argument("--only", help="comma-separated variant names")
    ap.add_argument("--arch", action="store_true", help="also the other architectures (ARCH_VARIANTS)")
    ap.add_argument("--list", action="store_true", help="list variants and exit")
    a = ap.parse_args()
    if a.list:
        for n, c in ALL_VARIANTS.items():
            print(n, c)
        return 0
    names = a.only.split(",") if a.only else (list(ALL_VARIANTS) if a.arch else None)
    for n, p in generate(a.outdir, names).items():
        c = ALL_VARIANTS[n]
        print("%-12s %s  (%d layers, n_embd %d, heads %d/%d, n_ff %d, vocab %d, %s)" % (
            n, p, c["n_layer"], c["n_embd"], c["n_head"], c["n_head_kv"], c["n_ff"],
            c["n_vocab"], c["wtype"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
