#!/usr/bin/env bash
# bench/peer_spec.sh — speculation by prompt lookup in kvd against llama.cpp's
# own (llama-lookup, an n-gram cache over the prompt and the output), in one
# run, on the tasks of bench/spec_bench.sh (bench/spec_prompts.sh: quote and
# rewrite copy their input, story does not), the default SmolLM2 model,
# greedy, at most MAX_TOKENS tokens. The prompts go in raw, wrapped in the
# model's ChatML turn markers by this script (kvctl generate --raw
# --special), so both programs read the same tokens. Each round runs, per
# task: kvd with [speculative] mode = off and = lookup (two daemons on one
# binary), then llama.cpp without speculation (llama-completion: eval runs
# over eval plus sampling time) and with it (llama-lookup --spec-draft-n-max 8,
# kvd's default draft length: its "decoded N tokens ... speed" line).
# Prints per task the median decode tokens/s of the four, the lookup / off
# ratio of each program, kvd's check that its two outputs are identical, and
# llama-lookup's acceptance.
#
# SPEC_MODE=draft compares draft-model speculation instead: kvd with
# [speculative] mode = draft and llama.cpp's llama-speculative, both given
# SPEC_DRAFT (default models/'s Q4_1) as the draft model of SPEC_MODEL (the
# target; default models/'s Q4_1), e.g. the F16 target made by
# scripts/build-peer --models drafted for by its Q4_1.
#
#   bench/peer_spec.sh [ROUNDS [MAX_TOKENS [THREADS]]]   (default 3, 200, 2)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}; MAXT=${2:-200}; THREADS=${3:-2}
KVD=build/bin/kvd; KVCTL=build/bin/kvctl; RAW=build/tests/kvd_raw
MODEL=${SPEC_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
DRAFT=${SPEC_DRAFT:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
SPEC_MODE=${SPEC_MODE:-lookup}
case $SPEC_MODE in
lookup) PEER_SPEC=llama-lookup ;;
draft) PEER_SPEC=llama-speculative ;;
*) echo "peer_spec: SPEC_MODE must be lookup or draft, not '$SPEC_MODE'" >&2; exit 2 ;;
esac
PEER_BIN=${PEER_BIN:-$HOME/.cache/kvd/peer-${PEER_PY_VERSION:-0.3.36}/build/bin}
for b in "$KVD" "$KVCTL" "$RAW"; do [ -x "$b" ] || { echo "peer_spec: $b is missing: run make first" >&2; exit 1; }; done
PEER=1
for t in $PEER_SPEC llama-completion; do
	if [ ! -x "$PEER_BIN/$t" ]; then
		echo "peer_spec: llama.cpp absent ($PEER_BIN/$t not built: scripts/build-peer builds it): kvd's columns only"
		PEER=0
		break
	fi
done
T=$(mktemp -d); PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait; rm -rf "$T"' EXIT
for m in off lookup; do
	# the "lookup" daemon speculates in SPEC_MODE
	mode=off extra=(); [ $m = lookup ] && mode=$SPEC_MODE
	[ "$mode" = draft ] && extra=(--draft-model "$DRAFT")
	"$KVD" --config /dev/null --socket "$T/$m.sock" --model "$MODEL" --pool-size 256M --threads "$THREADS" \
		--speculative "$mode" "${extra[@]}" 2>"$T/$m.log" &
	PIDS+=($!)
done
for m in off lookup; do
	for i in $(seq 300); do "$RAW" -s "$T/$m.sock" hello >/dev/null 2>&1 && break; sleep 0.1; done
done
. bench/spec_prompts.sh
turn() { printf '<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n' "$1"; }

