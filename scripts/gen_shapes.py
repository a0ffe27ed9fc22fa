#!/usr/bin/env python3
"""Random-weight GGUF models of deployment shapes, for benchmarks.

    .venv/bin/python scripts/gen_shapes.py [--out DIR] [--only NAMES] [--types f16,q8_0]
                                           [--quantize-with PATH/llama-quantize] [--list]

Each shape has the layer count, widths, head layout, FFN size, RoPE base and
architecture keys of a model people deploy (llama3.2-1b, llama3.2-3b,
qwen2.5-1.5b, gemma3-1b; and llama3.2-1b-attn, the 1B's attention alone
on a narrow residual stream, for KV cache measurements), random weights (normal x 0.02, norms 1, so that
activations stay in a sane range through every layer) and SmolLM2's
tokenizer, copied from models/SmolLM2-135M-Instruct.Q4_1.gguf, so kvd can
tokenize and chat with it. The text such a model writes means nothing; the
time and memory it takes are those of the real model: what bench/ measures.

Files go to DIR (default ~/.cache/kvd/shapes/) as NAME.TYPE.gguf (TYPE F16 or
Q8_0, written with gguf-py; Q4_K_M and Q4_0 only with --quantize-with, which
runs llama-quantize on the F16 file, on KVD_QUANTIZE_THREADS threads, 2). A file whose stamp (NAME.TYPE.gguf.stamp:
this generator's version and the shape) matches is left alone, so a second
run costs nothing. Prints one line per file: its path.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np

import gguf

GEN_VERSION = 1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER_SRC = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_OUT = os.path.join(os.path.expanduser("~"), ".cache", "kvd", "shapes")
CONTEXT = 32768
W_STD = 0.02
QUANTIZE_THREADS = int(os.environ.get("KVD_QUANTIZE_THREADS", "2"))

# n_vocab comes from the tokenizer (49152)
SHAPES = {
    "llama3.2-1b": dict(arch="llama", n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, head_dim=64,
                        n_ff=8192, rope_base=500000.0, eps=1e-5),
    "llama3.2-3b": dict(arch="llama", n_layer=28, n_embd=3072, n_head=24, n_head_kv=8, head_dim=128,
                        n_ff=8192, rope_base=500000.0, eps=1e-5),
    "qwen2.5-1.5b": dict(arch="qwen2", n_layer=28, n_embd=1536, n_head=12, n_head_kv=2, head_dim=128,
                         n_ff=8960, rope_base=1000000.0, eps=1e-6),
    # five local layers (window 512) then one global: the gemma3 row of
    # daemon/model/model.c, as scripts/gen_tiny_models.py writes the keys
    # llama3.2-1b's attention (its 16 layers of 32/8 heads of 64, so its KV
    # cache) with a residual stream and FFN of 256: weights of 40 MB, so that
    # a decode step over a long context is nearly all attention; for
    # measuring what the KV cache's type costs without the weights' reads
    "llama3.2-1b-attn": dict(arch="llama", n_layer=16, n_embd=256, n_head=32, n_head_kv=8, head_dim=64,
                             n_ff=256, rope_base=500000.0, eps=1e-5),
    "gemma3-1b": dict(arch="gemma3", n_layer=26, n_embd=1152, n_head=4, n_head_kv=1, head_dim=256,
                      n_ff=6912, rope_base=1000000.0, eps=1e-6, window=512),
}

QTYPES = {"f16": (gguf.GGMLQuantizationType.F16, 1), "q8_0": (gguf.GGMLQuantizationType.Q8_0, 7)}
FILE_NAMES = {"f16": "F16", "q8_0": "Q8_0", "q4_k_m": "Q4_K_M", "q4_0": "Q4_0"}
# made from the F16 file by llama-quantize (--quantize-with)
QUANTIZED = ("q4_k_m", "q4_0")


def read_tokenizer(path):
    """The tokenizer.* fields of a GGUF file as (key, kind, value) rows."""
    r = gguf.GGUFReader(path)
    rows = []
    for k, f in r.fields.items():
        if not k.startswith("tokenizer."):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = f.types[1]
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(f.parts[i]).decode("utf-8", errors="surrogateescape") for i in f.data]
            else:
                val = [int(f.parts[i][0]) for i in f.data]
            rows.append((k, "array", val, sub))
        elif t == gguf.GGUFValueType.STRING:
            rows.append((k, "str", bytes(f.parts[f.data[0]]).decode("utf-8"), t))
        else:
            rows.append((k, "scalar", f.parts[f.data[0]][0].item(), t))
    return rows


def tensor_plan(cfg, n_vocab):
    """(name, numpy shape (rows, cols) or (n,), kind) of every tensor, in file order.
    kind: "w" a weight matrix, "n" a norm (ones, f32), "b" a bias (f32)."""
    L, E, H, HKV, F, D = (cfg[k] for k in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "head_dim"))
    arch = cfg["arch"]
    plan = [("token_embd.weight", (n_vocab, E), "w")]
    for i in range(L):
        p = "blk.%d." % i
        plan.append((p + "attn_norm.weight", (E,), "n"))
        plan += [(p + "attn_q.weight", (H * D, E), "w"), (p + "attn_k.weight", (HKV * D, E), "w"),
                 (p + "attn_v.weight", (HKV * D, E), "w")]
        if arch == "qwen2":
            plan += [(p + "attn_q.bias", (H * D,), "b"), (p + "attn_k.bias", (HKV * D,), "b"),
                     (p + "attn_v.bias", (HKV * D,), "b")]
        if arch == "gemma3":
            plan += [(p + "attn_q_norm.weight", (D,), "n"), (p + "attn_k_norm.weight", (D,), "n")]
        plan.append((p + "attn_output.weight", (E, H * D), "w"))
        if arch == "gemma3":
            plan.append((p + "post_attention_norm.weight", (E,), "n"))
        plan.append((p + "ffn_norm.weight", (E,), "n"))
        plan += [(p + "ffn_gate.weight", (F, E), "w"), (p + "ffn_up.weight", (F, E), "w"),
                 (p + "ffn_down.weight", (E, F), "w")]
        if arch == "gemma3":
            plan.append((p + "post_ffw_norm.weight", (E,), "n"))
    plan.append(("output_norm.weight", (E,), "n"))
    return plan  # the output projection is tied to the embedding, as in all four models


def tensor_data(name, shape, kind, qtype):
    """The tensor's bytes (weights quantized to qtype), from a generator seeded by its name."""
    if kind == "n":
        return np.ones(shape, dtype=np.float32)
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape, dtype=np.float32)
    x *= W_STD
    if kind == "b":
        return x
    gq, _ = QTYPES[qtype]
    if gq == gguf.GGMLQuantizationType.F16:
        return x.astype(np.float16)
    return gguf.quants.quantize(x, gq)


