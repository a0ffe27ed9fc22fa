#!/usr/bin/env python3
"""How far kvd's logits are from the NumPy reference computed with float
(unquantized) activations: what the int8 activation quantization of the
matrix products costs (per block of 32, or per 256 for the K-quants' inputs).

    tests/reference/act_quality.py MODEL.gguf [--kvd-eval build/tests/kvd_eval]
                                   [--prompt-tokens 40] [--n-predict 8] [--seed 1]

Runs kvd_eval greedily on a pseudo-random prompt with an f32 KV cache,
teacher-forces the reference (ref.py, float64, act_q8=False, f32 cache) on
the same tokens, and prints the mean KL(p_ref || p_kvd) over the rows in
nats and the rms and largest logit differences. Pass another build's
kvd_eval to compare two builds on the same tokens.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref  # noqa: E402


def log_softmax(a):
    a = a - a.max(-1, keepdims=True)
    return a - np.log(np.exp(a).sum(-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--kvd-eval", default=os.path.join(os.environ.get("KVD_BUILD", "build"), "tests", "kvd_eval"))
    ap.add_argument("--prompt-tokens", type=int, default=40)
    ap.add_argument("--n-predict", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    m = ref.Model(a.model, dtype=np.float64)
    rng = np.random.default_rng(a.seed)
    toks = [int(t) for t in rng.integers(10, m.n_vocab - 10, a.prompt_tokens)]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.bin")
        r = subprocess.run([a.kvd_eval, "--model", a.model, "--tokens", ",".join(map(str, toks)), "--n-predict",
                            str(a.n_predict), "--logits-out", out, "--cache-type", "f32"],
                           capture_output=True, text=True)
        if r.returncode:
            sys.exit("kvd_eval failed (%d): %s" % (r.returncode, r.stderr.strip()))
        gen = json.loads(r.stdout.strip().splitlines()[-1])["generated"]
        got = np.fromfile(out, dtype=np.float32).reshape(-1, m.n_vocab).astype(np.float64)
    # row i of kvd's logits follows prompt + gen[:i], as teacher_forced's
    want = np.asarray(m.teacher_forced(toks, gen[:len(got)], act_q8=False, kv_f16=False), dtype=np.float64)
    n = min(len(got), len(want))
    if n == 0:
        sys.exit("no logits rows to compare")
    p, q = log_softmax(want[:n]), log_softmax(got[:n])
    kl = (np.exp(p) * (p - q)).sum(-1)
    d = want[:n] - got[:n]
    print(json.dumps({"model": os.path.basename(a.model), "rows": n, "mean_kl": float(kl.mean()),
                      "max_kl": float(kl.max()), "rms_logit_diff": float(np.sqrt((d ** 2).mean())),
                      "max_logit_diff": float(np.abs(d).max())}))


if __name__ == "__main__":
    main()
