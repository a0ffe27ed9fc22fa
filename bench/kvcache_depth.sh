#!/usr/bin/env bash
# bench/kvcache_depth.sh — what the KV cache's element type does to a long
# single-stream decode: kvd_bench's decode at depth D (default 8192, K/V of
# the first D - 1 positions written straight into the pages: --fast-depth) on
# the Llama 3.2 1B shape (scripts/gen_shapes.py, Q8_0 weights, written on the
# first run), for caches f16, bf16, q8_0 and q4_0 in alternating rounds, so
# that load from other programs falls on every type alike. Prints per type
# the best tokens/s of the rounds with their median and spread, the same
# for CPU milliseconds per token (the process's CPU time: with one thread
# the figure least moved by other load), and each type's ratio to bf16 by
# both (best against best: other load only ever adds time). --model
# ~/.cache/kvd/shapes/llama3.2-1b-attn.Q8_0.gguf (the 1B's attention on a
# narrow residual stream) measures the cache's cost without the weights'. With --before PATH, a second kvd_bench (say, an older build) runs
# beside it in the same rounds, and its figures and the after/before ratios
# are printed too.
#
#   bench/kvcache_depth.sh [--depth D] [--tokens T] [--rounds R] [--threads N]
#                          [--types "f16 bf16 q8_0 q4_0"] [--model M] [--before PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
DEPTH=8192 TOKENS=16 ROUNDS=3 THREADS=1 TYPES="f16 bf16 q8_0 q4_0" MODEL="" BEFORE=""
while [ $# -gt 0 ]; do
	case "$1" in
	--depth) DEPTH=$2; shift 2 ;;
	--tokens) TOKENS=$2; shift 2 ;;
	--rounds) ROUNDS=$2; shift 2 ;;
	--threads) THREADS=$2; shift 2 ;;
	--types) TYPES=$2; shift 2 ;;
	--model) MODEL=$2; shift 2 ;;
	--before) BEFORE=$2; shift 2 ;;
	*) echo "usage: see the top of $0" >&2; exit 2 ;;
	esac
done
BENCH=build/bench/kvd_bench
[ -x "$BENCH" ] || make -s "$BENCH"
if [ -z "$MODEL" ]; then
	PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
	MODEL=$("$PY" scripts/gen_shapes.py --only llama3.2-1b --types q8_0 | tail -n 1)
fi
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
BINS="after=$BENCH"; [ -n "$BEFORE" ] && BINS="before=$BEFORE $BINS"
echo "kvcache_depth: $(basename "$MODEL"), depth $DEPTH, $TOKENS tokens, $THREADS thread(s), $ROUNDS rounds, $(date -u +%FT%TZ)"
for r in $(seq "$ROUNDS"); do
	for t in $TYPES; do
		for b in $BINS; do
			name=${b%%=*} bin=${b#*=}
			line=$("$bin" --model "$MODEL" --threads "$THREADS" --cache-type "$t" --fast-depth decode \
				--depth "$DEPTH" --tokens "$TOKENS" 2>>"$T/err") || { cat "$T/err" >&2; exit 1; }
			echo "$name $line" >>"$T/res"
			echo "round $r $name $line" >&2
		done
	done
done
python3 - "$T/res" "$TYPES" <<'PY'
import json, statistics, sys
rows = {}
for l in open(sys.argv[1]):
    name, js = l.split(" ", 1)
    d = json.loads(js)
    cpu = d.get("cpu_seconds")
    rows.setdefault((name, d["cache_type"]), []).append(
        (d["tokens_per_s"], 1000.0 * cpu / d["tokens"] if cpu is not None else float("nan")))
types = sys.argv[2].split()
names = sorted({n for n, _ in rows}, key=lambda n: n != "before")
med = {}
for n in names:
    for t in types:
        v = rows.get((n, t))
        if not v:
            continue
        tps = [x for x, _ in v]; cms = [y for _, y in v]
        # the best round: other load only ever adds time
        med[n, t] = (max(tps), min(cms))
        print(f"{n:6} {t:5} tokens/s best {max(tps):8.3f} (median {statistics.median(tps):.3f}, spread "
              f"{min(tps):.3f} .. {max(tps):.3f})  cpu ms/token best {min(cms):7.1f} (median "
              f"{statistics.median(cms):.1f}, spread {min(cms):.1f} .. {max(cms):.1f})")
for n in names:
    if (n, "bf16") not in med:
        continue
    for t in types:
        if t != "bf16" and (n, t) in med:
            print(f"{n:6} {t}/bf16: tokens/s x{med[n, t][0] / med[n, 'bf16'][0]:.3f}, "
                  f"by cpu time x{med[n, 'bf16'][1] / med[n, t][1]:.3f}")
if "before" in names:
    for t in types:
        if ("before", t) in med and ("after", t) in med:
            print(f"after/before {t}: tokens/s x{med['after', t][0] / med['before', t][0]:.3f}, "
                  f"by cpu time x{med['before', t][1] / med['after', t][1]:.3f}")
PY
