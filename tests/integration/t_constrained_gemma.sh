#!/usr/bin/env bash
# tests/integration/t_constrained_gemma.sh — structured output on Gemma 3
# 270M (a 262,144-token vocabulary: the masks' worst case), when its file is
# installed (scripts/setup --model gemma3-270m; about 240 MB, so make test
# does not fetch it: without it this test is a stated skip):
#  - a handful of the JSON Schemas of t_constrained.sh, greedy and seeded
#    (temperature 0.7, top-k 40: the seeded draws take the checked top-k
#    path wherever every candidate is allowed, the mask elsewhere), all at
#    once: every output reported complete parses and validates with
#    Python's jsonschema, a cut one is reported as cut;
#  - the same seeded request twice gives the same output;
#  - a regex and a choice list are honoured;
#  - tool calls through kvd-http and the official openai package (the
#    generic tool format in Gemma's turns, checked against its reference
#    rendering): tool_choice named and required (also with
#    parallel_tool_calls: one or more calls), streamed and not, arguments
#    that validate, a round trip from the prefix cache, and each family's
#    call shape parsed with auto.
source "$(dirname "$0")/lib.sh"
need_bins
VPY=$ROOT/.venv/bin/python
SCHEMAS=$ROOT/tests/integration/schemas
GEMMA=$ROOT/models/gemma-3-270m-q4_k_m.gguf
[ -f "$GEMMA" ] || skip "$GEMMA missing (scripts/setup --model gemma3-270m fetches it; make test does not)"
"$VPY" -c 'import jsonschema' 2>/dev/null || skip "jsonschema not in .venv (scripts/setup installs it)"
MAXT=60

S=$T/kvd.sock
start_kvd gemma "$S" --model "$GEMMA" --pool-size 256M --threads 2
kvctl() { "$KVCTL" --socket "$S" "$@"; }

NAMES=(person sentiment yes_no_answer rating weather_tool_args enum_top_level)
JOBS=()
for n in "${NAMES[@]}"; do
	for mode in greedy seeded; do
		if [ $mode = greedy ]; then opts=(--temperature 0); else opts=(--temperature 0.7 --seed 5); fi
		( kvctl generate "${opts[@]}" --max-tokens $MAXT --json-schema "$SCHEMAS/$n.json" \
			"Reply with JSON only. Task: fill in a $n record." >"$T/$n.$mode.out" 2>"$T/$n.$mode.err"
		  echo $? >"$T/$n.$mode.rc" ) &
		JOBS+=($!)
	done
done
wait "${JOBS[@]}"
"$VPY" "$ROOT/tests/integration/lib/validate_json.py" "$SCHEMAS" "$T" --need-half "${NAMES[@]}" ||
	fail "a constrained output does not validate"
ok "Gemma 3: ${#NAMES[@]} JSON Schemas, greedy and seeded: every complete output validates"

again=$(kvctl generate --temperature 0.7 --seed 5 --max-tokens $MAXT --json-schema "$SCHEMAS/person.json" \
	"Reply with JSON only. Task: fill in a person record." 2>/dev/null)
[ "$again" = "$(cat "$T/person.seeded.out")" ] || fail "the same seeded request gave another output: '$again'"
ok "Gemma 3: a seeded constrained request repeats exactly"

out=$(kvctl generate --temperature 0.9 --seed 3 --max-tokens 20 --regex '[0-9]{3}-[0-9]{4}' "A phone number:") ||
	fail "regex exit $?"
[[ "$out" =~ ^[0-9]{3}-[0-9]{4}$ ]] || fail "regex output '$out'"
out=$(kvctl generate --temperature 1 --seed 2 --max-tokens 10 --choice 'red,green,blue "sky"' "A colour?") ||
	fail "choice exit $?"
case "$out" in red|green|'blue "sky"') ;; *) fail "choice output '$out'" ;; esac
ok "Gemma 3: regex '[0-9]{3}-[0-9]{4}' and a choice list honoured"
# tools through kvd-http and the openai package (http_tools_family.py gemma):
# the generic format rendered in Gemma's turns, named and required (one call,
# and one or more with parallel_tool_calls) constrained, streamed and not, a
# round trip from the prefix cache, every family's call shape parsed (auto)
HTTPD=${KVD_HTTP:-$ROOT/$BUILD/bin/kvd-http}
if [ -x "$HTTPD" ] && "$VPY" -c 'import openai' 2>/dev/null; then
	start_http http --kvd-socket "$S"
	KVD_SOCKET=$S timeout 300 "$VPY" "$ROOT/tests/integration/http_tools_family.py" "$B" gemma "$KVCTL" ||
		fail "tool calls on Gemma 3 (http_tools_family.py gemma)"
	kill -TERM "$HTTP_PID"
	wait "$HTTP_PID"
	ok "Gemma 3: tools through the openai package — named, required, parallel, streamed, a round trip, auto"
else
	echo "SKIP (part): tool calls through kvd-http: kvd-http not built or openai not in .venv"
fi
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
