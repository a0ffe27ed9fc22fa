#!/usr/bin/env bash
# t_spec.sh — speculative decoding by prompt lookup ([speculative] mode =
# lookup) never changes an output. On the default model, each request runs
# under mode = off and mode = lookup and the outputs must be byte-identical:
#   - an input-grounded prompt (quote a given paragraph), where drafts are
#     accepted: greedy, seeded, -n 2 samples, 4 at once with their own seeds;
#   - a free-text prompt (a story), where drafts are mostly rejected;
#   - a regex constraint (greedy and seeded), log-probabilities (text, ids,
#     log-probabilities and finish of --json), a sliding-window policy
#     (not drafted for: t_spec_seen.sh checks that nothing is drafted);
#   - 6 at once in a 6M pool with a swap file, so requests are preempted
#     (swapped out and back) between drafting steps;
#   - models whose layers attend over a window and release the pages they
#     are done with (tiny random-weight Mistral and Gemma 3,
#     scripts/gen_tiny_models.py): 400 tokens of a repeating prompt under
#     off, lookup and auto, byte-identical and never an error (a page
#     released for drafts that were then cut back would be one the next
#     token still reads).
# The lookup daemons must have drafted and accepted tokens (their exit log
# line), so the test cannot pass by never speculating; the off daemons
# must not have drafted.
source "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || skip "$KVCTL not built"
[ -f "$REAL_MODEL" ] || skip "no default model at $REAL_MODEL (scripts/setup)"

DOC="The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lantern and a small \
notebook in which he recorded the color of the sea, the direction of the wind, and the names of the ships that passed."
QUOTE="Repeat the following paragraph exactly, word for word: $DOC"
STORY="Write a short story about a dragon who learns to paint."

gen() { # SOCK OUT ARGS...
	local sock=$1 out=$2
	shift 2
	"$KVCTL" --socket "$sock" generate "$@" >"$out" 2>"$out.err"
	echo $? >"$out.rc"
}

# run_cases MODE: the single and concurrent requests against one daemon
run_cases() {
	local m=$1 sock=$T/$1.sock i
	start_kvd "$m" "$sock" --model "$REAL_MODEL" --pool-size 64M --threads 2 --speculative "$m"
	gen "$sock" "$T/$m.g_quote" --temperature 0 --max-tokens 80 "$QUOTE"
	gen "$sock" "$T/$m.s_quote" --temperature 0.8 --seed 7 --max-tokens 64 "$QUOTE"
	gen "$sock" "$T/$m.g_story" --temperature 0 --max-tokens 40 "$STORY"
	gen "$sock" "$T/$m.s_story" --temperature 0.9 --seed 11 --max-tokens 40 "$STORY"
	gen "$sock" "$T/$m.n2" --temperature 0.8 --seed 5 -n 2 --max-tokens 48 "$QUOTE"
	gen "$sock" "$T/$m.g_regex" --temperature 0 --max-tokens 48 --regex '[A-Za-z ,.]{10,300}' "$QUOTE"
	gen "$sock" "$T/$m.s_regex" --temperature 0.7 --seed 3 --max-tokens 48 --regex '[A-Za-z ,.]{10,300}' "$QUOTE"
	gen "$sock" "$T/$m.win" --temperature 0 --max-tokens 48 --context-policy sliding-window --window 64 "$QUOTE"
	gen "$sock" "$T/$m.lpj" --json --temperature 0.8 --seed 9 --max-tokens 48 --logprobs 2 "$QUOTE"
	$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps([d["text"], d["token_ids"], d["logprobs"], d["finish_reason"]]))' \
		"$T/$m.lpj" >"$T/$m.lp" 2>>"$T/$m.lpj.err" || echo 1 >"$T/$m.lpj.rc"
	cp "$T/$m.lpj.rc" "$T/$m.lp.rc"; cp "$T/$m.lpj.err" "$T/$m.lp.err"
	local jobs=()
	for i in 1 2 3 4; do
		gen "$sock" "$T/$m.c$i" --temperature 0.7 --seed $((20 + i)) --max-tokens 48 "$QUOTE" &
		jobs+=($!)
	done
	wait "${jobs[@]}"
	stop_kvd "$KVD_PID" || fail "$m: kvd exit status $?"
}

# run_pressed MODE: 6 at once in a pool too small for them all, with swap
run_pressed() {
	local m=$1 name=p$1 sock=$T/p$1.sock i
	start_kvd "$name" "$sock" --model "$REAL_MODEL" --pool-size 6M --threads 2 --speculative "$m" \
		--swap-file "$T/$name.swap" --swap-size 64M --ledger "$T/$name.ledger"
	local jobs=()
	for i in 1 2 3 4 5 6; do
		if [ $i -le 3 ]; then
			gen "$sock" "$T/$name.$i" --temperature 0 --max-tokens 96 "Request $i. $QUOTE" &
		else
			gen "$sock" "$T/$name.$i" --temperature 0.8 --seed $i --max-tokens 96 "Request $i. $QUOTE" &
		fi
		jobs+=($!)
	done
	wait "${jobs[@]}"
	stop_kvd "$KVD_PID" || fail "$name: kvd exit status $?"
}

