#!/usr/bin/env python3
"""kvd's engine against llama.cpp on a real model (Gemma 3 270M by default),
with both engines' speed measured in the same run. Not part of `make test`:
it needs a Python with llama-cpp-python (.venv-bench, made by scripts/bench)
and the optional model (scripts/setup --model gemma3-270m).

    kvd_vs_llamacpp.py --llama-python .venv-bench/bin/python [MODEL] [--n-predict 32] [--threads 2]

For each prompt, llama.cpp tokenizes it (special tokens parsed, BOS as the
file says) and decodes greedily with logits for every step; kvd (through
build/tests/kvd_eval) decodes greedily from the same tokens. Compared:
  - the greedy continuations, token by token: where they first differ,
    llama.cpp's top-2 logit gap there (in std of the row) says whether it was
    a near tie;
  - the logit rows of the steps before that point: max and rms |diff| in
    std units of llama.cpp's row;
  - decode and prefill tokens/s of both, same thread count, one after the
    other (llama.cpp timed on a second context without per-position logits,
    fed the same tokens).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Shopping list:\n1. Milk\n2. Eggs\n3.",
    "<start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n",
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "developed a system of movable metal type in Mainz. Before this, books were copied by hand, "
    "which made them rare and expensive.",
]

DUMP = r"""
import json, sys, time, numpy as np
from llama_cpp import Llama
model, n_predict, threads, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
prompts = json.load(open(out + ".prompts"))
llm = Llama(model_path=model, logits_all=True, n_ctx=1024, verbose=False, n_threads=threads,
            n_threads_batch=threads)
res, meta = {}, []
for k, p in enumerate(prompts):
    t = llm.tokenize(p.encode(), add_bos=True, special=True)
    llm.reset()
    t0 = time.time()
    llm.eval(t)
    t1 = time.time()
    rows = [np.array(llm.scores[len(t) - 1])]
    gen = []
    for i in range(n_predict):
        gen.append(int(np.argmax(rows[-1])))
        if i + 1 < n_predict:
            llm.eval([gen[-1]])
            rows.append(np.array(llm.scores[len(t) + i]))
    t2 = time.time()
    res["rows%d" % k] = np.array(rows, dtype=np.float32)
    meta.append(dict(tokens=t, generated=gen, prefill_s=t1 - t0, decode_s=t2 - t1))
# speed without logits for every position (what a server does): the same
# tokens fed again to a second context, timed
fast = Llama(model_path=model, n_ctx=1024, verbose=False, n_threads=threads, n_threads_batch=threads)
for d in meta:
    fast.reset()
    t0 = time.time()
    fast.eval(d["tokens"])
    t1 = time.time()
    for tok in d["generated"][:-1]:
        fast.eval([tok])
    t2 = time.time()
    d["prefill_s"], d["decode_s"] = t1 - t0, t2 - t1
np.savez(out, **res)
json.dump(meta, open(out + ".json", "w"))
"""


def main():
    ap = argparse.ArgumentParser(description="kvd vs llama.cpp on a real model")
    ap.add_argument("model", nargs="?", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--eval", default=os.path.join(ROOT, os.environ.get("KVD_BUILD", "build"), "tests", "kvd_eval"))
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if not os.path.exists(a.model):
        print("skipped: %s is missing (scripts/setup --model gemma3-270m)" % a.model)
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ll.npz")
        json.dump(PROMPTS, open(out + ".prompts", "w"))
        subprocess.run([a.llama_python, "-c", DUMP, a.model, str(a.n_predict), str(a.threads), out], check=True)
        data = dict(np.load(out))
        meta = json.load(open(out + ".json"))
        worst_max, worst_rms, kvd_dec, kvd_pre, ll_dec, ll_pre = 0.0, 0.0, [], [], [], []
        n_same = n_tok = 0
        for k, d in enumerate(meta):
            t, g = d["tokens"], d["generated"]
            lf = os.path.join(tmp, "kvd.%d" % k)
            p = subprocess.run([a.eval, "--model", a.model, "--tokens", ",".join(map(str, t)), "--n-predict",
                                str(a.n_predict), "--threads", str(a.threads), "--logits-out", lf, "--timing"],
                               capture_output=True, text=True, check=True)
            r = json.loads(p.stdout.strip().splitlines()[-1])
            for line in p.stderr.splitlines():
                if "decode" in line and "tok/s" in line:
                    kvd_pre.append(float(line.split("prefill ")[1].split(" tokens in ")[1].split(" s")[0]))
                    kvd_dec.append(float(line.split("decode ")[1].split(" tokens in ")[1].split(" s")[0]))
            ll_pre.append(d["prefill_s"])
            ll_dec.append(d["decode_s"])
            V = r["n_vocab"]
            kv = np.fromfile(lf, dtype="<f4").reshape(a.n_predict, V).astype(np.float64)
            ll = data["rows%d" % k].astype(np.float64)
            kg = r["generated"]
            first = next((i for i in range(a.n_predict) if kg[i] != g[i]), a.n_predict)
            n_same += first
            n_tok += a.n_predict
            rows = range(min(first + 1, a.n_predict))  # rows up to and including the first difference share context
            std = ll[list(rows)].std(1)
            dif = np.abs(kv[list(rows)] - ll[list(rows)])
            mx = (dif.max(1) / std).max()
            rms = (np.sqrt((dif ** 2).mean(1)) / std).max()
            worst_max, worst_rms = max(worst_max, mx), max(worst_rms, rms)
            note = ""
            if first < a.n_predict:
                top = np.sort(ll[first])[-2:]
                note = "; first differs at step %d, llama.cpp top-2 gap %.3f std" % (first, (top[1] - top[0]) / ll[first].std())
            print("prompt %d (%d tokens): %d/%d greedy tokens identical%s; rows up to there: max %.3f std, rms %.3f std"
                  % (k, len(t), first, a.n_predict, note, mx, rms))
    n_pre = sum(len(d["tokens"]) for d in meta)
    n_dec = len(meta) * (a.n_predict - 1)
    print("greedy tokens identical before the first difference: %d/%d" % (n_same, n_tok))
    print("largest max|diff| %.3f std, largest rms %.3f std" % (worst_max, worst_rms))
    print("speed, %d threads: kvd decode %.1f tok/s, prefill %.1f tok/s; llama.cpp decode %.1f tok/s, prefill %.1f tok/s"
          % (a.threads, n_dec / sum(kvd_dec), n_pre / sum(kvd_pre), n_dec / sum(ll_dec), n_pre / sum(ll_pre)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
