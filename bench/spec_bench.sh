#!/usr/bin/env bash
# bench/spec_bench.sh — what speculative decoding by prompt lookup buys a
# single stream: decode tokens/s with [speculative] mode = off and = lookup,
# two daemons on the same binary and model, requests sent one at a time and
# alternating between them (off first in odd rounds, lookup first in even
# ones, so drift in the machine's load hits both), on three tasks:
#   quote   — repeat a given paragraph word for word (input-grounded)
#   rewrite — rewrite a given C function with one change (input-grounded)
#   story   — a story from a short prompt (free text)
# Prints per task the median decode tokens/s of each mode (kvctl's
# tokens_per_s: generated tokens over the time from the first to the last),
# the lookup/off ratio, and whether the outputs were identical (they must be).
#   bench/spec_bench.sh [ROUNDS [MAX_TOKENS [THREADS]]]   (default 5, 200, 2)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}; MAXT=${2:-200}; THREADS=${3:-2}
KVD=build/bin/kvd; KVCTL=build/bin/kvctl; RAW=build/tests/kvd_raw
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
T=$(mktemp -d); PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait; rm -rf "$T"' EXIT
for m in off lookup; do
	"$KVD" --config /dev/null --socket "$T/$m.sock" --model "$MODEL" --pool-size 256M --threads "$THREADS" \
		--speculative "$m" 2>"$T/$m.log" &
	PIDS+=($!)
done
for m in off lookup; do
	for i in $(seq 300); do "$RAW" -s "$T/$m.sock" hello >/dev/null 2>&1 && break; sleep 0.1; done
done

# the tasks' prompts, shared with bench/peer_spec.sh
. bench/spec_prompts.sh
one() { # MODE TASK ROUND: append tokens/s to $T/MODE.TASK, the text to $T/MODE.TASK.ROUND
	"$KVCTL" --socket "$T/$1.sock" generate --json --temperature 0 --max-tokens "$MAXT" "${PROMPT[$2]}" >"$T/j"
	python3 - "$T/j" "$T/$1.$2" "$T/$1.$2.$3" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
open(sys.argv[2], "a").write("%s %d\n" % (j["tokens_per_s"], j["generated_tokens"]))
open(sys.argv[3], "w").write(j["text"])
PY
}
for r in $(seq "$ROUNDS"); do
	for task in quote rewrite story; do
		if [ $((r % 2)) = 1 ]; then one off $task $r; one lookup $task $r; else one lookup $task $r; one off $task $r; fi
	done
done
printf '%-8s %12s %12s %8s %9s %s\n' task off_tok/s lookup_tok/s ratio tokens identical
for task in quote rewrite story; do
	same=yes
	for r in $(seq "$ROUNDS"); do cmp -s "$T/off.$task.$r" "$T/lookup.$task.$r" || same=NO; done
	python3 - "$T/off.$task" "$T/lookup.$task" "$task" "$same" <<'PY'
import statistics, sys
def med(p):
    rows = [l.split() for l in open(p)]
    return statistics.median(float(r[0]) for r in rows), int(rows[0][1])
(o, n), (l, _) = med(sys.argv[1]), med(sys.argv[2])
print("%-8s %12.1f %12.1f %7.2fx %9d %s" % (sys.argv[3], o, l, l / o, n, sys.argv[4]))
PY
done
for p in "${PIDS[@]}"; do kill -TERM "$p"; done
wait
PIDS=()
grep -h "speculative decoding:" "$T/lookup.log" || true
