#!/usr/bin/env python3
"""Cross-check the NumPy reference (ref.py) against llama.cpp, independently
of kvd. Not part of `make test`: it needs a Python with llama-cpp-python,
which the test venv does not carry.

    vs_llamacpp.py --llama-python /path/to/venv/bin/python [MODEL] [--n-predict 32]

llama.cpp tokenizes each prompt (special tokens parsed), evaluates it with
logits for every position, and decodes greedily; the reference is then run on
the same tokens (act_q8 and kv_f16 on, teacher-forced on llama.cpp's tokens)
and the two are compared the way check.py compares kvd: max |logit diff| per
row in units of the row's std, and whether llama.cpp's greedy token is the
reference's argmax at each step (top-2 gap printed where it is not).
llama.cpp also quantizes activations to 8 bits (with an f16 block scale), so
agreement is at the level of quantization noise, not of float rounding.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref  # noqa: E402

PROMPTS = [
    "What is the capital of France? Explain briefly.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Shopping list:\n1. Milk\n2. Eggs\n3.",
    "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n",
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "developed a system of movable metal type in Mainz. Before this, books were copied by hand, "
    "which made them rare and expensive.",
]

DUMP = r"""
import json, sys, numpy as np
from llama_cpp import Llama
model, n_predict, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
prompts = json.load(open(out + ".prompts"))
llm = Llama(model_path=model, logits_all=True, n_ctx=2048, verbose=False, n_threads=2)
res = {}
meta = []
for k, p in enumerate(prompts):
    t = llm.tokenize(p.encode(), add_bos=False, special=True)
    llm.reset()
    llm.eval(t)
    rows = [np.array(llm.scores[len(t) - 1])]
    gen = []
    for i in range(n_predict):
        gen.append(int(np.argmax(rows[-1])))
        if i + 1 < n_predict:
            llm.eval([gen[-1]])
            rows.append(np.array(llm.scores[len(t) + i]))
    res["rows%d" % k] = np.array(rows, dtype=np.float32)
    res["prompt%d" % k] = np.array(llm.scores[:len(t)], dtype=np.float32)
    meta.append(dict(tokens=t, generated=gen))
np.savez(out, **res)
json.dump(meta, open(out + ".json", "w"))
"""


def main():
    ap = argparse.ArgumentParser(description="reference vs llama.cpp")
    ap.add_argument("model", nargs="?", default=os.path.join(HERE, "..", "..", "models",
                                                             "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--llama-python", required=True, help="python interpreter that has llama_cpp")
    ap.add_argument("--n-predict", type=int, default=32)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ll.npz")
        json.dump(PROMPTS, open(out + ".prompts", "w"))
        subprocess.run([a.llama_python, "-c", DUMP, a.model, str(a.n_predict), out], check=True)
        data = dict(np.load(out))
        meta = json.load(open(out + ".json"))
    m = ref.Model(a.model, dtype=np.float32)
    print("model: %s" % m.describe())
    worst = 0.0
    for k, d in enumerate(meta):
        t, g = d["tokens"], d["generated"]
        ll_rows, ll_prompt = data["rows%d" % k], data["prompt%d" % k]
        cache = m.new_cache(kv_f16=True)
        mine_prompt = m.forward(t, cache, act_q8=True)
        mine = m.teacher_forced(t, g, act_q8=True, kv_f16=True)
        relp = (np.abs(mine_prompt - ll_prompt).max(1) / mine_prompt.std(1)).max()
        rel = np.abs(mine - ll_rows).max(1) / mine.std(1)
        rms = np.sqrt(((mine - ll_rows) ** 2).mean(1)) / mine.std(1)
        am = mine.argmax(1)
        mism = [(i, float((mine[i, am[i]] - mine[i, g[i]]) / mine[i].std())) for i in range(len(g)) if am[i] != g[i]]
        worst = max(worst, rel.max(), relp)
        print("prompt %d (%d tokens): every prompt position max %.3f std; %d decode rows max %.3f std, "
              "rms %.3f std; greedy %d/%d same%s" % (
                  k, len(t), relp, len(g), rel.max(), rms.max(), len(g) - len(mism), len(g),
                  "".join("; step %d differs, reference top-2 gap %.3f std" % x for x in mism)))
    print("largest max|diff| %.3f std" % worst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