same() { # NAME...: the off and lookup outputs of each are identical and succeeded
	local n
	for n in "$@"; do
		[ "$(cat "$T/off.$n.rc")" = 0 ] || fail "off $n: exit $(cat "$T/off.$n.rc"): $(cat "$T/off.$n.err")"
		[ "$(cat "$T/lookup.$n.rc")" = 0 ] || fail "lookup $n: exit $(cat "$T/lookup.$n.rc"): $(cat "$T/lookup.$n.err")"
		[ -s "$T/off.$n" ] || fail "off $n: no output"
		cmp -s "$T/off.$n" "$T/lookup.$n" ||
			fail "$n differs with speculation: off '$(head -c 300 "$T/off.$n")' lookup '$(head -c 300 "$T/lookup.$n")'"
	done
}

# accepted LOG: the tokens the daemon's exit line says were accepted (0: no line)
accepted() {
	sed -n 's/.*speculative decoding: [0-9]* tokens drafted in [0-9]* steps, \([0-9]*\) accepted.*/\1/p' "$1" | tail -n 1 |
		grep . || echo 0
}

run_cases off
run_cases lookup
same g_quote s_quote g_story s_story n2 c1 c2 c3 c4 g_regex s_regex win lp
grep -q "speculative decoding:" "$T/off.log" && fail "mode = off drafted: $(grep 'speculative decoding:' "$T/off.log")"
acc=$(accepted "$T/lookup.log")
[ "$acc" -gt 0 ] || fail "mode = lookup accepted no draft token ($(grep 'speculative' "$T/lookup.log"))"
grep -q "^--- sample 1 (" "$T/lookup.n2" || fail "-n 2 printed no second sample: $(cat "$T/lookup.n2")"
ok "quote and story, greedy and seeded, -n 2, 4 at once, a regex constraint (greedy, seeded), a sliding window, logprobs: byte-identical with and without speculation ($acc draft tokens accepted)"

run_pressed off
run_pressed lookup
for i in 1 2 3 4 5 6; do
	cp "$T/poff.$i" "$T/off.pr$i"; cp "$T/poff.$i.rc" "$T/off.pr$i.rc"; cp "$T/poff.$i.err" "$T/off.pr$i.err"
	cp "$T/plookup.$i" "$T/lookup.pr$i"; cp "$T/plookup.$i.rc" "$T/lookup.pr$i.rc"; cp "$T/plookup.$i.err" "$T/lookup.pr$i.err"
done
same pr1 pr2 pr3 pr4 pr5 pr6
pre=$($PY -c 'import json,sys; print(sum(json.loads(l).get("preemptions", 0) for l in open(sys.argv[1]) if l.strip()))' \
	"$T/plookup.ledger")
[ "$pre" -gt 0 ] || fail "the 6M pool preempted no request under lookup"
acc=$(accepted "$T/plookup.log")
[ "$acc" -gt 0 ] || fail "mode = lookup in the small pool accepted no draft token"
ok "6 at once in a 6M pool with swap ($pre preemptions, $acc draft tokens accepted): byte-identical"

# ---- windowed layers that release their pages ----------------------------------
VPY=$ROOT/.venv/bin/python
[ -x "$VPY" ] || VPY=python3
"$VPY" "$ROOT/scripts/gen_tiny_models.py" --arch --only mistral,gemma3 "$T/win" >/dev/null 2>&1 ||
	fail "cannot generate tiny-mistral and tiny-gemma3"
for arch in mistral gemma3; do
	for m in off lookup auto; do
		start_kvd "$arch-$m" "$T/$arch-$m.sock" --model "$T/win/tiny-$arch.gguf" --pool-size 16M --threads 2 --speculative "$m"
		gen "$T/$arch-$m.sock" "$T/$arch.$m.json" --raw --json --temperature 0 --max-tokens 400 "a b c a b c a b c a b c a b c a b c"
		stop_kvd "$KVD_PID" || fail "$arch $m: kvd exit status $?"
		[ "$(cat "$T/$arch.$m.json.rc")" = 0 ] || fail "$arch $m: exit $(cat "$T/$arch.$m.json.rc"): $(cat "$T/$arch.$m.json.err")"
		$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps([d["text"], d["token_ids"], d["finish_reason"]]))' \
			"$T/$arch.$m.json" >"$T/$arch.$m" || fail "$arch $m: no JSON"
	done
	cmp -s "$T/$arch.off" "$T/$arch.lookup" || fail "$arch: lookup changed the output"
	cmp -s "$T/$arch.off" "$T/$arch.auto" || fail "$arch: auto changed the output"
	acc=$(sed -n 's/.*speculative decoding: [0-9]* tokens drafted in [0-9]* steps, \([0-9]*\) accepted.*/\1/p' "$T/$arch-lookup.log" | tail -n 1)
	[ "${acc:-0}" -gt 0 ] || fail "$arch: lookup accepted no draft token"
	ok "tiny $arch (windowed layers releasing pages): 400 tokens byte-identical under off, lookup and auto ($acc drafts accepted)"
done
