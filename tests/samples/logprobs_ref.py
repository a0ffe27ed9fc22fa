"""Check kvd's log-probabilities against the NumPy reference (tests/reference/ref.py).

Reads the JSON of `kvctl generate --raw --temperature 0 --logprobs K --json`
for a prompt whose token ids are given, runs the reference forward pass over
those ids, and compares the first generated token's top-K log-probabilities
with log_softmax of the reference logits for the prompt's next token:

* the first token kvd generated is the reference's argmax, or a near tie
  (unless --sampled), and its log-probability is the reference's;
* each of kvd's top-K ids has, in the reference, a log-probability within
  TOL of the value kvd reports, and kvd's K values are the reference's K
  largest (as a multiset, within TOL);
* the chosen token's own log-probability equals its entry in top_logprobs.

Prints the largest difference. Exit status 0 when all hold, 1 otherwise.

    logprobs_ref.py MODEL.gguf IDS(comma-separated) KVCTL_JSON_FILE [--tol T]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import ref  # noqa: E402


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("ids")
    ap.add_argument("json")
    ap.add_argument("--tol", type=float, default=0.05, help="absolute, in nats")
    ap.add_argument("--tol-std", type=float, default=None,
                    help="instead of --tol: a multiple of the reference logits row's standard deviation")
    ap.add_argument("--f64", action="store_true", help="reference in float64 (tiny models)")
    ap.add_argument("--sampled", action="store_true",
                    help="the token was sampled (temperature > 0): do not require the argmax")
    a = ap.parse_args()
    ids = [int(t) for t in a.ids.split(",") if t]
    out = json.load(open(a.json))
    lp = out["logprobs"]
    if not lp:
        print("FAIL: no logprobs in kvd's output")
        return 1
    first = lp[0]
    k = len(first["top_logprobs"])

    m = ref.Model(a.model, dtype=np.float64 if a.f64 else np.float32)
    cache = m.new_cache(kv_f16=True)
    rows = m.forward(ids, cache, act_q8=True)
    want = log_softmax(rows[-1])
    if a.tol_std is not None:
        a.tol = a.tol_std * float(np.asarray(rows[-1], dtype=np.float64).std())
    order = np.argsort(-want, kind="stable")

    worst = 0.0
    ok = True
    # the generated token: the reference's argmax or within TOL of it
    chosen = first["id"]
    d = abs(first["logprob"] - want[chosen])
    worst = max(worst, d)
    if d > a.tol:
        print(f"FAIL: the generated token {chosen}: kvd {first['logprob']:.5f}, ref {want[chosen]:.5f}")
        ok = False
    if not a.sampled and chosen != int(order[0]) and want[order[0]] - want[chosen] > a.tol:
        print(f"FAIL: kvd chose {chosen} (ref logprob {want[chosen]:.4f}); ref argmax {order[0]} ({want[order[0]]:.4f})")
        ok = False
    for e in first["top_logprobs"]:
        d = abs(e["logprob"] - want[e["id"]])
        worst = max(worst, d)
        if d > a.tol:
            print(f"FAIL: id {e['id']}: kvd {e['logprob']:.5f}, ref {want[e['id']]:.5f}")
            ok = False
    got = sorted((e["logprob"] for e in first["top_logprobs"]), reverse=True)
    for g, w in zip(got, want[order[:k]]):
        worst = max(worst, abs(g - w))
        if abs(g - w) > a.tol:
            print(f"FAIL: kvd's top-{k} values {got} are not the reference's {list(want[order[:k]])}")
            ok = False
            break
    mine = [e for e in first["top_logprobs"] if e["id"] == chosen]
    if mine and mine[0]["logprob"] != first["logprob"]:
        print("FAIL: the chosen token's logprob differs from its top_logprobs entry")
        ok = False
    print(f"top-{k} log-probabilities of the first token: max |kvd - ref| = {worst:.3g} (tol {a.tol:.3g}); "
          f"kvd top ids {[e['id'] for e in first['top_logprobs']]}, ref {[int(i) for i in order[:k]]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
