#!/usr/bin/env python3
"""bench/compare.py — kvd's CPU figures beside llama.cpp's, measured in the
same run on the same GGUF, thread count, prompts and greedy decoding.

Runs of the two alternate (kvd, llama.cpp, kvd, llama.cpp, ...) so that
drift in the shared machine's load hits both alike; each figure is the
median of --reps runs. Prints one table (figure, kvd, llama.cpp, ratio)
and writes every raw result to bench/results/<timestamp>.json.

Figures (issue "CPU performance"): single-stream decode at depth 128 and
2048; prefill of 512 and 2048 tokens; aggregate decode with 1, 4, 16 and
32 sequences; time to first token with a cached 1024-token prefix against
cold; peak RSS; memory bandwidth (STREAM triad) and decode as a fraction
of the bandwidth bound.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
KVD = os.path.join(ROOT, os.environ.get("KVD_BUILD", "build"), "bench", "kvd_bench")
PEER = [sys.executable, os.path.join(ROOT, "bench", "llama_peer.py")]


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def figures(quick):
    f = [
        ("decode d128", ["decode", "--depth", "128", "--tokens", "32" if quick else "64"], "tokens_per_s"),
        ("decode d2048", ["decode", "--depth", "2048", "--tokens", "16" if quick else "32"], "tokens_per_s"),
        ("prefill 512", ["prefill", "--tokens", "512"], "tokens_per_s"),
        ("prefill 2048", ["prefill", "--tokens", "2048"], "tokens_per_s"),
    ]
    for s in (1, 4, 16, 32):
        f.append(("batch %d seqs" % s, ["batch", "--seqs", str(s), "--depth", "64", "--tokens", "8" if quick else "16"],
                  "tokens_per_s"))
    f.append(("ttft warm/cold 1024", ["prefix", "--tokens", "1024", "--suffix", "16"], "warm_over_cold"))
    return f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="shorter runs, fewer figures")
    ap.add_argument("--only", default="", help="comma-separated substrings of figure names")
    a = ap.parse_args()
    if not os.path.exists(KVD):
        sys.exit("bench: %s is missing: run make first" % KVD)
    results = {"model": MODEL, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "reps": a.reps, "figures": []}
    triad = [run([KVD, "triad", "--mib", "768"])["gb_per_s"] for _ in range(3)]
    bw = max(triad)
    results["triad_gb_per_s"] = triad
    rows = []
    for th in [int(x) for x in a.threads.split(",")]:
        for name, args, key in figures(a.quick):
            if a.only and not any(o in name for o in a.only.split(",")):
                continue
            kv, ll = [], []
            for _ in range(a.reps):
                kv.append(run([KVD, "--model", MODEL, "--threads", str(th)] + args))
                ll.append(run(PEER + ["--model", MODEL, "--threads", str(th)] + args))
            mk = statistics.median(r[key] for r in kv)
            ml = statistics.median(r[key] for r in ll)
            ratio = (ml / mk) if key == "warm_over_cold" else (mk / ml)
            rows.append((th, name, mk, ml, ratio, key))
            extra = {}
            if name.startswith("decode") or name == "batch 1 seqs":
                bps = statistics.median(r["bytes_per_step"] for r in kv)
                extra = {"bytes_per_token": bps, "bound_tokens_per_s": bw * 1e9 / bps,
                         "fraction_of_bound": mk / (bw * 1e9 / bps)}
            results["figures"].append({"threads": th, "figure": name, "key": key, "kvd": kv, "llama": ll,
                                       "kvd_median": mk, "llama_median": ml, "ratio": ratio, **extra})
            rss_k = max(r["peak_rss_kib"] for r in kv) / 1024
            rss_l = max(r["peak_rss_kib"] for r in ll) / 1024
            print("t=%d %-22s kvd %10.3f  llama.cpp %10.3f  ratio %5.2f  rss %4.0f/%4.0f MiB %s" %
                  (th, name, mk, ml, ratio, rss_k, rss_l,
                   ("roofline %.0f%%" % (100 * extra["fraction_of_bound"])) if extra else ""), flush=True)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    path = os.path.join(ROOT, "bench", "results", time.strftime("%Y%m%d-%H%M%S") + ".json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print()
    print("memory bandwidth (triad, best of 3): %.1f GB/s" % bw)
    print("%-3s %-22s %12s %12s %7s" % ("thr", "figure", "kvd", "llama.cpp", "ratio"))
    for th, name, mk, ml, ratio, key in rows:
        unit = "" if key == "warm_over_cold" else " tok/s"
        print("%-3d %-22s %12.3f %12.3f %6.2fx" % (th, name, mk, ml, ratio))
    print("(ratio: kvd / llama.cpp for rates; llama.cpp / kvd for warm/cold time ratios — above 1 means kvd is ahead)")
    print("raw results: %s" % os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