kvd_one() { # MODE TASK ROUND
	"$KVCTL" --socket "$T/$1.sock" generate --json --raw --special --temperature 0 --max-tokens "$MAXT" \
		"$(turn "${PROMPT[$2]}")" >"$T/j"
	python3 - "$T/j" "$T/kvd-$1.$2" "$T/kvd-$1.$2.$3" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
open(sys.argv[2], "a").write("%s %d\n" % (j["tokens_per_s"], j["generated_tokens"]))
open(sys.argv[3], "w").write(j["text"])
PY
}
peer_one() { # plain|lookup TASK
	local tool=llama-completion extra=(-no-cnv --no-display-prompt)
	[ "$1" = lookup ] && tool=$PEER_SPEC extra=(--spec-draft-n-max 8)
	[ "$1" = lookup ] && [ "$SPEC_MODE" = draft ] && extra+=(-md "$DRAFT" -td "$THREADS")
	# the prompt as it is: llama.cpp expands backslash escapes unless --no-escape
	turn "${PROMPT[$2]}" >"$T/prompt.txt"
	if ! "$PEER_BIN/$tool" -m "$MODEL" -t "$THREADS" -f "$T/prompt.txt" -n "$MAXT" --temp 0 -c 2048 --no-escape \
		"${extra[@]}" </dev/null >"$T/pout" 2>"$T/perr"; then
		echo "peer_spec: $tool failed:" >&2; tail -5 "$T/perr" >&2; exit 1
	fi
	python3 - "$T/perr" "$T/peer-$1.$2" "$1" <<'PY'
import re, sys
t = open(sys.argv[1], errors="replace").read()
if sys.argv[3] == "lookup":
    m = re.search(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds", t)
    d = re.search(r"n_drafted\s*=\s*(\d+)", t); a = re.search(r"n_accept\s*=\s*(\d+)", t)
    if not m:
        sys.exit("peer_spec: no 'decoded' line from the speculating tool")
    n, rate = int(m.group(1)), int(m.group(1)) / float(m.group(2))
    extra = "%s %s" % (d.group(1) if d else "-", a.group(1) if a else "-")
else:
    ev = re.findall(r"\beval time =\s*([0-9.]+) ms /\s*(\d+) runs", t)
    sm = re.findall(r"sampling time =\s*([0-9.]+) ms", t)
    if not ev or not sm:
        sys.exit("peer_spec: no timing lines from llama-completion")
    n = int(ev[-1][1]); rate = n / ((float(ev[-1][0]) + float(sm[-1])) / 1000.0)
    extra = "- -"
open(sys.argv[2], "a").write("%.3f %d %s\n" % (rate, n, extra))
PY
}
TASKS="quote rewrite story"
echo "peer_spec: $SPEC_MODE, $(basename "$MODEL")$([ "$SPEC_MODE" = draft ] && echo " drafted for by $(basename "$DRAFT")"), $ROUNDS rounds, at most $MAXT tokens, $THREADS threads, $(date -u +%FT%TZ)"
for r in $(seq "$ROUNDS"); do
	for task in $TASKS; do
		if [ $((r % 2)) = 1 ]; then kvd_one off $task $r; kvd_one lookup $task $r
		else kvd_one lookup $task $r; kvd_one off $task $r; fi
		if [ "$PEER" = 1 ]; then
			if [ $((r % 2)) = 1 ]; then peer_one plain $task; peer_one lookup $task
			else peer_one lookup $task; peer_one plain $task; fi
		fi
	done
done
printf '%-8s %9s %9s %7s %6s %9s | %9s %9s %7s %6s %s\n' task kvd_off "kvd_$SPEC_MODE" ratio tokens identical \
	llama_off "llama_$SPEC_MODE" ratio tokens "drafted/accepted"
for task in $TASKS; do
	same=yes
	for r in $(seq "$ROUNDS"); do cmp -s "$T/kvd-off.$task.$r" "$T/kvd-lookup.$task.$r" || same=NO; done
	python3 - "$T" "$task" "$same" "$PEER" <<'PY'
import os, statistics, sys
d, task, same, peer = sys.argv[1:]
def med(p):
    rows = [l.split() for l in open(p)]
    return statistics.median(float(r[0]) for r in rows), int(rows[0][1]), rows
(o, n, _), (l, _, _) = med(os.path.join(d, "kvd-off." + task)), med(os.path.join(d, "kvd-lookup." + task))
s = "%-8s %9.1f %9.1f %6.2fx %6d %9s |" % (task, o, l, l / o, n, same)
if peer == "1":
    (po, pn, _), (pl, _, rows) = med(os.path.join(d, "peer-plain." + task)), med(os.path.join(d, "peer-lookup." + task))
    s += " %9.1f %9.1f %6.2fx %6d %s/%s" % (po, pl, pl / po, pn, rows[0][2], rows[0][3])
print(s)
PY
done
for p in "${PIDS[@]}"; do kill -TERM "$p"; done
wait
PIDS=()
grep -h "speculative decoding:" "$T/lookup.log" || true
