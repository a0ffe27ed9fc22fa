#!/usr/bin/env python3
"""bench/native.py — kvd's engine against llama.cpp's own native tools.

The peer is llama.cpp at its best: `llama-bench` and `llama-batched-bench`
built natively by scripts/build-peer from the llama.cpp source that the
pinned llama-cpp-python carries. Both run the same GGUF files with the same
thread count and lengths:

  decode d128    single-stream decode of 64 tokens after a 128-token context
                 (kvd_bench decode; llama-bench -p 0 -n 64 -d 128)
  prefill 512    a 512-token prompt (kvd_bench prefill; llama-bench -p 512 -n 0)
  32 seqs        32 sequences, 128-token prompts each, decoding 16 tokens
                 together: aggregate decode tokens/s (kvd_bench batch;
                 llama-batched-bench -npp 128 -ntg 16 -npl 32, S_TG)
  prefill 4096   a 4096-token prompt (as prefill 512)
  prefill 512 bf16, prefill 4096 bf16
                 the same prompts with kvd's K/V stored as bfloat16
                 (kvd_bench --cache-type bf16: attention on AVX-512 BF16
                 products where the CPU has them), against llama.cpp's
                 default f16 cache, its faster one here (with -ctk bf16
                 -ctv bf16 llama-bench ran prefill 512 at 185 tokens/s
                 against 281 with f16)

The serving figure (--serve-gap, on by default for the default model;
--no-serve-gap skips it): kvd is started on the first file with
[scheduler] max_step_ms set to each of --step-ms in turn, and
bench/stream_gap measures a stream's p50/p99/max inter-token gap while a
4096-token prompt arrives, and that prompt's time to first token against the
same prompt on the idle daemon (ratio = loaded / idle). Daemon only, no peer.

Runs alternate (kvd, peer, kvd, peer, ...) so that the shared machine's
load drifts over both alike; each figure is the median of --reps runs and the
ratio is kvd / peer. Raw results go to bench/results/native-<time>.json.

  bench/native.py --peer-bin DIR --files F1,F2 [--threads 2] [--reps 3]
                  [--only FIGURES] [--quick] [--step-ms 0,25,50,100]
                  [--gap-reps 2] [--no-serve-gap]
"""
import argparse
import json
import os
import signal
import tempfile
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KVD = os.path.join(ROOT, os.environ.get("KVD_BUILD", "build"), "bench", "kvd_bench")
DAEMON = os.path.join(ROOT, os.environ.get("KVD_BUILD", "build"), "bin", "kvd")
STREAM_GAP = os.path.join(ROOT, os.environ.get("KVD_BUILD", "build"), "bench", "stream_gap")
GAP_PROMPT = 4096
DAEMON_START_S = 120  # longest wait for the daemon to accept a connection

SEQS, SEQ_PROMPT, SEQ_TOKENS = 32, 128, 16


def figures(quick):
    """(name, kvd_bench args, peer kind, peer args)"""
    dec = "32" if quick else "64"
    return [
        ("decode d128", ["decode", "--depth", "128", "--tokens", dec],
         "bench", ["-p", "0", "-n", dec, "-d", "128"]),
        ("prefill 512", ["prefill", "--tokens", "512"], "bench", ["-p", "512", "-n", "0"]),
        ("32 seqs", ["batch", "--seqs", str(SEQS), "--depth", str(SEQ_PROMPT), "--tokens", str(SEQ_TOKENS)],
         "batched", ["-npp", str(SEQ_PROMPT), "-ntg", str(SEQ_TOKENS), "-npl", str(SEQS),
                     "-c", str(SEQS * (SEQ_PROMPT + SEQ_TOKENS) + 256)]),
        ("prefill 4096", ["prefill", "--tokens", "4096"], "bench", ["-p", "4096", "-n", "0"]),
        ("prefill 512 bf16", ["--cache-type", "bf16", "prefill", "--tokens", "512"], "bench",
         ["-p", "512", "-n", "0"]),
        ("prefill 4096 bf16", ["--cache-type", "bf16", "prefill", "--tokens", "4096"], "bench",
         ["-p", "4096", "-n", "0"]),
    ]


def run_kvd(model, threads, args):
    cmd = [KVD, "--model", model, "--threads", str(threads)] + args
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["tokens_per_s"], cmd


def run_peer(bindir, kind, model, threads, args):
    if kind == "bench":
        cmd = [os.path.join(bindir, "llama-bench"), "-m", model, "-t", str(threads), "-r", "1", "-o", "json"] + args
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return json.loads(out)[0]["avg_ts"], cmd
    cmd = [os.path.join(bindir, "llama-batched-bench"), "-m", model, "-t", str(threads), "-tb", str(threads),
           "--output-format", "jsonl"] + args
    p = subprocess.run(cmd, check=True, capture_output=True, text=True)
    for line in (p.stdout + "\n" + p.stderr).splitlines():
        line = line.strip()
        if line.startswith("{") and "speed_tg" in line:
            return json.loads(line)["speed_tg"], cmd
    raise RuntimeError("llama-batched-bench printed no result")