def write_shape(name, cfg, qtype, path, tok):
    n_vocab = len(next(v for k, kind, v, _ in tok if k == "tokenizer.ggml.tokens"))
    arch = cfg["arch"]
    w = gguf.GGUFWriter(path + ".tmp", arch)
    w.add_name("kvd-shape-" + name)
    w.add_block_count(cfg["n_layer"])
    w.add_context_length(CONTEXT)
    w.add_embedding_length(cfg["n_embd"])
    w.add_feed_forward_length(cfg["n_ff"])
    w.add_head_count(cfg["n_head"])
    w.add_head_count_kv(cfg["n_head_kv"])
    w.add_rope_freq_base(cfg["rope_base"])
    w.add_layer_norm_rms_eps(cfg["eps"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    if cfg.get("window"):
        w.add_sliding_window(cfg["window"])
    w.add_vocab_size(n_vocab)
    w.add_file_type(QTYPES[qtype][1])
    for k, kind, v, sub in tok:
        if kind == "array":
            w.add_array(k, v) if sub == gguf.GGUFValueType.STRING else w.add_key_value(
                k, v, gguf.GGUFValueType.ARRAY, sub_type=sub)
        elif kind == "str":
            w.add_string(k, v)
        else:
            w.add_key_value(k, v, sub)
    plan = tensor_plan(cfg, n_vocab)
    for tname, shape, kind in plan:
        if kind == "w":
            gq, _ = QTYPES[qtype]
            # the byte shape's last axis counts bytes: F16's is twice the row
            bshape = gguf.quants.quant_shape_to_byte_shape(shape, gq)
            nbytes = int(np.prod(bshape))
            if gq == gguf.GGMLQuantizationType.F16:
                w.add_tensor_info(tname, shape, np.dtype(np.float16), nbytes)
            else:
                w.add_tensor_info(tname, bshape, np.dtype(np.uint8), nbytes, raw_dtype=gq)
        else:
            w.add_tensor_info(tname, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for tname, shape, kind in plan:
        w.write_tensor_data(tensor_data(tname, shape, kind, qtype))
    w.close()
    os.replace(path + ".tmp", path)


def stamp_of(name, cfg, qtype):
    return json.dumps({"version": GEN_VERSION, "name": name, "type": qtype, "cfg": cfg, "ctx": CONTEXT,
                       "std": W_STD}, sort_keys=True)


def fresh(path, stamp):
    try:
        with open(path + ".stamp") as f:
            return f.read() == stamp and os.path.exists(path)
    except OSError:
        return False


def ensure(name, qtype, out, tok, quantize_with=None):
    """The path of NAME's file of type qtype, written unless fresh."""
    cfg = SHAPES[name]
    path = os.path.join(out, "%s.%s.gguf" % (name, FILE_NAMES[qtype]))
    stamp = stamp_of(name, cfg, qtype) + (quantize_with or "")
    if fresh(path, stamp):
        return path
    if qtype in QUANTIZED:
        src = ensure(name, "f16", out, tok)
        log = path + ".quantize.log"
        with open(log, "w") as lf:
            p = subprocess.run([quantize_with, src, path + ".tmp", FILE_NAMES[qtype], str(QUANTIZE_THREADS)],
                               stdout=lf, stderr=subprocess.STDOUT)
        if p.returncode != 0:
            sys.exit("gen_shapes: %s %s failed (status %d), see %s" % (quantize_with, FILE_NAMES[qtype],
                                                                      p.returncode, log))
        os.replace(path + ".tmp", path)
    else:
        write_shape(name, cfg, qtype, path, tok)
    with open(path + ".stamp", "w") as f:
        f.write(stamp)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--only", help="comma-separated shape names (default: all)")
    ap.add_argument("--types", default="f16,q8_0",
                    help="comma-separated: f16, q8_0 (q4_k_m, q4_0 with --quantize-with)")
    ap.add_argument("--quantize-with", help="path of llama-quantize, for q4_k_m and q4_0")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        for n, c in SHAPES.items():
            print(n, json.dumps(c))
        return 0
    names = a.only.split(",") if a.only else list(SHAPES)
    types = a.types.split(",")
    if a.quantize_with and not any(t in QUANTIZED for t in types):
        types.append("q4_k_m")
    for n in names:
        if n not in SHAPES:
            sys.exit("gen_shapes: unknown shape '%s' (--list)" % n)
    for t in types:
        if t not in FILE_NAMES or (t in QUANTIZED and not a.quantize_with):
            sys.exit("gen_shapes: type '%s' is not f16 or q8_0 (q4_k_m and q4_0 need --quantize-with)" % t)
    os.makedirs(a.out, exist_ok=True)
    tok = read_tokenizer(TOKENIZER_SRC)
    for n in names:
        for t in types:
            print(ensure(n, t, a.out, tok, a.quantize_with if t in QUANTIZED else None), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
