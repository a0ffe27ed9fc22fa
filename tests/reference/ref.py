"""Reference forward pass in NumPy, the oracle kvd's engine is checked against.

Written from the model definitions and from the GGUF file format, so that it
shares nothing with kvd's C code but the file it reads. Architectures:

* llama: token embedding, per layer RMSNorm -> attention with rotary
  position embedding ("normal" pairs 2i, 2i+1) and grouped-query heads ->
  residual -> RMSNorm -> SwiGLU feed-forward -> residual, then a final
  RMSNorm and the output projection. Llama 3.x: the `rope_freqs` tensor
  divides each pair's frequency; `rope.scaling.type` linear divides
  positions by `rope.scaling.factor`. Mistral: `attention.sliding_window`
  limits every layer's attention to the last W positions.
* qwen2: llama plus Q/K/V biases, NEOX RoPE (pairs i, i + d/2).
* qwen3: llama plus a per-head RMSNorm of Q and of K (weights of head_dim)
  before RoPE, NEOX RoPE, head size from `attention.key_length`.
* gemma3: embeddings times sqrt(n_embd); Q/K norms; the attention output and
  the FFN output each pass through their own RMSNorm (post_attention_norm,
  post_ffw_norm) before the residual add; GeGLU with the tanh GELU; scores
  scaled by 1/sqrt(query_pre_attn_scalar, default head_dim); NEOX RoPE;
  layer i is global when (i + 1) % 6 == 0 (`attention.sliding_window_pattern`
  overrides 6) with RoPE base `rope.freq_base` (and the linear scaling), the
  others local: window `attention.sliding_window`, base 10000
  (`rope.freq_base_swa` overrides). The norm weights are used as stored: the
  converter has already added Gemma's +1.

What it does, step by step:

* reads the GGUF with the `gguf` package (metadata and raw tensor bytes only)
  and dequantizes every weight itself from the ggml block formats
  (F32, F16, BF16, Q8_0, Q4_0, Q4_1), once, caching float matrices;
* runs the forward pass for any number of new tokens against a KV cache that
  holds every earlier position (prefill and decode are the same code path);
* precision: `dtype=np.float64` (default, used for the tiny models) or
  `np.float32` (used for the 135M model to halve memory and time). Norms and
  the softmax are always evaluated in float64.

Two options emulate the numeric format choices of the engine under test, so
that the remaining differences are only rounding of sums:

* `kv_f16=True`: K and V are rounded to IEEE float16 when stored in the cache
  (kvd keeps its KV pages in f16); every position, including the current
  one, attends to the rounded values. `kv_f16` may also name one of kvd's
  KV element types ([kv] cache_type): "f16" (the same as True), "f32" (K/V
  rounded to float32), "bf16" (rounded to bfloat16, nearest even),
  "bf16-products" (stored as bf16, and attention computed as kvd's AVX-512
  BF16 path does: each query rounded to bfloat16 before its dot products,
  each weight exp(s - max) rounded to bfloat16 before it multiplies V and
  before the sum that normalizes them), "q8_0" or "q4_0": each token's K and V rows
  (n_head_kv * head_dim elements) are quantized per block of 32 as
  kernels/backend.h defines it (GGML's q8_0 and q4_0: float32 arithmetic,
  the scale stored as float16), and attended in their dequantized form;
  the query rows that score them are quantized as kvd's integer products
  do (head sizes up to 256, kernels/cpu/kvquant.h): per block of 32,
  d = float32(max|q| / 127), q' = round-half-away(q * float32(1/d)) clipped
  to [-127, 127], the dot taken with q' * d (d kept in float32).
* `act_q8=True`: the input vector of every matmul whose weight is quantized
  (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants) is quantized per block of 32
  elements, as integer dot-product kernels do: d = float32(max|x| / 127),
  q = rint(x * float32(1/d)) clipped to [-127, 127], and the matmul sees
  x' = q * d (d kept in float32). Where a K-quant reads the vector (any of
  the matrices that share it: Q, K and V; gate and up), d is that of the
  whole super-block of 256 (llama.cpp's Q8_K granularity, kvd's
  quantize_q8k), for every matrix that reads it.

Usage as a library:

    m = Model("models/SmolLM2-135M-Instruct.Q4_1.gguf", dtype=np.float32)
    cache = m.new_cache(kv_f16=True)
    logits = m.forward([1, 2, 3], cache, act_q8=True)       # (3, n_vocab)
    toks, rows = m.greedy([1, 2, 3], n_predict=8, act_q8=True, kv_f16=True)
    rows = m.teacher_forced(prompt, generated, act_q8=True, kv_f16=True)

As a script (prints the greedy continuation and timing):

    ref.py MODEL.gguf --tokens 1,2,3 [--n-predict N] [--f32] [--no-act-q8] [--no-kv-f16]
"""

