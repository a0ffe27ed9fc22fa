#!/usr/bin/env python3
"""bench/shapes.py — kvd against mainline llama.cpp and ik_llama.cpp on
models of deployment size, with a read-bandwidth probe in the same window.

The files are scripts/gen_shapes.py's random-weight models of real shapes
(Llama 3.2 1B and 3B, ...), Q4_K_M (llama-quantize) and Q8_0: weights that
no cache holds, so a decode step streams them from DRAM. Figures, each run
by kvd (build/bench/kvd_bench), then mainline llama.cpp, then ik_llama.cpp,
alternating, --reps times:

  prefill 512      a 512-token prompt (kvd_bench prefill; llama-bench -p 512 -n 0)
  decode d128      64 tokens after a 128-token context (kvd_bench decode;
                   mainline llama-bench -p 0 -n 64 -d 128; ik_llama.cpp's
                   llama-bench has no -d, its -gp 128,64 times the same)
  decode d8192 T   32 tokens after an 8192-token context, K/V of type T
                   (f16, bf16 — kvd only —, q8_0; kvd_bench --fast-depth, the
                   peers with -fa 1 -ctk T -ctv T): only for the files that
                   --depth-files names (default: the 1B shape), as the peers
                   prefill the 8192 tokens first, each time
  32 seqs          32 sequences of 128-token prompts decoding 16 tokens
                   together, aggregate tokens/s (kvd_bench batch;
                   llama-batched-bench -npp 128 -ntg 16 -npl 32, its S_TG)

In each round of a decode figure, kvd_bench --probe measures the machine's
read bandwidth (as `kvd_bench read`: 2 threads, 1 GiB, best of 5) just
before and just after its timed steps, in the same process: each decode
figure is printed with the bytes kvd reads per step times its tokens/s, as
GB/s and as a fraction of the mean of the two probes. This host's
bandwidth moves by half within seconds (other guests' traffic), so a round
whose two probes differ by more than a tenth is unsteady: the fraction is
the median over the steady rounds where there are any (how many is
printed), else over all. A peer that is absent (not built: no
network where its source would come from) is said so once, and its columns
are left out. Each figure is the median of its rounds; the spread (min..max)
is printed beside it. Raw results go to bench/results/shapes-<time>.json.

Before each round of prefill 512 and 32 seqs, `kvd_bench peak` measures the
machine's compute ceilings on the same threads (multiply-adds per second of
the int8 instruction the kernel set is built on: AVX-512 VNNI's vpdpbusd,
else AVX2's vpmaddubsw; and, on AVX2, the vpmaddubsw + vpmaddwd pair an
exact int8 dot needs where every product vector is widened, as q8_0's
is): those rows print each program's multiply-adds per second (its
tokens/s times kvd_bench's macs_per_token for the model: the same work
whichever program does it) as a fraction of the int8 peak.

  bench/shapes.py --files F1,F2 [--mainline DIR] [--ik DIR] [--threads 2]
                  [--reps 2] [--deep-reps N] [--only FIGURES] [--depth-files SUBSTR]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KVD = os.path.join(ROOT, os.environ.get("KVD_BUILD", "build"), "bench", "kvd_bench")
SEQS, SEQ_PROMPT, SEQ_TOKENS = 32, 128, 16
DEC, DEEP, DEEP_TOKENS = 64, 8192, 32


def figures(deep):
    """(name, kvd_bench args, mainline spec, ik spec); a spec is (kind, args) or None."""
    figs = [
        ("prefill 512", ["prefill", "--tokens", "512"],
         ("bench", ["-p", "512", "-n", "0"]), ("bench", ["-p", "512", "-n", "0"])),
        ("decode d128", ["decode", "--depth", "128", "--tokens", str(DEC)],
         ("bench", ["-p", "0", "-n", str(DEC), "-d", "128"]),
         ("bench", ["-p", "0", "-n", "0", "-gp", "128,%d" % DEC])),
    ]
    if deep:
        for ct in ("f16", "bf16", "q8_0"):
            cache = ["-fa", "1", "-ctk", ct, "-ctv", ct]
            peer = ct != "bf16"  # llama.cpp's bf16 cache is its slow one; kvd's only
            figs.append(("decode d%d %s" % (DEEP, ct),
                         ["--cache-type", ct, "--fast-depth", "decode", "--depth", str(DEEP), "--tokens",
                          str(DEEP_TOKENS)],
                         ("bench", ["-p", "0", "-n", str(DEEP_TOKENS), "-d", str(DEEP)] + cache) if peer else None,
                         ("bench", ["-p", "0", "-n", "0", "-gp", "%d,%d" % (DEEP, DEEP_TOKENS)] + cache)
                         if peer else None))
    bat = ["-npp", str(SEQ_PROMPT), "-ntg", str(SEQ_TOKENS), "-npl", str(SEQS),
           "-c", str(SEQS * (SEQ_PROMPT + SEQ_TOKENS) + 256)]
    figs.append(("32 seqs", ["batch", "--seqs", str(SEQS), "--depth", str(SEQ_PROMPT), "--tokens", str(SEQ_TOKENS)],
                 ("batched", bat), ("batched", bat)))
    return figs


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("%s failed (status %d): %s" % (" ".join(cmd), p.returncode, p.stderr[-1500:]))
    return p


def run_kvd(model, threads, args):
    cmd = [KVD, "--model", model, "--threads", str(threads)] + args
    return json.loads(run(cmd).stdout.strip().splitlines()[-1]), cmd


def peak(threads):
    return json.loads(run([KVD, "--threads", str(threads), "peak"]).stdout)


def run_peer(bindir, spec, model, threads):
    kind, args = spec
    if kind == "bench":
        cmd = [os.path.join(bindir, "llama-bench"), "-m", model, "-t", str(threads), "-r", "1", "-o", "json"] + args
        rows = json.loads(run(cmd).stdout)
        # the one test asked for: the row that generated or prefilled tokens
        rows = [r for r in rows if r.get("n_gen", 0) > 0 or r.get("n_prompt", 0) > 0]
        return rows[-1]["avg_ts"], cmd
    cmd = [os.path.abspath(os.path.join(bindir, "llama-batched-bench")), "-m", os.path.abspath(model), "-t", str(threads), "-tb", str(threads),
           "--output-format", "jsonl"] + args
    # ik_llama.cpp's batched bench writes llama.log into its working directory
    with tempfile.TemporaryDirectory() as scratch:
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=scratch)
    out = p.stdout + "\n" + p.stderr
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{") and "speed_tg" in line:
            return json.loads(line)["speed_tg"], cmd
    # ik_llama.cpp prints only its table: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | ...
    for line in out.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) >= 8 and all(re.fullmatch(r"[0-9.]+", c) for c in cols[:8]) and \
                int(cols[0]) == SEQ_PROMPT and int(cols[2]) == SEQS:
            return float(cols[7]), cmd
    raise RuntimeError("%s printed no result (status %d): %s" % (cmd[0], p.returncode, out[-1500:]))


def spread(v):
    return "%.1f..%.1f" % (min(v), max(v)) if v else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", required=True, help="comma-separated GGUF files")
    ap.add_argument("--mainline", default="", help="directory of mainline llama.cpp's llama-bench (empty: absent)")
    ap.add_argument("--ik", default="", help="directory of ik_llama.cpp's llama-bench (empty: absent)")
    ap.add_argument("--absent", action="append", default=[], help="NAME=REASON, printed for an absent peer")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--deep-reps", type=int, default=0, help="rounds of the d8192 rows (default: --reps)")
    ap.add_argument("--only", default="", help="comma-separated substrings of figure names")
    ap.add_argument("--depth-files", default="llama3.2-1b.", help="substring of the files that get the d8192 rows")
    a = ap.parse_args()
    if not os.path.exists(KVD):
        sys.exit("shapes: %s is missing: run make first" % KVD)
    peers = [(n, d) for n, d in (("mainline", a.mainline), ("ik", a.ik)) if d]
    for n, d in peers:
        if not os.path.exists(os.path.join(d, "llama-bench")):
            sys.exit("shapes: %s/llama-bench is missing" % d)
    for x in a.absent:
        n, _, why = x.partition("=")
        print("shapes: %s is absent (%s): its columns are left out" % (n, why or "no reason given"))
    results = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "threads": a.threads, "reps": a.reps,
               "load_before": os.getloadavg(),
               "argv": sys.argv, "peers": dict(peers), "figures": []}
    rows = []
    for model in a.files.split(","):
        name = os.path.basename(model)
        for fig, kargs, *specs in figures(a.depth_files in name):
            if a.only and not any(o in fig for o in a.only.split(",")):
                continue
            dec = fig.startswith("decode")
            kv, bw, eff, pv = [], [], [], {n: [] for n, _ in peers}
            pk, macs = [], []
            cmds = {}
            reps = a.deep_reps if a.deep_reps and fig.startswith("decode d%d" % DEEP) else a.reps
            for _ in range(reps):
                if not dec:
                    pk.append(peak(a.threads))
                r, cmds["kvd"] = run_kvd(model, a.threads, (["--probe"] if dec else []) + kargs)
                if dec:
                    bw.append((r["probe_before_gb_per_s"], r["probe_after_gb_per_s"]))
                kv.append(r["tokens_per_s"])
                macs.append(r["macs_per_token"])
                if dec:
                    eff.append(r["tokens_per_s"] * r["bytes_per_step"] / 1e9)
                for (n, d), spec in zip((("mainline", a.mainline), ("ik", a.ik)), specs):
                    if not d or spec is None:
                        continue
                    v, cmds[n] = run_peer(d, spec, model, a.threads)
                    pv[n].append(v)
            row = {"file": name, "figure": fig, "kvd": kv, "kvd_median": statistics.median(kv), "cmds": cmds}
            for n in pv:
                if pv[n]:
                    row[n] = pv[n]
                    row[n + "_median"] = statistics.median(pv[n])
                    row["kvd/" + n] = row["kvd_median"] / row[n + "_median"]
            if pk:
                # each round's multiply-adds against the peak just before it
                row["peak"] = pk
                row["macs_per_token"] = macs[0]
                i8 = [p["int8_gmacs"] for p in pk]
                row["int8_kind"] = pk[0]["int8_kind"]
                row["int8_peak_gmacs"] = statistics.median(i8)
                row["kvd_gmacs"] = statistics.median(v * m / 1e9 for v, m in zip(kv, macs))
                row["of_int8_peak"] = statistics.median(v * m / 1e9 / p for v, m, p in zip(kv, macs, i8))
                if "int8_maddubs_maddwd_gmacs" in pk[0] and row["int8_kind"] == "maddubs":
                    row["widened_pair_gmacs"] = statistics.median(p["int8_maddubs_maddwd_gmacs"] for p in pk)
                for n in pv:
                    if pv[n]:
                        row[n + "_of_int8_peak"] = statistics.median(
                            v * macs[0] / 1e9 / p for v, p in zip(pv[n], i8))
            if dec:
                row["read_gb_per_s"] = bw
                row["kvd_gb_per_s"] = eff
                # each round's reads against the mean of its two probes;
                # the steady rounds (probes within a tenth) where there are any
                steady = [abs(b0 - b1) <= 0.1 * (b0 + b1) / 2 for b0, b1 in bw]
                ratios = [e / ((b0 + b1) / 2) for e, (b0, b1) in zip(eff, bw)]
                row["steady_rounds"] = sum(steady)
                row["of_probe"] = statistics.median([x for x, st in zip(ratios, steady) if st] or ratios)
            row["load_avg_1min"] = os.getloadavg()[0]
            rows.append(row)
            results["figures"].append(row)
            line = "%-24s %-16s kvd %7.1f (%s)" % (name, fig, row["kvd_median"], spread(kv))
            for n, _ in peers:
                if n + "_median" in row:
                    line += "  %s %7.1f (%s) x%.2f" % (n, row[n + "_median"], spread(pv[n]), row["kvd/" + n])
            if dec:
                line += "  | kvd reads %.1f GB/s, probes %s GB/s: %.0f%% (%d of %d rounds steady)" % (
                    statistics.median(eff), spread([x for b in bw for x in b]), 100 * row["of_probe"],
                    row["steady_rounds"], len(bw))
            if pk:
                line += "  | kvd %.0f GMAC/s, int8 peak (%s) %s: %.0f%%" % (
                    row["kvd_gmacs"], row["int8_kind"], spread(i8), 100 * row["of_int8_peak"])
                for n, _ in peers:
                    if n + "_of_int8_peak" in row:
                        line += ", %s %.0f%%" % (n, 100 * row[n + "_of_int8_peak"])
                if "widened_pair_gmacs" in row:
                    line += " (maddubs+maddwd pair %.0f)" % row["widened_pair_gmacs"]
            print(line + "  (load %.1f)" % row["load_avg_1min"], flush=True)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    path = os.path.join(ROOT, "bench", "results", "shapes-" + time.strftime("%Y%m%d-%H%M%S") + ".json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    if rows:
        print()
        print("tokens/s, %d threads, median of %d alternating rounds (kvd, mainline, ik_llama.cpp); "
              "decode rows: kvd's weight+cache reads per second over the read probes just before and after its steps; "
              "prefill and 32 seqs: multiply-adds per second over the int8 peak of the same round"
              % (a.threads, a.reps))
        print("load average (1 min) during the rows: %.1f..%.1f" % (min(r["load_avg_1min"] for r in rows),
                                                                    max(r["load_avg_1min"] for r in rows)))
        head = "| file | figure | kvd |" + "".join(" %s | kvd / %s |" % (n, n) for n, _ in peers) + \
            " reads / probe | MAC/s / int8 peak (kvd%s) |" % "".join(", " + n for n, _ in peers)
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for r in rows:
            s = "| %s | %s | %.1f |" % (r["file"], r["figure"], r["kvd_median"])
            for n, _ in peers:
                s += (" %.1f | %.2f× |" % (r[n + "_median"], r["kvd/" + n])) if n + "_median" in r else " | |"
            s += (" %.0f %% |" % (100 * r["of_probe"])) if "of_probe" in r else " |"
            if "of_int8_peak" in r:
                s += " " + ", ".join(["%.0f %%" % (100 * r["of_int8_peak"])] +
                                     ["%.0f %%" % (100 * r[n + "_of_int8_peak"]) for n, _ in peers
                                      if n + "_of_int8_peak" in r]) + " |"
            else:
                s += " |"
            print(s)
    print("raw results: %s" % os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
