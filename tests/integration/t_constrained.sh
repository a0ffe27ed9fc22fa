#!/usr/bin/env bash
# tests/integration/t_constrained.sh — structured output through the real
# daemon, libkvclient and kvctl, on the default model (SmolLM2):
#  - the JSON Schemas in schemas/*.json (the kinds real APIs use), each
#    generated greedy and with a seed: every output kvctl reports complete
#    (exit 0, finish EOS) parses and validates with Python's jsonschema; an
#    output cut by --max-tokens is reported as cut (exit 8, a message);
#  - GBNF, regex, choice and --json-object constraints;
#  - a grammar with a syntax error: exit 4 and "constraint: L:C: ..." on
#    stderr; a schema feature that cannot be honoured: refused by name;
#  - -n 3 forked samples, each valid;
#  - a session turn constrained and the next turn free;
#  - constrained requests preempted in a small pool — swapped out, or
#    dropped and recomputed without a swap file (the parse state must not
#    take the recomputed tokens a second time) — give exactly the outputs
#    they give alone in a big one.
# test-run: long
source "$(dirname "$0")/lib.sh"
need_bins
VPY=$ROOT/.venv/bin/python
SCHEMAS=$ROOT/tests/integration/schemas
[ -f "$REAL_MODEL" ] || skip "$REAL_MODEL missing (scripts/setup)"
"$VPY" -c 'import jsonschema' 2>/dev/null || skip "jsonschema not in .venv (scripts/setup installs it)"
MAXT=80

S=$T/kvd.sock
start_kvd real "$S" --model "$REAL_MODEL" --pool-size 256M --threads 2
kvctl() { "$KVCTL" --socket "$S" "$@"; }