import argparse
import sys
import time

import numpy as np
import gguf

QK = 32  # elements per block in every quantized format handled here

# ggml type id -> name, from the GGUF spec (ggml.h enum ggml_type).
T_F32, T_F16, T_Q4_0, T_Q4_1, T_Q8_0, T_BF16 = 0, 1, 2, 3, 8, 30
T_Q5_0, T_Q5_1 = 6, 7
T_Q4_K, T_Q5_K, T_Q6_K = 12, 13, 14
KQUANTS = (T_Q4_K, T_Q5_K, T_Q6_K)
QUANTIZED = (T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0) + KQUANTS
QK_K = 256
# bytes per super-block of QK_K elements
KBLOCK_BYTES = {T_Q4_K: 144, T_Q5_K: 176, T_Q6_K: 210}
# bytes per block of QK elements
BLOCK_BYTES = {T_Q4_0: 2 + QK // 2, T_Q4_1: 2 + 2 + QK // 2, T_Q8_0: 2 + QK,
               T_Q5_0: 2 + 4 + QK // 2, T_Q5_1: 2 + 2 + 4 + QK // 2}


def _f16_field(blocks, offset):
    """Column of little-endian float16 values at byte `offset` of each block, as float32."""
    return np.ascontiguousarray(blocks[:, offset:offset + 2]).view("<f2").astype(np.float32)


def _nibbles(qs):
    """Unpack 16 bytes per block into 32 4-bit values: low nibbles are elements
    0..15, high nibbles elements 16..31."""
    lo = qs & 0x0F
    hi = qs >> 4
    return np.concatenate([lo, hi], axis=1).astype(np.float32)


def _k_scale_min(sc12):
    """(nb, 12) packed bytes -> two (nb, 8) arrays: the 6-bit scale and min
    of each sub-block of 32. Sub-blocks 0-3 take the low 6 bits of bytes
    0-3 (scales) and 4-7 (mins); sub-blocks 4-7 take a nibble of bytes 8-11
    (low: scale, high: min) as their low 4 bits and the top 2 bits of bytes
    0-3 (scale) and 4-7 (min) as their high 2 bits."""
    b = sc12.astype(np.uint32)
    lo_sc, lo_m = b[:, 0:4] & 63, b[:, 4:8] & 63
    hi_sc = (b[:, 8:12] & 0xF) | ((b[:, 0:4] >> 6) << 4)
    hi_m = (b[:, 8:12] >> 4) | ((b[:, 4:8] >> 6) << 4)
    return (np.concatenate([lo_sc, hi_sc], axis=1).astype(np.float32),
            np.concatenate([lo_m, hi_m], axis=1).astype(np.float32))


def _dequantize_k(blocks, ggml_type):
    """K-quant super-blocks (nb, bytes) -> (nb, 256) float32.
      Q4_K: f16 d, f16 dmin, 12 bytes scales/mins, 128 bytes: byte 32i+l
            holds element l of sub-block 2i (low nibble) and of 2i+1 (high);
            value = d*sc*q - dmin*m.
      Q5_K: as Q4_K with 32 bytes qh after the scales: bit j of qh[l] is
            bit 4 of element l of sub-block j.
      Q6_K: ql[128], qh[64], int8 scales[16] (sub-blocks of 16), f16 d; in
            each half of 128 elements (ql 64 bytes, qh 32 bytes), element l,
            l+32, l+64, l+96 (l < 32) take the low nibble of ql[l], of
            ql[l+32], the high nibble of ql[l], of ql[l+32], and bits 0-1,
            2-3, 4-5, 6-7 of qh[l]; value = d*sc*(q - 32)."""
    nb = blocks.shape[0]
    if ggml_type == T_Q6_K:
        d = _f16_field(blocks, 208)
        sc = blocks[:, 192:208].view(np.int8).astype(np.float32)
        q = np.zeros((nb, QK_K), dtype=np.int32)
        for h in range(2):
            ql = blocks[:, 64 * h:64 * h + 64].astype(np.int32)
            qh = blocks[:, 128 + 32 * h:128 + 32 * h + 32].astype(np.int32)
            base = 128 * h
            q[:, base + 0:base + 32] = (ql[:, :32] & 0xF) | ((qh & 3) << 4)
            q[:, base + 32:base + 64] = (ql[:, 32:] & 0xF) | (((qh >> 2) & 3) << 4)
            q[:, base + 64:base + 96] = (ql[:, :32] >> 4) | (((qh >> 4) & 3) << 4)
            q[:, base + 96:base + 128] = (ql[:, 32:] >> 4) | (((qh >> 6) & 3) << 4)
        scale = (d * sc).reshape(nb, 16, 1)
        return (scale * (q - 32).astype(np.float32).reshape(nb, 16, 16)).reshape(nb, QK_K)
    d, dmin = _f16_field(blocks, 0), _f16_field(blocks, 2)
    sc, m = _k_scale_min(blocks[:, 4:16])
    qs = blocks[:, 48:176] if ggml_type == T_Q5_K else blocks[:, 16:144]
    nib = qs.reshape(nb, 4, 32).astype(np.int32)
    q = np.stack([nib & 0xF, nib >> 4], axis=2).reshape(nb, 8, 32)
    if ggml_type == T_Q5_K:
        qh = blocks[:, 16:48].astype(np.int32)
        q = q + np.stack([((qh >> j) & 1) << 4 for j in range(8)], axis=1)
    scale = (d * sc).reshape(nb, 8, 1)
    mins = (dmin * m).reshape(nb, 8, 1)
    return (scale * q.astype(np.float32) - mins).reshape(nb, QK_K)


def dequantize(raw, ggml_type, n_elements):
    """Dequantize the raw little-endian bytes of a tensor to a flat float32 array.

    Block formats (ggml-common.h layout, QK = 32 elements per block):
      Q4_0: f16 d, 16 bytes of nibbles;          value = (q - 8) * d
      Q4_1: f16 d, f16 m, 16 bytes of nibbles;   value = q * d + m
      Q8_0: f16 d, 32 int8;                      value = q * d
    Products are formed in float32, as a float32 dequantizer would."""
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if ggml_type == T_F32:
        out = raw.view("<f4")
    elif ggml_type == T_F16:
        out = raw.view("<f2").astype(np.float32)
    elif ggml_type == T_BF16:
        # bfloat16 is the top half of a float32
        out = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    elif ggml_type in KQUANTS:
        if n_elements % QK_K:
            raise ValueError("K-quant tensor size %d is not a multiple of %d" % (n_elements, QK_K))
        nb = n_elements // QK_K
        blocks = raw[: nb * KBLOCK_BYTES[ggml_type]].reshape(nb, KBLOCK_BYTES[ggml_type])
        out = _dequantize_k(blocks, ggml_type).reshape(-1)
    elif ggml_type in QUANTIZED:
        if n_elements % QK:
            raise ValueError("quantized tensor size %d is not a multiple of %d" % (n_elements, QK))
        nb = n_elements // QK
        blocks = raw[: nb * BLOCK_BYTES[ggml_type]].reshape(nb, BLOCK_BYTES[ggml_type])
        d = _f16_field(blocks, 0)
        if ggml_type == T_Q4_0:
            q = _nibbles(blocks[:, 2:])
            out = (q - np.float32(8)) * d
        elif ggml_type == T_Q4_1:
            m = _f16_field(blocks, 2)
            q = _nibbles(blocks[:, 4:])
            out = q * d + m
        elif ggml_type in (T_Q5_0, T_Q5_1):
            # Q5_0: f16 d, u32 qh, 16 bytes of nibbles; Q5_1: f16 d, f16 m, then
            # the same. Element j's fifth bit is bit j of qh (little-endian).
            o = 2 if ggml_type == T_Q5_0 else 4
            qh = np.ascontiguousarray(blocks[:, o:o + 4]).view("<u4").astype(np.uint32)
            bits = ((qh >> np.arange(QK, dtype=np.uint32)[None, :]) & 1).astype(np.float32)
            q = _nibbles(blocks[:, o + 4:]) + np.float32(16) * bits
            if ggml_type == T_Q5_0:
                out = (q - np.float32(16)) * d
            else:
                out = q * d + _f16_field(blocks, 2)
        else:
            q = blocks[:, 2:].view(np.int8).astype(np.float32)
            out = q * d
        out = out.reshape(-1)
    else:
        raise ValueError("unsupported ggml type %d" % ggml_type)
    if out.size != n_elements:
        raise ValueError("tensor holds %d elements, expected %d" % (out.size, n_elements))
    return out.astype(np.float32, copy=False)


def quantize_act_q8(x, span=QK):
    """Emulate per-block int8 quantization of matmul inputs (last axis, one
    scale per span of 32, or of 256 for the K-quants' inputs):
    d = float32(max|x| / 127), q = rint(x * float32(1 / d)) (ties to even) in
    [-127, 127], result q * d. Multiplying by the float32 reciprocal rather
    than dividing is how kvd's kernels (like llama.cpp's) form q; the two can
    differ in the last bit, which matters only at a rounding boundary."""
    shp = x.shape
    if shp[-1] % span:
        span = QK
    xb = x.astype(np.float32).reshape(-1, shp[-1] // span, span)
    amax = np.max(np.abs(xb), axis=-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.float32(1) / np.where(d == 0, np.float32(1), d)
    inv = np.where(d == 0, np.float32(0), inv).astype(np.float32)
    q = np.clip(np.rint(xb * inv), -127, 127)
    return (q * d).astype(x.dtype).reshape(shp)


def _meta(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


class Weight:
    """One matrix: dequantized rows (n_out, n_in) plus the stored type, which
    decides whether its inputs are int8-quantized under act_q8."""

    def __init__(self, mat, ggml_type):
        self.mat = mat
        self.ggml_type = ggml_type

    def __call__(self, x, act_q8, group=()):
        """group: the other matrices that read the same input vector."""
        if act_q8 and self.ggml_type in QUANTIZED:
            k = any(w.ggml_type in KQUANTS for w in (self,) + tuple(group))
            x = quantize_act_q8(x, QK_K if k else QK)
        return x @ self.mat.T


def _round_half_away(v):
    return np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))


def bf16_round(x):
    """x rounded to bfloat16 (nearest even) as float32 values; finite x."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7fff + ((b >> 16) & 1)) & 0xffff0000).astype(np.uint32)
    return b.view(np.float32)


def kv_store_round(x, kv_type):
    """The values kvd's KV type `kv_type` stores for rows x (..., n), n a
    multiple of 32 for q8_0/q4_0; computed in float32 as kvd does."""
    if kv_type in ("bf16", "bf16-products"):
        return bf16_round(x).astype(x.dtype)
    if kv_type == "f32":
        return x.astype(np.float32).astype(x.dtype)
    if kv_type == "f16":
        return x.astype(np.float16).astype(x.dtype)
    shape = x.shape
    b = x.astype(np.float32).reshape(-1, 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        if kv_type == "q8_0":
            d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
            idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
            q = np.clip(_round_half_away((b * idv).astype(np.float32)), -127, 127)
        elif kv_type == "q4_0":
            m = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)
            d = m / np.float32(-8)
            idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
            q = np.clip(np.floor((b * idv).astype(np.float32) + np.float32(8.5)), 0, 15) - 8
        else:
            raise ValueError("unknown KV type %r" % kv_type)
    d16 = d.astype(np.float16).astype(np.float32)
    return (d16 * q.astype(np.float32)).reshape(shape).astype(x.dtype)


def kv_query_int8(x):
    """Query rows x (..., n) as kvd's q8_0/q4_0 scores see them: int8 per
    block of 32 with a float32 scale (see kv_f16 above), as floats."""
    shape = x.shape
    b = x.astype(np.float32).reshape(-1, 32)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.clip(_round_half_away((b * idv).astype(np.float32)), -127, 127)
    return (d * q.astype(np.float32)).reshape(shape)


class Cache:
    """Per-layer K and V of every position fed so far: lists of arrays of
    shape (n_pos, n_head_kv, head_dim)."""

    def __init__(self, n_layer, kv_f16):
        self.kv_f16 = kv_f16
        self.k = [None] * n_layer
        self.v = [None] * n_layer
        self.n_pos = 0

    def store(self, layer, k, v):
        if self.kv_f16:
            t = "f16" if self.kv_f16 is True else self.kv_f16
            # rows of n_head_kv * head_dim elements, blocks along them
            k = kv_store_round(k.reshape(k.shape[0], -1), t).reshape(k.shape)
            v = kv_store_round(v.reshape(v.shape[0], -1), t).reshape(v.shape)
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k, v
        else:
            self.k[layer] = np.concatenate([self.k[layer], k])
            self.v[layer] = np.concatenate([self.v[layer], v])
        return self.k[layer], self.v[layer]


class Model:
    def __init__(self, path, dtype=np.float64):
        self.path = path
        self.dtype = dtype
        r = gguf.GGUFReader(path)
        arch = _meta(r, "general.architecture")
        if arch not in ("llama", "qwen2", "qwen3", "gemma3"):
            raise ValueError("%s: architecture %r, expected llama, qwen2, qwen3 or gemma3" % (path, arch))
        self.arch = arch
        a = arch + "."
        self.n_layer = int(_meta(r, a + "block_count"))
        self.n_embd = int(_meta(r, a + "embedding_length"))
        self.n_ff = int(_meta(r, a + "feed_forward_length"))
        self.n_head = int(_meta(r, a + "attention.head_count"))
        self.n_head_kv = int(_meta(r, a + "attention.head_count_kv", self.n_head))
        self.eps = float(_meta(r, a + "attention.layer_norm_rms_epsilon"))
        self.rope_base = float(_meta(r, a + "rope.freq_base", 10000.0))
        self.head_dim = int(_meta(r, a + "attention.key_length", self.n_embd // self.n_head))
        self.n_rot = int(_meta(r, a + "rope.dimension_count", self.head_dim))
        assert self.n_head % self.n_head_kv == 0
        assert self.n_rot % 2 == 0 and self.n_rot <= self.head_dim
        self.neox = arch != "llama"
        gemma = arch == "gemma3"
        self.embd_scale = np.sqrt(self.n_embd) if gemma else 1.0
        qpas = _meta(r, a + "attention.query_pre_attn_scalar")
        self.attn_scale = 1.0 / np.sqrt(float(qpas) if qpas else self.head_dim)
        self.geglu = gemma
        window = int(_meta(r, a + "attention.sliding_window", 0))
        scaling = _meta(r, a + "rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise ValueError("rope scaling %r" % scaling)
        pos_scale = 1.0 / float(_meta(r, a + "rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0
        # per layer: (window or 0, rope base, position scale)
        if gemma:
            pattern = int(_meta(r, a + "attention.sliding_window_pattern", 6))
            base_swa = float(_meta(r, a + "rope.freq_base_swa", 10000.0))
            self.layer_attn = [(0, self.rope_base, pos_scale) if (i + 1) % pattern == 0
                               else (window, base_swa, 1.0) for i in range(self.n_layer)]
        else:
            self.layer_attn = [(window, self.rope_base, pos_scale)] * self.n_layer

        tensors = {t.name: t for t in r.tensors}
        self.types = {}

        def load(name):
            t = tensors[name]
            ttype = int(t.tensor_type)
            shape = [int(s) for s in t.shape]  # GGUF order: ne0 (row length) first
            n = int(np.prod(shape))
            flat = dequantize(t.data, ttype, n)
            self.types[name] = gguf.GGMLQuantizationType(ttype).name
            rows = shape[1] if len(shape) > 1 else 1
            return flat.reshape(rows, shape[0]) if len(shape) > 1 else flat, ttype

        def mat(name):
            m, ttype = load(name)
            return Weight(m.astype(dtype, copy=False), ttype)

        def vec(name):
            v, _ = load(name)
            return v.astype(np.float64)

        def opt_vec(name):
            return vec(name) if name in tensors else None

        emb, emb_type = load("token_embd.weight")
        self.n_vocab = emb.shape[0]
        self.tok_embd = emb.astype(dtype, copy=False)
        self.layers = []
        for i in range(self.n_layer):
            p = "blk.%d." % i
            self.layers.append(dict(
                attn_norm=vec(p + "attn_norm.weight"),
                wq=mat(p + "attn_q.weight"), wk=mat(p + "attn_k.weight"),
                wv=mat(p + "attn_v.weight"), wo=mat(p + "attn_output.weight"),
                ffn_norm=vec(p + "ffn_norm.weight"),
                gate=mat(p + "ffn_gate.weight"), up=mat(p + "ffn_up.weight"),
                down=mat(p + "ffn_down.weight"),
                bq=opt_vec(p + "attn_q.bias"), bk=opt_vec(p + "attn_k.bias"),
                bv=opt_vec(p + "attn_v.bias"),
                q_norm=opt_vec(p + "attn_q_norm.weight"), k_norm=opt_vec(p + "attn_k_norm.weight"),
                post_attn_norm=opt_vec(p + "post_attention_norm.weight"),
                post_ffn_norm=opt_vec(p + "post_ffw_norm.weight"),
            ))
        self.out_norm = vec("output_norm.weight")
        if "output.weight" in tensors:
            self.output = mat("output.weight")
            self.tied = False
        else:
            self.output = Weight(self.tok_embd, emb_type)
            self.tied = True
        assert self.layers[0]["wq"].mat.shape == (self.n_head * self.head_dim, self.n_embd)
        assert self.layers[0]["wk"].mat.shape == (self.n_head_kv * self.head_dim, self.n_embd)

        # RoPE: pair i (i < n_rot / 2) rotates by pos * scale * base^(-2i / n_rot)
        # / freq_factor[i]; the pair is (2i, 2i+1) in "normal" style, (i, i + n_rot/2)
        # in NEOX style.
        self.freq_factors = vec("rope_freqs.weight") if "rope_freqs.weight" in tensors else None
        self.inv_freq = self._inv_freq(self.rope_base)

    def _inv_freq(self, base):
        f = base ** (-np.arange(0, self.n_rot, 2, dtype=np.float64) / self.n_rot)
        if self.freq_factors is not None:
            f = f / self.freq_factors
        return f

    # ------------------------------------------------------------------
    def describe(self):
        return ("%d layers, n_embd %d, %d heads / %d kv heads, head_dim %d, n_ff %d, vocab %d, "
                "%s output, rope base %g, eps %g, %s" % (
                    self.n_layer, self.n_embd, self.n_head, self.n_head_kv, self.head_dim,
                    self.n_ff, self.n_vocab, "tied" if self.tied else "separate",
                    self.rope_base, self.eps, self.arch))

    def new_cache(self, kv_f16=True):
        return Cache(self.n_layer, kv_f16)

    def _rmsnorm(self, x, w):
        """RMSNorm over the last axis (also per head, for Q/K norms)."""
        x64 = x.astype(np.float64)
        ms = np.mean(x64 * x64, axis=-1, keepdims=True)
        return (x64 / np.sqrt(ms + self.eps) * w).astype(self.dtype)

    def _rope(self, x, pos, base=None, pos_scale=1.0):
        """x: (T, heads, head_dim); rotate the pairs of the first n_rot dims."""
        inv_freq = self.inv_freq if base is None or base == self.rope_base else self._inv_freq(base)
        ang = (pos[:, None].astype(np.float64) * pos_scale) * inv_freq[None, :]   # (T, n_rot/2)
        cos = np.cos(ang)[:, None, :]
        sin = np.sin(ang)[:, None, :]
        x64 = x.astype(np.float64)
        if self.neox:
            i0, i1 = slice(0, self.n_rot // 2), slice(self.n_rot // 2, self.n_rot)
        else:
            i0, i1 = slice(0, self.n_rot, 2), slice(1, self.n_rot, 2)
        x0, x1 = x64[..., i0], x64[..., i1]
        out = x64.copy()
        out[..., i0] = x0 * cos - x1 * sin
        out[..., i1] = x0 * sin + x1 * cos
        return out.astype(self.dtype)

    def forward(self, tokens, cache, act_q8=True, want=None):
        """Feed `tokens` (new positions cache.n_pos ...), append their K/V to
        `cache`, and return logits (float64) for the positions selected by
        `want` (indices into `tokens`; default all)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        if T == 0:
            return np.zeros((0, self.n_vocab))
        if tokens.min() < 0 or tokens.max() >= self.n_vocab:
            raise ValueError("token id out of range")
        p0 = cache.n_pos
        pos = np.arange(p0, p0 + T)
        H, HKV, D = self.n_head, self.n_head_kv, self.head_dim
        group = H // HKV
        scale = self.attn_scale
        # causal mask over all cached positions: query t (absolute p0+t) sees keys <= p0+t
        kpos = np.arange(p0 + T)
        causal = kpos[None, :] > pos[:, None]                   # (T, p0+T)

        x = self.tok_embd[tokens].astype(np.float64) * self.embd_scale
        x = x.astype(self.dtype)
        for li, L in enumerate(self.layers):
            window, base, pos_scale = self.layer_attn[li]
            mask = causal
            if window:  # and keys at or before p - window are out of the window
                mask = causal | (kpos[None, :] <= pos[:, None] - window)
            h = self._rmsnorm(x, L["attn_norm"])
            qkv = (L["wq"], L["wk"], L["wv"])
            q, k, v = (w(h, act_q8, qkv) for w in qkv)
            if L["bq"] is not None:
                q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
            q = q.reshape(T, H, D).astype(self.dtype)
            k = k.reshape(T, HKV, D).astype(self.dtype)
            v = v.reshape(T, HKV, D).astype(self.dtype)
            if L["q_norm"] is not None:
                q = self._rmsnorm(q, L["q_norm"])
                k = self._rmsnorm(k, L["k_norm"])
            q = self._rope(q, pos, base, pos_scale)
            k = self._rope(k, pos, base, pos_scale)
            K, V = cache.store(li, k, v)                         # (p0+T, HKV, D)
            att = np.empty((T, H, D), dtype=self.dtype)
            bfp = cache.kv_f16 == "bf16-products"
            for kh in range(HKV):
                qh = q[:, kh * group:(kh + 1) * group, :].astype(np.float64)   # (T, g, D)
                if bfp:
                    qh = bf16_round(qh).astype(np.float64)
                elif cache.kv_f16 in ("q8_0", "q4_0") and D <= 256:
                    qh = kv_query_int8(qh.astype(np.float32)).astype(np.float64)
                Kh = K[:, kh, :].astype(np.float64)                            # (S, D)
                Vh = V[:, kh, :].astype(np.float64)
                s = np.einsum("tgd,sd->tgs", qh, Kh) * scale                   # (T, g, S)
                s = np.where(mask[:, None, :], -np.inf, s)
                s = s - s.max(axis=-1, keepdims=True)
                p = np.exp(s)
                if bfp:
                    p = bf16_round(p).astype(np.float64)
                p /= p.sum(axis=-1, keepdims=True)
                att[:, kh * group:(kh + 1) * group, :] = np.einsum("tgs,sd->tgd", p, Vh)
            o = L["wo"](att.reshape(T, H * D), act_q8)
            if L["post_attn_norm"] is not None:
                o = self._rmsnorm(o, L["post_attn_norm"])
            x = x + o
            h = self._rmsnorm(x, L["ffn_norm"])
            gu = (L["gate"], L["up"])
            g = L["gate"](h, act_q8, gu).astype(np.float64)
            u = L["up"](h, act_q8, gu).astype(np.float64)
            if self.geglu:  # gelu_tanh(gate) * up
                act = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))
            else:           # silu(gate) * up
                act = g / (1.0 + np.exp(-g))
            a = (act * u).astype(self.dtype)
            f = L["down"](a, act_q8)
            if L["post_ffn_norm"] is not None:
                f = self._rmsnorm(f, L["post_ffn_norm"])
            x = x + f
        cache.n_pos += T
        if want is not None:
            x = x[np.asarray(want)]
        h = self._rmsnorm(x, self.out_norm)
        return self.output(h, act_q8).astype(np.float64)

    def greedy(self, prompt, n_predict, act_q8=True, kv_f16=True):
        """Greedy decode: returns (generated tokens, logits rows) where row 0 is
        the last prompt position and row i the step after generated[i-1]."""
        cache = self.new_cache(kv_f16)
        rows = [self.forward(prompt, cache, act_q8, want=[len(prompt) - 1])[0]]
        gen = []
        for i in range(n_predict):
            gen.append(int(np.argmax(rows[-1])))
            if i + 1 < n_predict:
                rows.append(self.forward([gen[-1]], cache, act_q8)[0])
        return gen, np.array(rows)

    def teacher_forced(self, prompt, generated, act_q8=True, kv_f16=True):
        """Logits rows for a given continuation, fed in one pass: row 0 at the
        last prompt position, row i after generated[i-1]; len(generated) rows."""
        n = len(generated)
        seq = list(prompt) + list(generated[:max(n - 1, 0)])
        cache = self.new_cache(kv_f16)
        want = list(range(len(prompt) - 1, len(seq)))
        return self.forward(seq, cache, act_q8, want=want)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated prompt token ids")
    ap.add_argument("--n-predict", type=int, default=16)
    ap.add_argument("--f32", action="store_true", help="compute in float32 instead of float64")
    ap.add_argument("--no-act-q8", action="store_true")
    ap.add_argument("--no-kv-f16", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    m = Model(args.model, dtype=np.float32 if args.f32 else np.float64)
    t1 = time.time()
    prompt = [int(t) for t in args.tokens.split(",") if t]
    gen, rows = m.greedy(prompt, args.n_predict, act_q8=not args.no_act_q8,
                         kv_f16=not args.no_kv_f16)
    t2 = time.time()
    print("model: %s (%s)" % (args.model, m.describe()))
    print("load+dequantize %.2fs, forward %.2fs" % (t1 - t0, t2 - t1))
    print("generated:", ",".join(map(str, gen)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
