#!/usr/bin/env python3
"""tests/http/bench.py — kvd-http's overhead, measured against kvctl in the same run.

Usage: bench.py HTTP_BASE KVCTL KVD_SOCKET [--runs N] [--tokens N] [--streams N] [--key KEY]

  1. One streaming client: the same greedy raw-prompt request (N tokens)
     alternately through kvd-http (SSE, timed by this client from sending
     the request to "data: [DONE]") and through `kvctl generate --json`
     (timed by kvd itself, arrival to end: kvctl's own overhead is not even
     counted, so the comparison is conservative for kvd-http). Medians of
     --runs each; ratio = HTTP / kvctl tokens/s.
  2. --streams concurrent streams through kvd-http vs the same number of
     concurrent `kvctl generate` processes, in alternating rounds: total
     tokens / wall time; both must produce the same number of tokens.
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import threading
import time
import urllib.parse

ap = argparse.ArgumentParser()
ap.add_argument("base")
ap.add_argument("kvctl")
ap.add_argument("socket")
ap.add_argument("--runs", type=int, default=5)
ap.add_argument("--tokens", type=int, default=256)
ap.add_argument("--streams", type=int, default=64)
ap.add_argument("--stream-tokens", type=int, default=128)
ap.add_argument("--conc-runs", type=int, default=3)
ap.add_argument("--http-pid", type=int, default=0, help="kvd-http's pid: report its CPU time per token")
ap.add_argument("--kvd-pid", type=int, default=0, help="kvd's pid: report kvd-http's CPU time relative to kvd's")
ap.add_argument("--key", default="")
a = ap.parse_args()
u = urllib.parse.urlparse(a.base)
env = dict(os.environ, KVD_SOCKET=a.socket)
PROMPT = "Once upon a time"


def cpu_s(pid):
    """user + system CPU seconds of a process (0 when not given)."""
    if not pid:
        return 0.0
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


cpu = {"http": 0.0, "kvd": 0.0, "tokens": 0}


def http_stream_counted(prompt, n):
    h0, k0 = cpu_s(a.http_pid), cpu_s(a.kvd_pid)
    r = http_stream(prompt, n)
    cpu["http"] += cpu_s(a.http_pid) - h0
    cpu["kvd"] += cpu_s(a.kvd_pid) - k0
    cpu["tokens"] += r[0]
    return r


def http_stream(prompt, n):
    """(tokens, seconds, text) of one streamed completion."""
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    hdr = {"Content-Type": "application/json"}
    if a.key:
        hdr["Authorization"] = "Bearer " + a.key
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, hdr)
    r = c.getresponse()
    assert r.status == 200, r.read()
    text, toks, buf = [], None, b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            d = ev[6:]
            if d == b"[DONE]":
                continue
            o = json.loads(d)
            if o.get("usage"):
                toks = o["usage"]["completion_tokens"]
            for ch in o["choices"]:
                text.append(ch["text"])
    dt = time.perf_counter() - t0
    c.close()
    return toks, dt, "".join(text)


def kvctl(prompt, n):
    t0 = time.perf_counter()
    out = subprocess.run([a.kvctl, "generate", "--raw", "--json", "--temperature", "0", "--max-tokens", str(n), prompt],
                         env=env, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    o = json.loads(out)
    return o["generated_tokens"], o["total_ms"] / 1000, wall, o["text"]


# warm-up (page cache, prefix cache for the prompt)
http_stream(PROMPT, 8)
kvctl(PROMPT, 8)

h_rates, k_rates, k_walls = [], [], []
for i in range(a.runs):
    ht, hs, htext = http_stream_counted(PROMPT, a.tokens)
    kt, ks, kw, ktext = kvctl(PROMPT, a.tokens)
    assert htext == ktext and ht == kt, (ht, kt)
    h_rates.append(ht / hs)
    k_rates.append(kt / ks)
    k_walls.append(kt / kw)
h, k = statistics.median(h_rates), statistics.median(k_rates)
print(f"one stream, {a.tokens} tokens, median of {a.runs}:")
print(f"  kvd-http (client wall, request -> [DONE]):  {h:7.1f} tokens/s   runs {' '.join(f'{x:.1f}' for x in h_rates)}")
print(f"  kvctl generate (kvd arrival -> end):        {k:7.1f} tokens/s   runs {' '.join(f'{x:.1f}' for x in k_rates)}")
print(f"  kvctl generate (process wall, for reference): {statistics.median(k_walls):5.1f} tokens/s")
print(f"  ratio kvd-http / kvctl: {h / k:.3f}")
if a.http_pid:
    print(f"  kvd-http CPU: {cpu['http'] * 1e6 / cpu['tokens']:.0f} us per token"
          + (f" = {100 * cpu['http'] / cpu['kvd']:.2f} % of kvd's CPU time" if a.kvd_pid and cpu["kvd"] else ""))

# concurrent streams: HTTP and kvctl rounds alternate, so load from other
# programs on the machine falls on both alike
N, T = a.streams, a.stream_tokens
prompts = [f"Story number {i}: once upon a time, in a town called {chr(65 + i % 26)}{i}," for i in range(N)]


def http_round():
    res = [None] * N

    def one(i):
        res[i] = http_stream(prompts[i], T)

    h0, k0 = cpu_s(a.http_pid), cpu_s(a.kvd_pid)
    t0 = time.perf_counter()
    th = [threading.Thread(target=one, args=(i,)) for i in range(N)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    cpu["chttp"] = cpu.get("chttp", 0) + cpu_s(a.http_pid) - h0
    cpu["ckvd"] = cpu.get("ckvd", 0) + cpu_s(a.kvd_pid) - k0
    assert all(r and r[0] and r[0] > 0 for r in res), "a stream produced nothing"
    per = sorted(r[0] / r[1] for r in res)
    return sum(r[0] for r in res), wall, per


def kvctl_round():
    t0 = time.perf_counter()
    procs = [subprocess.Popen([a.kvctl, "generate", "--raw", "--json", "--temperature", "0", "--max-tokens", str(T), p],
                              env=env, stdout=subprocess.PIPE, text=True) for p in prompts]
    tot = sum(json.loads(p.communicate()[0])["generated_tokens"] for p in procs)
    return tot, time.perf_counter() - t0


# untimed: every prompt's pages into the prefix cache, so no round is the cold one
for i in range(N):
    http_stream(prompts[i], 1)
hr, kr = [], []
print(f"{N} concurrent streams, {T} tokens each, {a.conc_runs} alternating rounds:")
for i in range(a.conc_runs):
    ht, hw, per = http_round()
    kt, kw = kvctl_round()
    assert ht == kt, (ht, kt)
    cpu["ctokens"] = cpu.get("ctokens", 0) + ht
    hr.append(ht / hw)
    kr.append(kt / kw)
    print(f"  round {i + 1}: kvd-http {ht} tokens in {hw:.2f} s = {ht / hw:.1f} tokens/s "
          f"(per stream min {per[0]:.2f} median {per[N // 2]:.2f}); "
          f"{N} kvctl processes {kt / kw:.1f} tokens/s")
h, k = statistics.median(hr), statistics.median(kr)
print(f"  median: kvd-http {h:.1f} tokens/s, kvctl {k:.1f} tokens/s, ratio {h / k:.3f}")
if a.http_pid:
    print(f"  kvd-http CPU: {cpu['chttp'] * 1e6 / cpu['ctokens']:.0f} us per token"
          + (f" = {100 * cpu['chttp'] / cpu['ckvd']:.2f} % of kvd's CPU time" if a.kvd_pid and cpu["ckvd"] else ""))