# ---- the schema suite: greedy and seeded, all at once (the daemon batches) ----
JOBS=() # (a bare `wait` would wait for the daemons too)
n_schemas=0
for f in "$SCHEMAS"/*.json; do
	n=$(basename "$f" .json)
	n_schemas=$((n_schemas + 1))
	for mode in greedy seeded; do
		if [ $mode = greedy ]; then opts=(--temperature 0); else opts=(--temperature 0.7 --seed 11); fi
		( kvctl generate "${opts[@]}" --max-tokens $MAXT --json-schema "$f" \
			"Reply with JSON only. Task: fill in a $n record." >"$T/$n.$mode.out" 2>"$T/$n.$mode.err"
		  echo $? >"$T/$n.$mode.rc" ) &
		JOBS+=($!)
	done
done
wait "${JOBS[@]}"
[ "$n_schemas" -ge 30 ] || fail "only $n_schemas schemas in $SCHEMAS"
"$VPY" "$ROOT/tests/integration/lib/validate_json.py" "$SCHEMAS" "$T" --need-fraction 0.8 ||
	fail "a constrained output does not validate"
ok "$n_schemas JSON Schemas, greedy and seeded: every complete output validates with jsonschema"

# the pipeline the help text promises
name=$(kvctl generate --temperature 0 --max-tokens $MAXT --json-schema "$SCHEMAS/person.json" "Invent a person." |
	$PY -c 'import json,sys; print(json.load(sys.stdin)["name"])') || fail "person | .name"
[ -n "$name" ] || fail "no name"
ok "kvctl generate --json-schema person.json ... | .name gives '$name'"

# ---- GBNF, regex, choice, json_object ----
printf '%s\n' 'root ::= "The answer is " ("yes" | "no") "."' >"$T/yn.gbnf"
out=$(kvctl generate --temperature 0 --max-tokens 20 --grammar "$T/yn.gbnf" "Is water wet?") || fail "gbnf exit $?"
[[ "$out" =~ ^The\ answer\ is\ (yes|no)\.$ ]] || fail "gbnf output '$out'"
out=$(kvctl generate --temperature 0.9 --seed 3 --max-tokens 20 --regex '[0-9]{3}-[0-9]{4}' "A phone number:") ||
	fail "regex exit $?"
[[ "$out" =~ ^[0-9]{3}-[0-9]{4}$ ]] || fail "regex output '$out'"
for seed in 1 2 3; do
	out=$(kvctl generate --temperature 1 --seed $seed --max-tokens 10 --choice 'red,green,blue "sky"' "A colour?") ||
		fail "choice exit $?"
	case "$out" in red|green|'blue "sky"') ;; *) fail "choice output '$out'" ;; esac
done
out=$(kvctl generate --temperature 0 --max-tokens $MAXT --json-object "Describe a cat as a JSON object." 2>/dev/null)
rc=$?
if [ $rc = 0 ]; then
	printf '%s' "$out" | $PY -c 'import json,sys; d=json.load(sys.stdin); assert isinstance(d, dict)' ||
		fail "--json-object output is not an object: $out"
else
	[ $rc = 8 ] || fail "--json-object exit $rc"
fi
ok "GBNF, regex, choice and json_object outputs match"

# ---- errors ----
printf 'root ::= "a" (\n' >"$T/bad.gbnf"
kvctl generate --max-tokens 5 --grammar "$T/bad.gbnf" "x" >"$T/bad.out" 2>"$T/bad.err"
rc=$?
[ $rc = 4 ] || fail "a bad grammar gave exit $rc"
grep -Eq 'constraint: [0-9]+:[0-9]+: ' "$T/bad.err" || fail "no 'constraint: L:C:' message: $(cat "$T/bad.err")"
[ ! -s "$T/bad.out" ] || fail "a bad grammar printed output"
echo '{"type":"string","format":"no-such-format-here"}' >"$T/unsup.json"
kvctl generate --max-tokens 5 --json-schema "$T/unsup.json" "x" >/dev/null 2>"$T/unsup.err"
rc=$?
[ $rc != 0 ] || fail "an unsupported schema feature was accepted"
grep -q 'constraint: ' "$T/unsup.err" || fail "no constraint message: $(cat "$T/unsup.err")"
kvctl generate --temperature 0 --max-tokens 3 --json-schema "$SCHEMAS/person.json" "x" >/dev/null 2>"$T/cut.err"
rc=$?
[ $rc = 8 ] || fail "a cut output gave exit $rc"
grep -q 'cut at --max-tokens 3' "$T/cut.err" || fail "no cut message: $(cat "$T/cut.err")"
ok "bad grammar: exit 4 with 'constraint: L:C:'; unsupported feature refused; cut output: exit 8"

# ---- forked samples ----
kvctl generate -n 3 --seed 5 --temperature 0.8 --max-tokens $MAXT --json --json-schema "$SCHEMAS/weather_tool_args.json" \
	"Weather tool arguments for a city." >"$T/samples.json"
rc=$?
[ $rc = 0 ] || [ $rc = 8 ] || fail "samples exit $rc"
"$VPY" - "$SCHEMAS/weather_tool_args.json" "$T/samples.json" <<'PY' || fail "a sample does not validate"
import json, sys
import jsonschema
schema = json.load(open(sys.argv[1]))
r = json.load(open(sys.argv[2]))
ss = r["samples"]
assert len(ss) == 3, ss
done = 0
for s in ss:
    if s["finish_reason"] != "eos":
        assert s["finish_reason"] == "length", s
        continue
    jsonschema.validate(json.loads(s["text"]), schema)
    done += 1
assert done >= 2, f"only {done} samples complete"
print(f"{done} of 3 samples complete and valid")
PY
ok "-n 3: every complete sample validates"

# ---- a session: a constrained turn, then a free one ----
sid=$(kvctl session open) || fail "session open"
t1=$(kvctl generate --session "$sid" --temperature 0 --max-tokens 10 --regex '[0-9]{3}' "Pick a number.") ||
	fail "turn 1 exit $?"
[[ "$t1" =~ ^[0-9]{3}$ ]] || fail "turn 1 '$t1'"
t2=$(kvctl generate --session "$sid" --temperature 0 --max-tokens 24 "Now describe that number in words.") ||
	fail "turn 2 exit $?"
[[ "$t2" =~ [^0-9] ]] || fail "turn 2 still constrained: '$t2'"
kvctl session close "$sid" >/dev/null || fail "session close"
ok "session: turn 1 constrained ('$t1'), turn 2 free"

# ---- preempted (swapped, or recomputed): the same outputs as alone ----
for i in 1 2 3 4 5 6 7 8; do
	kvctl generate --temperature 0 --max-tokens 80 --json-schema "$SCHEMAS/todo_list.json" \
		"Todo list number $i, for a busy week." >"$T/alone$i.out" 2>/dev/null
	echo $? >"$T/alone$i.rc"
done
preempt_run() { # NAME ARGS...: the 8 requests at once in a 6M pool, compared with the solo runs
	local name=$1 i
	shift
	local sock=$T/$name.sock
	start_kvd "$name" "$sock" --model "$REAL_MODEL" --pool-size 6M --ledger "$T/$name.ledger" --threads 2 "$@"
	JOBS=()
	for i in 1 2 3 4 5 6 7 8; do
		( "$KVCTL" --socket "$sock" generate --temperature 0 --max-tokens 80 --json-schema "$SCHEMAS/todo_list.json" \
			"Todo list number $i, for a busy week." >"$T/$name$i.out" 2>"$T/$name$i.err"; echo $? >"$T/$name$i.rc" ) &
		JOBS+=($!)
	done
	wait "${JOBS[@]}"
	for i in 1 2 3 4 5 6 7 8; do
		cmp -s "$T/$name$i.out" "$T/alone$i.out" || fail "$name: request $i differs after preemption"
		cmp -s "$T/$name$i.rc" "$T/alone$i.rc" || fail "$name: request $i: exit $(cat "$T/$name$i.rc") vs $(cat "$T/alone$i.rc")"
	done
	PREEMPTED=$($PY -c 'import json,sys; print(sum(json.loads(l).get("preemptions", 0) for l in open(sys.argv[1]) if l.strip()))' \
		"$T/$name.ledger")
	stop_kvd "$KVD_PID" || fail "$name kvd exit status $?"
}
preempt_run swapped --swap-file "$T/swap" --swap-size 64M
[ "$PREEMPTED" -gt 0 ] || fail "swap run: no request was preempted"
ok "8 constrained requests in a 6M pool with swap ($PREEMPTED preemptions): outputs identical to unpreempted ones"
preempt_run recomputed
[ "$PREEMPTED" -gt 0 ] || fail "recompute run: no request was preempted"
ok "the same without swap ($PREEMPTED preemptions, KV recomputed): outputs identical"