def run_stream_gap(model, threads, step_ms, reps):
    """Start kvd on model with max_step_ms = step_ms, run bench/stream_gap
    against it, stop it; returns stream_gap's JSON object."""
    with tempfile.TemporaryDirectory(prefix="kvd-gap-") as tmp:
        sock = os.path.join(tmp, "kvd.sock")
        log = open(os.path.join(tmp, "kvd.log"), "w+")
        cmd = [DAEMON, "--config", "/dev/null", "--socket", sock, "--model", model, "--threads", str(threads),
               "--max-step-ms", str(step_ms)]
        d = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        try:
            t0 = time.time()
            while not os.path.exists(sock):
                if d.poll() is not None or time.time() - t0 > DAEMON_START_S:
                    log.seek(0)
                    raise RuntimeError("kvd did not start: " + log.read()[-2000:])
                time.sleep(0.1)
            gcmd = [STREAM_GAP, "--socket", sock, "--prompt-tokens", str(GAP_PROMPT), "--reps", str(reps)]
            for _ in range(int(DAEMON_START_S / 0.2)):  # the socket may exist before it answers
                p = subprocess.run(gcmd, capture_output=True, text=True)
                if p.returncode == 0 or "cannot connect" not in p.stderr:
                    break
                time.sleep(0.2)
            if p.returncode != 0:
                raise RuntimeError("stream_gap failed: " + p.stderr[-2000:])
            return json.loads(p.stdout.strip().splitlines()[-1]), cmd + ["&&"] + gcmd
        finally:
            d.send_signal(signal.SIGTERM)
            try:
                d.wait(30)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
            log.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer-bin", required=True, help="directory with llama-bench and llama-batched-bench")
    ap.add_argument("--files", required=True, help="comma-separated GGUF files")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated substrings of figure names")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--step-ms", default="0,25,50,100", help="max_step_ms values for the serving figure")
    ap.add_argument("--gap-reps", type=int, default=2, help="repetitions of the serving figure per value")
    ap.add_argument("--no-serve-gap", action="store_true", help="skip the serving figure")
    a = ap.parse_args()
    if not os.path.exists(KVD):
        sys.exit("bench: %s is missing: run make first" % KVD)
    results = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "threads": a.threads, "reps": a.reps,
               "argv": sys.argv, "figures": []}
    rows = []
    for model in a.files.split(","):
        name = os.path.basename(model)
        for fig, kargs, kind, pargs in figures(a.quick):
            if a.only and not any(o in fig for o in a.only.split(",")):
                continue
            kv, pe = [], []
            for _ in range(a.reps):
                v, kcmd = run_kvd(model, a.threads, kargs)
                kv.append(v)
                v, pcmd = run_peer(a.peer_bin, kind, model, a.threads, pargs)
                pe.append(v)
            mk, mp = statistics.median(kv), statistics.median(pe)
            rows.append((name, fig, mk, mp, kv, pe))
            results["figures"].append({"file": name, "figure": fig, "kvd": kv, "peer": pe, "kvd_median": mk,
                                       "peer_median": mp, "ratio": mk / mp, "kvd_cmd": kcmd, "peer_cmd": pcmd})
            print("%-38s %-13s kvd %8.1f  llama.cpp %8.1f  ratio %5.2f   (kvd %s; peer %s)" %
                  (name, fig, mk, mp, mk / mp, " ".join("%.0f" % x for x in kv), " ".join("%.0f" % x for x in pe)),
                  flush=True)
    gaps = []
    if not a.no_serve_gap and (not a.only or "serve" in a.only):
        for ms in [int(x) for x in a.step_ms.split(",") if x != ""]:
            g, gcmd = run_stream_gap(a.files.split(",")[0], a.threads, ms, a.gap_reps)
            g["max_step_ms"] = ms
            g["cmd"] = gcmd
            gaps.append(g)
            print("serving, max_step_ms %-4d gap p50 %6.1f ms  p99 %6.1f ms  max %6.1f ms   ttft %7.0f ms  "
                  "idle %7.0f ms  ratio %5.2f" % (ms, g["gap_p50_ms"], g["gap_p99_ms"], g["gap_max_ms"],
                                                   g["ttft_ms"], g["idle_ttft_ms"], g["ttft_ratio"]), flush=True)
    results["serving"] = gaps
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    path = os.path.join(ROOT, "bench", "results", "native-" + time.strftime("%Y%m%d-%H%M%S") + ".json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    if rows:
        print()
        print("tokens/s, %d threads, median of %d alternating runs; ratio = kvd / llama.cpp native" %
              (a.threads, a.reps))
        print("| file | figure | kvd | llama.cpp (native) | ratio |")
        print("|---|---|---|---|---|")
        for name, fig, mk, mp, kv, pe in rows:
            print("| %s | %s | %.1f | %.1f | %.2f× |" % (name, fig, mk, mp, mk / mp))
    if gaps:
        print()
        print("serving: a stream's inter-token gaps while a %d-token prompt arrives (%s, %d threads, median of %d);"
              % (GAP_PROMPT, os.path.basename(a.files.split(",")[0]), a.threads, a.gap_reps))
        print("TTFT ratio = that prompt's time to first token / the same on the idle daemon")
        print("| max_step_ms | gap p50 ms | gap p99 ms | gap max ms | TTFT ms | idle TTFT ms | TTFT ratio |")
        print("|---|---|---|---|---|---|---|")
        for g in gaps:
            print("| %d | %.1f | %.1f | %.1f | %.0f | %.0f | %.2f× |" % (g["max_step_ms"], g["gap_p50_ms"],
                  g["gap_p99_ms"], g["gap_max_ms"], g["ttft_ms"], g["idle_ttft_ms"], g["ttft_ratio"]))
    print("raw results: %s" % os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
