#!/usr/bin/env bash
# bench/spec_bench.sh — what speculative decoding buys: decode tokens/s with
# [speculative] mode = off and each mode in $SPEC_MODES (default "lookup
# auto"), one daemon per mode on the same binary and model, requests sent
# one at a time and alternating between them (the order rotates each round,
# so drift in the machine's load hits every mode), on three tasks:
#   quote   — repeat a given paragraph word for word (input-grounded)
#   rewrite — rewrite a given C function with one change (input-grounded)
#   story   — a story from a short prompt (free text)
# Prints per task and mode the median decode tokens/s (kvctl's
# tokens_per_s: generated tokens over the time from the first to the last),
# the median of the per-round mode/off ratios with their range (the
# spread), and whether the outputs were identical to off's (they must be).
# SPEC_MODEL picks the target model, SPEC_DRAFT the draft model of modes
# "draft" and "auto-draft" (auto with that draft model loaded; default:
# models/'s Q4_1), e.g. the F16 target drafted for by its Q4_1:
# SPEC_MODEL=...F16.gguf SPEC_MODES="lookup draft auto-draft".
# With STREAMS=N (default 32; 0: left out) it then runs N requests at once
# per mode and round (the three tasks in turn, SMAX tokens each, default
# 64) and prints the aggregate tokens/s (all generated tokens over the wall
# time from the first request sent to the last answer) and its ratio.
#   bench/spec_bench.sh [ROUNDS [MAX_TOKENS [THREADS]]]   (default 5, 200, 2)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}; MAXT=${2:-200}; THREADS=${3:-2}
MODES=(off ${SPEC_MODES:-lookup auto}); STREAMS=${STREAMS:-32}; SMAX=${SMAX:-64}
KVD=build/bin/kvd; KVCTL=build/bin/kvctl; RAW=build/tests/kvd_raw
MODEL=${SPEC_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
DRAFT=${SPEC_DRAFT:-models/SmolLM2-135M-Instruct.Q4_1.gguf} # the draft model of mode "draft"
T=$(mktemp -d); PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait; rm -rf "$T"' EXIT
for m in "${MODES[@]}"; do
	extra=(); case $m in draft | *-draft) extra=(--draft-model "$DRAFT") ;; esac
	"$KVD" --config /dev/null --socket "$T/$m.sock" --model "$MODEL" --pool-size 256M --threads "$THREADS" \
		--speculative "${m%-draft}" "${extra[@]}" 2>"$T/$m.log" &
	PIDS+=($!)
done
for m in "${MODES[@]}"; do
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
order() { # ROUND: the modes, rotated by the round
	local n=${#MODES[@]} i
	for i in $(seq 0 $((n - 1))); do echo "${MODES[$(( (i + $1) % n ))]}"; done
}
for r in $(seq "$ROUNDS"); do
	for task in quote rewrite story; do
		for m in $(order "$r"); do one "$m" $task $r; done
	done
done
printf '%-8s %-7s %10s %10s %8s %14s %7s %s\n' task mode off_tok/s tok/s ratio "ratio range" tokens identical
for task in quote rewrite story; do
	for m in "${MODES[@]:1}"; do
		same=yes
		for r in $(seq "$ROUNDS"); do cmp -s "$T/off.$task.$r" "$T/$m.$task.$r" || same=NO; done
		python3 - "$T/off.$task" "$T/$m.$task" "$task" "$m" "$same" <<'PY'
import statistics, sys
def rows(p):
    return [(float(a), int(b)) for a, b in (l.split() for l in open(p))]
o, l = rows(sys.argv[1]), rows(sys.argv[2])
ratios = [b[0] / a[0] for a, b in zip(o, l)]
print("%-8s %-7s %10.1f %10.1f %7.2fx %6.2f-%5.2fx %7d %s" % (sys.argv[3], sys.argv[4],
      statistics.median(x for x, _ in o), statistics.median(x for x, _ in l), statistics.median(ratios),
      min(ratios), max(ratios), o[0][1], sys.argv[5]))
PY
	done
done

# ---- STREAMS requests at once: aggregate tokens/s ----
burst() { # MODE ROUND: STREAMS requests at once; appends "TOKENS WALL_S" to $T/MODE.burst
	local m=$1 r=$2 i tasks=(quote rewrite story) jobs=() t0 t1
	t0=$(date +%s.%N)
	for i in $(seq "$STREAMS"); do
		"$KVCTL" --socket "$T/$m.sock" generate --json --temperature 0 --max-tokens "$SMAX" \
			"${PROMPT[${tasks[$((i % 3))]}]} (request $i)" >"$T/$m.b$r.$i" &
		jobs+=($!)
	done
	wait "${jobs[@]}"
	t1=$(date +%s.%N)
	python3 - "$T/$m.burst" "$t0" "$t1" "$T/$m.b$r." "$STREAMS" <<'PY'
import json, sys
n = sum(json.load(open(sys.argv[4] + str(i)))["generated_tokens"] for i in range(1, int(sys.argv[5]) + 1))
open(sys.argv[1], "a").write("%d %.6f\n" % (n, float(sys.argv[3]) - float(sys.argv[2])))
PY
}
if [ "$STREAMS" -gt 0 ]; then
	for r in $(seq "$ROUNDS"); do
		for m in $(order "$r"); do burst "$m" "$r"; done
	done
	printf '%-7s %3s %10s %10s %8s %14s %s\n' mode N off_tok/s tok/s ratio "ratio range" identical
	for m in "${MODES[@]:1}"; do
		same=yes
		for r in $(seq "$ROUNDS"); do
			for i in $(seq "$STREAMS"); do
				cmp -s <(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["text"])' "$T/off.b$r.$i") \
					<(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["text"])' "$T/$m.b$r.$i") || same=NO
			done
		done
		python3 - "$T/off.burst" "$T/$m.burst" "$m" "$STREAMS" "$same" <<'PY'
import statistics, sys
def rates(p):
    return [int(a) / float(b) for a, b in (l.split() for l in open(p))]
o, l = rates(sys.argv[1]), rates(sys.argv[2])
ratios = [b / a for a, b in zip(o, l)]
print("%-7s %3s %10.1f %10.1f %7.2fx %6.2f-%5.2fx %s" % (sys.argv[3], sys.argv[4], statistics.median(o),
      statistics.median(l), statistics.median(ratios), min(ratios), max(ratios), sys.argv[5]))
PY
	done
fi
for p in "${PIDS[@]}"; do kill -TERM "$p"; done
wait
PIDS=()
for m in "${MODES[@]:1}"; do grep -h "speculative decoding:" "$T/$m.log" | sed "s/^/$m: /" || true; done
