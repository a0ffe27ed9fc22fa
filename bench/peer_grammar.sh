#!/usr/bin/env bash
# bench/peer_grammar.sh — what a JSON Schema constraint costs llama.cpp's own
# decode against what it costs kvd's, in one run, on the same models (the
# default SmolLM2, and Gemma 3 270M where scripts/setup --model gemma3-270m
# installed it: a 262k vocabulary, where masks cost most) and the same
# schema: grammar_bench's daemon schema (a title, then a story string), with
# the story's minLength 1000 instead of 4000 (llama.cpp refuses a grammar of
# over about 2000 repetitions), still beyond what the run generates, so the
# constraint never completes early; grammar_bench is given the same file.
#
# llama.cpp: llama-completion (scripts/build-peer) generating TOKENS tokens,
# greedy, from the prompt "1, 2, 3, 4, 5," with --json-schema-file against
# without (--ignore-eos, so both run every token), alternating ROUNDS times;
# a rate is its eval runs over eval time plus sampling time (the grammar's
# work is in the sampler), as its timing lines print them. kvd: the daemon on
# the same model, build/bench/grammar_bench --socket S 1 SCHEMA (one stream, greedy and
# seeded, plain and constrained interleaved, best of 3). Prints each side's
# plain and constrained tokens/s and the constrained / plain ratio.
#
# kvd runs with [speculative] mode = off (SPEC=auto for the default): the
# cost of the constraint alone, as llama-completion does not speculate
# either (a constrained document repeats itself, and lookup drafts would
# make it faster than the plain run). STREAMS=32 adds kvd's 32-stream row.
#
#   bench/peer_grammar.sh [ROUNDS [TOKENS [THREADS]]]   (default 3, 128, 2)
#   KVD_GRAMMAR_MODELS="a.gguf b.gguf" replaces the list of models
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}; TOKENS=${2:-128}; THREADS=${3:-2}
KVD=build/bin/kvd; RAW=build/tests/kvd_raw; GB=build/bench/grammar_bench
PEER_BIN=${PEER_BIN:-$HOME/.cache/kvd/peer-${PEER_PY_VERSION:-0.3.36}/build/bin}
for b in "$KVD" "$RAW" "$GB"; do [ -x "$b" ] || { echo "peer_grammar: $b is missing: run make first" >&2; exit 1; }; done
PEER=1
if [ ! -x "$PEER_BIN/llama-completion" ]; then
	echo "peer_grammar: llama.cpp absent ($PEER_BIN/llama-completion not built: scripts/build-peer builds it): kvd's figures only"
	PEER=0
fi
MODELS=(models/SmolLM2-135M-Instruct.Q4_1.gguf)
if [ -n "${KVD_GRAMMAR_MODELS:-}" ]; then
	read -ra MODELS <<<"$KVD_GRAMMAR_MODELS"
elif [ -f models/gemma-3-270m-q4_k_m.gguf ]; then
	MODELS+=(models/gemma-3-270m-q4_k_m.gguf)
else
	echo "peer_grammar: models/gemma-3-270m-q4_k_m.gguf absent (scripts/setup --model gemma3-270m): SmolLM2 only"
fi
T=$(mktemp -d); PID=
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; wait; rm -rf "$T"' EXIT
# grammar_bench's daemon schema (bench/grammar_bench.c, STORY_SCHEMA), minLength 1000
cat >"$T/schema.json" <<'JSON'
{"type":"object","properties":{"title":{"type":"string","maxLength":40},"story":{"type":"string","minLength":1000}},"required":["title","story"],"additionalProperties":false}
JSON
PROMPT="1, 2, 3, 4, 5,"

peer_rate() { # MODEL [extra args]: prints tokens/s, or fails with llama-completion's last lines
	local m=$1; shift
	if ! "$PEER_BIN/llama-completion" -m "$m" -t "$THREADS" -p "$PROMPT" -n "$TOKENS" --temp 0 --ignore-eos \
		-no-cnv --no-display-prompt -c 1024 "$@" </dev/null >"$T/out" 2>"$T/err"; then
		echo "peer_grammar: llama-completion failed:" >&2; tail -5 "$T/err" >&2; return 1
	fi
	python3 - "$T/err" <<'PY'
import re, sys
t = open(sys.argv[1], errors="replace").read()
ev = re.findall(r"\beval time =\s*([0-9.]+) ms /\s*(\d+) runs", t)
sm = re.findall(r"sampling time =\s*([0-9.]+) ms", t)
if not ev or not sm:
    sys.exit("peer_grammar: no timing lines in llama-completion's output")
ms, n = float(ev[-1][0]), int(ev[-1][1])
print("%.2f" % (n / ((ms + float(sm[-1])) / 1000.0)))
PY
}

for m in "${MODELS[@]}"; do
	name=$(basename "$m")
	echo "== $name, $TOKENS tokens, $THREADS threads, $(date -u +%FT%TZ)"
	if [ "$PEER" = 1 ]; then
		: >"$T/plain"; : >"$T/cons"
		for r in $(seq "$ROUNDS"); do
			p=$(peer_rate "$m"); c=$(peer_rate "$m" --json-schema-file "$T/schema.json")
			echo "$p" >>"$T/plain"; echo "$c" >>"$T/cons"
			echo "  round $r: llama.cpp plain $p, constrained $c tokens/s" >&2
		done
		python3 - "$T/plain" "$T/cons" <<'PY'
import statistics, sys
p = [float(x) for x in open(sys.argv[1])]; c = [float(x) for x in open(sys.argv[2])]
print("  llama.cpp llama-completion: plain %.1f (%.1f..%.1f)  --json-schema %.1f (%.1f..%.1f)  ratio %.3f  (medians)"
      % (statistics.median(p), min(p), max(p), statistics.median(c), min(c), max(c),
         statistics.median(c) / statistics.median(p)))
PY
	fi
	"$KVD" --config /dev/null --socket "$T/kvd.sock" --model "$m" --pool-size 256M --threads "$THREADS" \
		--speculative "${SPEC:-off}" 2>"$T/kvd.log" &
	PID=$!
	for i in $(seq 300); do "$RAW" -s "$T/kvd.sock" hello >/dev/null 2>&1 && break; sleep 0.1; done
	"$GB" --socket "$T/kvd.sock" "${STREAMS:-1}" "$T/schema.json" |
		awk '($1 == 1 || $1 == '"${STREAMS:-1}"') && !seen[$1 " " $2]++ { printf "  kvd grammar_bench, %s stream(s), %s: plain %s  constrained %s  ratio %s  (best of 3)\n", $1, $2, $3, $4, $5 }'
	kill -TERM "$PID"; wait "$PID" || true; PID=
	rm -f "$T/kvd.sock"
done
