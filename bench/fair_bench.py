#!/usr/bin/env python3
"""bench/fair_bench.py — a short request's service while another user floods.

Runs the real daemon (build/bin/kvd, default model, --threads, a pool of
--pool-size) and measures one user's (uid 65533) short request — its time
to first token and its decode rate, from the DONE line of tests' kvd_raw —
on the idle daemon, then beside 1, 4 and 32 connections of another user
(uid 65534), each asking again and again for a long generation (max_tokens
--flood-tokens), once the flood has filled the pool. For each it prints the
victim's TTFT against twice its idle TTFT plus one step budget
(max_step_ms), its tokens/s against its fair share (its idle rate divided
by the two users active). Medians of
--reps runs each. "share" is the victim's tokens/s over its fair share (1.0:
exactly half its idle rate); "CPU share" the same per second of kvd's own
CPU time (user + system, /proc), which other processes loading the machine
do not move (kvd runs one engine thread and never sleeps while busy).
Needs root (to speak as two uids) and setpriv.

  bench/fair_bench.py [--conns 1,4,32] [--reps 3] [--threads 2]
                      [--pool-size 64M] [--flood-tokens 2500] [--timeout 60]
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KVD = os.path.join(ROOT, "build/bin/kvd")
RAW = os.path.join(ROOT, "build/tests/kvd_raw")
MODEL = os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
VICTIM = ["setpriv", "--reuid=65533", "--regid=65533", "--clear-groups"]
FLOODER = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
VPROMPT = "Counting: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
APROMPT = "Counting backwards: 9000, 8999, 8998, 8997, 8996,"
STEP_MS = 50  # [scheduler] max_step_ms, the default


def raw(sock, *args, as_user=None, timeout=600):
    cmd = (as_user or []) + [RAW, "-s", sock] + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def stats(sock):
    return json.loads(raw(sock, "stats").stdout)


def cpu_s(pid):
    """kvd's CPU time (user + system), seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def victim(sock, n, timeout=600, pid=None):
    """(ttft_s, tokens/s, tokens per second of kvd's CPU time) of one short
    request; None when it timed out."""
    c0 = cpu_s(pid)
    try:
        r = raw(sock, "generate", "--raw", "-n", str(n), VPROMPT, as_user=VICTIM, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    c1 = cpu_s(pid)
    m = re.search(r"generated=(\d+) ttft_ms=([\d.]+) total_ms=([\d.]+)", r.stdout + r.stderr)
    if r.returncode != 0 or not m:
        sys.exit(f"fair_bench: the short request failed: {r.stderr[-300:]}")
    gen, ttft, total = int(m.group(1)), float(m.group(2)), float(m.group(3))
    return ttft / 1e3, (gen - 1) / max((total - ttft) / 1e3, 1e-9), gen / max(c1 - c0, 1e-2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", default="1,4,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pool-size", default="64M")
    ap.add_argument("--flood-tokens", type=int, default=2500)
    ap.add_argument("--tokens", type=int, default=64, help="the short request's max_tokens")
    ap.add_argument("--timeout", type=int, default=60, help="seconds a short request may take beside the flood")
    a = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        print("fair_bench: skipped: needs root and setpriv (two uids)")
        return 0
    for f in (KVD, RAW, MODEL):
        if not os.path.exists(f):
            sys.exit(f"fair_bench: {f} missing (make; scripts/setup)")
    tmp = tempfile.mkdtemp(prefix="kvd-fair-bench.")
    os.chmod(tmp, 0o755)
    sock = os.path.join(tmp, "kvd.sock")
    conf = os.path.join(tmp, "kvd.conf")
    with open(conf, "w") as f:
        f.write("[server]\nsocket_mode = 0666\n")
    log = open(os.path.join(tmp, "kvd.log"), "w")
    kvd = subprocess.Popen([KVD, "--config", conf, "--socket", sock, "--model", MODEL,
                            "--pool-size", a.pool_size, "--threads", str(a.threads)], stderr=log)
    floods = []
    try:
        for _ in range(600):
            if raw(sock, "hello").returncode == 0:
                break
            time.sleep(0.1)
        raw(sock, "generate", "--raw", "-n", "8", VPROMPT)  # warm-up
        print(f"fair_bench: model {os.path.basename(MODEL)}, threads {a.threads}, pool {a.pool_size}, "
              f"flood max_tokens {a.flood_tokens}, short request {a.tokens} tokens, median of {a.reps}; "
              f"idle figures measured again right before each flood (this machine's load drifts)")
        print(f"{'flooding conns':>14} {'idle TTFT':>9} {'TTFT ms':>9} {'bound ms':>9} {'idle tok/s':>10} "
              f"{'tok/s':>7} {'fair tok/s':>10} {'share':>6} {'CPU share':>9}")
        for n in [int(x) for x in a.conns.split(",")]:
            idle = [victim(sock, a.tokens, pid=kvd.pid) for _ in range(a.reps)]
            ttft0 = statistics.median(v[0] for v in idle)
            rate0 = statistics.median(v[1] for v in idle)
            cpu0 = statistics.median(v[2] for v in idle)
            floods = [subprocess.Popen(["sh", "-c", "while :; do \"$@\" >/dev/null 2>&1 || sleep 0.2; done",
                                        "flood"] + FLOODER + [RAW, "-s", sock, "generate", "--raw", "-n",
                                                              str(a.flood_tokens), f"{APROMPT} {j}"],
                                       start_new_session=True) for j in range(n)]
            # until the flood fills the pool (or 60 s)
            for _ in range(600):
                st = stats(sock)
                if st["pages_free"] <= max(4, st["pages_total"] // 64) and st["requests_running"] >= 1:
                    break
                time.sleep(0.1)
            runs = []
            for _ in range(a.reps):
                v = victim(sock, a.tokens, a.timeout, kvd.pid)
                if v is None:
                    break
                runs.append(v)
            for p in floods:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait()
            floods = []
            if len(runs) < a.reps:
                print(f"{n:>14} {ttft0 * 1e3:9.1f} {'>' + str(a.timeout) + ' s: starved':>20}")
                time.sleep(1)
                continue
            ttft = statistics.median(r[0] for r in runs)
            rate = statistics.median(r[1] for r in runs)
            cpu = statistics.median(r[2] for r in runs)
            bound = 2 * ttft0 + STEP_MS / 1e3
            fair = rate0 / 2
            print(f"{n:>14} {ttft0 * 1e3:9.1f} {ttft * 1e3:9.1f} {bound * 1e3:9.1f} {rate0:10.1f} "
                  f"{rate:7.1f} {fair:10.1f} {rate / fair:6.2f} {cpu / (cpu0 / 2):9.2f}")
            time.sleep(1)  # the flood's requests cancelled, its pages freed
    finally:
        for p in floods:
            os.killpg(p.pid, signal.SIGKILL)
        kvd.send_signal(signal.SIGTERM)
        try:
            kvd.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kvd.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
