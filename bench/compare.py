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
    ap.add_argument("--serve", action="store_true", help="kvd end to end through libkvclient (see serve_main)")
    a = ap.parse_args()
    if a.serve:
        return serve_main(a)
    if not os.path.exists(KVD):
        sys.exit("bench: %s is missing: run make first" % KVD)
    results = {"model": MODEL, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "reps": a.reps, "figures": []}
    bws = {}
    rows = []
    for th in [int(x) for x in a.threads.split(",")]:
        # the roofline of th threads uses the bandwidth th threads reach
        triad = [run([KVD, "--threads", str(th), "triad", "--mib", "768"])["gb_per_s"] for _ in range(3)]
        bw = bws[th] = max(triad)
        results.setdefault("triad_gb_per_s", {})[str(th)] = triad
        for name, args, key in figures(a.quick):
            if a.only and not any(o in name for o in a.only.split(",")):
                continue
            roof = name.startswith("decode") or name == "batch 1 seqs"
            kv, ll = [], []
            for _ in range(a.reps):
                # a decode run's own bound: the triad just before it, so a
                # neighbour's load that slows the run also lowers its bound
                pair_bw = run([KVD, "--threads", str(th), "triad", "--mib", "768"])["gb_per_s"] if roof else None
                kv.append(run([KVD, "--model", MODEL, "--threads", str(th)] + args))
                if pair_bw:
                    kv[-1]["triad_gb_per_s"] = pair_bw
                ll.append(run(PEER + ["--model", MODEL, "--threads", str(th)] + args))
            mk = statistics.median(r[key] for r in kv)
            ml = statistics.median(r[key] for r in ll)
            ratio = (ml / mk) if key == "warm_over_cold" else (mk / ml)
            extra = {}
            if roof:
                bps = statistics.median(r["bytes_per_step"] for r in kv)
                paired = statistics.median(r[key] * r["bytes_per_step"] / (r["triad_gb_per_s"] * 1e9) for r in kv)
                extra = {"bytes_per_token": bps, "bound_tokens_per_s": bw * 1e9 / bps,
                         "fraction_of_bound": mk / (bw * 1e9 / bps), "fraction_of_paired_bound": paired}
            rows.append((th, name, mk, ml, ratio, key, extra))
            results["figures"].append({"threads": th, "figure": name, "key": key, "kvd": kv, "llama": ll,
                                       "kvd_median": mk, "llama_median": ml, "ratio": ratio, **extra})
            rss_k = max(r["peak_rss_kib"] for r in kv) / 1024
            rss_l = max(r["peak_rss_kib"] for r in ll) / 1024
            print("t=%d %-22s kvd %10.3f  llama.cpp %10.3f  ratio %5.2f  rss %4.0f/%4.0f MiB %s" %
                  (th, name, mk, ml, ratio, rss_k, rss_l,
                   ("roofline %.0f%% (paired %.0f%%)" % (100 * extra["fraction_of_bound"],
                                                         100 * extra["fraction_of_paired_bound"])) if extra else ""),
                  flush=True)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    path = os.path.join(ROOT, "bench", "results", time.strftime("%Y%m%d-%H%M%S") + ".json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print()
    for th, bw in bws.items():
        print("memory bandwidth, %d thread(s) (triad, best of 3): %.1f GB/s" % (th, bw))
    print("%-3s %-22s %12s %12s %7s" % ("thr", "figure", "kvd", "llama.cpp", "ratio"))
    for th, name, mk, ml, ratio, key, extra in rows:
        print("%-3d %-22s %12.3f %12.3f %6.2fx" % (th, name, mk, ml, ratio))
    print("(ratio: kvd / llama.cpp for rates; llama.cpp / kvd for warm/cold time ratios — above 1 means kvd is ahead)")
    print()
    print("roofline: bytes read per decode step over the triad bandwidth")
    for th, name, mk, ml, ratio, key, extra in rows:
        if extra:
            print("t=%d %-16s %6.1f MB/token  bound %6.1f tok/s  kvd %4.0f%%  (paired with a triad run before each: %.0f%%)" %
                  (th, name, extra["bytes_per_token"] / 1e6, extra["bound_tokens_per_s"],
                   100 * extra["fraction_of_bound"], 100 * extra["fraction_of_paired_bound"]))
    print("raw results: %s" % os.path.relpath(path, ROOT))


# ---- kvd end to end (--serve) ---------------------------------------------------

SERVE = os.path.join(ROOT, os.environ.get("KVD_BUILD", "build"), "bench", "serve_bench")
KVD_DAEMON = os.path.join(ROOT, os.environ.get("KVD_BUILD", "build"), "bin", "kvd")
KVCTL = os.path.join(ROOT, os.environ.get("KVD_BUILD", "build"), "bin", "kvctl")


def serve_figures(quick):
    """(name, engine-or-peer command side, serve_bench args, what the ratio means).

    a. single-stream streaming overhead: kvd_bench decode against one client
       through the daemon, same prompt length and decode steps;
    b. 32 clients through the daemon against the engine's own batch of 32;
    c. 1, 4, 16, 32 clients through the daemon against llama.cpp's batch API.
    """
    t1 = "64" if quick else "128"
    t2 = "32" if quick else "64"
    t3 = "16" if quick else "32"
    f = [("stream 1 client d64", "engine", ["decode", "--depth", "64", "--tokens", t1],
          ["--clients", "1", "--depth", "64", "--tokens", t1], "overhead"),
         ("32 clients vs engine", "engine", ["batch", "--seqs", "32", "--depth", "64", "--tokens", t2],
          ["--clients", "32", "--depth", "64", "--tokens", t2], "ratio")]
    for s in (1, 4, 16, 32):
        f.append(("serve %d clients" % s, "llama", ["batch", "--seqs", str(s), "--depth", "64", "--tokens", t3],
                  ["--clients", str(s), "--depth", "64", "--tokens", t3], "ratio"))
    return f


def serve_start(threads, tmp):
    """Start kvd on MODEL (CPU, `threads` threads, socket in tmp); wait until
    `kvctl stats` answers. Prefix caching is off so that every run prefills
    its prompts cold, as kvd_bench and llama_peer.py do."""
    sock = os.path.join(tmp, "kvd.sock")
    log = open(os.path.join(tmp, "kvd.log"), "w")
    proc = subprocess.Popen([KVD_DAEMON, "--config", os.path.join(ROOT, "etc", "kvd.conf"), "--model", MODEL,
                             "--backend", "cpu", "--threads", str(threads), "--socket", sock,
                             "--pool-size", "512M", "--swap-file", "", "--no-prefix-caching",
                             "--log-level", "warning"],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        r = subprocess.run([KVCTL, "--socket", sock, "stats"], capture_output=True)
        if r.returncode == 0:
            return proc, sock
        time.sleep(0.1)
    serve_stop(proc)
    with open(os.path.join(tmp, "kvd.log")) as f:
        tail = f.read()[-2000:]
    sys.exit("bench: kvd did not become ready; its log:\n" + tail)


def serve_stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve_rss_kib(proc):
    try:
        with open("/proc/%d/status" % proc.pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def serve_main(a):
    """--serve: kvd end to end. For each thread count a kvd is started on
    MODEL, and serve_bench (N client threads, one libkvclient connection
    each) alternates with kvd_bench (the engine alone) or llama_peer.py
    (llama.cpp's batch API); medians of --reps runs. Figures: the per-token
    overhead of streaming one sequence through the daemon, (engine / daemon
    - 1) x 100 %; 32 clients' aggregate decode against the engine's batch
    of 32 (daemon / engine); and 1, 4, 16, 32 clients against llama.cpp's
    batched figure (daemon / llama.cpp). serve_bench's tokens_per_s counts
    decode while every client is decoding (as the engine's and llama.cpp's
    batch figures exclude prefill); e2e_tokens_per_s, TTFT and inter-token
    latency are shown beside it."""
    import shutil
    import tempfile
    for p in (SERVE, KVD_DAEMON, KVCTL, KVD):
        if not os.path.exists(p):
            sys.exit("bench: %s is missing: run make first" % p)
    results = {"model": MODEL, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "reps": a.reps, "serve": True,
               "figures": []}
    rows = []
    for th in [int(x) for x in a.threads.split(",")]:
        tmp = tempfile.mkdtemp(prefix="kvd-serve-")
        proc = None
        try:
            proc, sock = serve_start(th, tmp)
            for name, side, other_args, serve_args, kind in serve_figures(a.quick):
                if a.only and not any(o in name for o in a.only.split(",")):
                    continue
                sv, ot = [], []
                for _ in range(a.reps):
                    if side == "engine":
                        ot.append(run([KVD, "--model", MODEL, "--threads", str(th)] + other_args))
                    else:
                        ot.append(run(PEER + ["--model", MODEL, "--threads", str(th)] + other_args))
                    sv.append(run([SERVE, "--socket", sock] + serve_args))
                ms = statistics.median(r["tokens_per_s"] for r in sv)
                mo = statistics.median(r["tokens_per_s"] for r in ot)
                me2e = statistics.median(r["e2e_tokens_per_s"] for r in sv)
                ttft = statistics.median(r["ttft_ms"] for r in sv)
                itl = statistics.median(r["itl_ms"] for r in sv)
                eos = sum(r["eos_finishes"] for r in sv)
                value = (mo / ms - 1) * 100 if kind == "overhead" else ms / mo
                # the same measure per adjacent pair of runs, whose median resists slow drift of the load
                pairs = [((o["tokens_per_s"] / v["tokens_per_s"] - 1) * 100) if kind == "overhead"
                         else v["tokens_per_s"] / o["tokens_per_s"] for v, o in zip(sv, ot)]
                paired = statistics.median(pairs)
                row = {"threads": th, "figure": name, "against": side, "kind": kind, "kvd_serve": sv, "other": ot,
                       "serve_median": ms, "other_median": mo, "serve_e2e_median": me2e, "ttft_ms_median": ttft,
                       "itl_ms_median": itl, "eos_finishes": eos, "paired": pairs, "paired_median": paired}
                row["overhead_pct" if kind == "overhead" else "ratio"] = value
                results["figures"].append(row)
                rows.append((th, name, side, kind, ms, mo, value, paired, me2e, ttft, itl, eos))
                print("t=%d %-22s kvd serve %9.3f  %s %9.3f  %s (paired %s)  e2e %8.3f  ttft %8.1f ms  itl %7.2f ms%s" %
                      (th, name, ms, "engine" if side == "engine" else "llama.cpp", mo,
                       ("overhead %+.1f%%" % value) if kind == "overhead" else ("ratio %.2fx" % value),
                       ("%+.1f%%" % paired) if kind == "overhead" else ("%.2fx" % paired),
                       me2e, ttft, itl, ("  (%d eos)" % eos) if eos else ""), flush=True)
            results.setdefault("kvd_peak_rss_kib", {})[str(th)] = serve_rss_kib(proc)
        finally:
            if proc is not None:
                serve_stop(proc)
            shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    path = os.path.join(ROOT, "bench", "results", "serve-" + time.strftime("%Y%m%d-%H%M%S") + ".json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print()
    print("%-3s %-22s %11s %11s %-9s %11s %9s %9s %9s %9s" %
          ("thr", "figure", "kvd serve", "other", "(other)", "result", "paired", "e2e", "ttft ms", "itl ms"))
    for th, name, side, kind, ms, mo, value, paired, me2e, ttft, itl, eos in rows:
        res = ("%+.1f%% ovh" % value) if kind == "overhead" else ("%.2fx" % value)
        pres = ("%+.1f%%" % paired) if kind == "overhead" else ("%.2fx" % paired)
        print("%-3d %-22s %11.3f %11.3f %-9s %11s %9s %9.3f %9.1f %9.2f%s" %
              (th, name, ms, mo, "engine" if side == "engine" else "llama.cpp", res, pres, me2e, ttft, itl,
               ("  %d eos" % eos) if eos else ""))
    print("(tok/s; kvd serve: decode while all clients decode; e2e: all tokens over wall time incl. prefill;")
    print(" overhead = (engine / kvd serve - 1) x 100, target < 2%; ratio = kvd serve / other, target >= 0.9x vs engine;")
    print(" paired: the median of the same measure taken per adjacent pair of runs)")
    print("raw results: %s" % os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
