#!/usr/bin/env bash
# t_spec_draft.sh — speculative decoding with a draft model ([speculative]
# mode = draft, draft_model) never changes an output. The default model
# drafts for itself (a draft model with the target's vocabulary, whose
# greedy drafts the target must accept), so every request runs under mode =
# off and mode = draft and the outputs must be byte-identical: greedy and
# seeded quoting, -n 2 samples, 3 at once, a regex constraint with
# log-probabilities (--json), and 4 at once in a 6M pool with a swap file
# (preempted between drafting steps), that last one with a draft pool too
# small for every draft sequence at once (dropped and caught up again). The greedy
# request's --json counters must show it drafted and accepted nearly all
# (so the test cannot pass by never drafting). A draft model with another
# vocabulary is refused at start-up naming the difference, and mode = draft
# without a draft model is a configuration error.
source "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || skip "$KVCTL not built"
[ -f "$REAL_MODEL" ] || skip "no default model at $REAL_MODEL (scripts/setup)"

QUOTE="Repeat the following paragraph exactly, word for word: The lighthouse keeper climbed the spiral stairs \
every evening at dusk, carrying a lantern and a small notebook in which he recorded the color of the sea."

gen() { # SOCK OUT ARGS...
	local sock=$1 out=$2
	shift 2
	"$KVCTL" --socket "$sock" generate "$@" >"$out" 2>"$out.err"
	echo $? >"$out.rc"
}

run_cases() { # MODE ARGS...
	local m=$1 sock=$T/$1.sock i
	shift
	start_kvd "$m" "$sock" --model "$REAL_MODEL" --pool-size 64M --threads 2 --speculative "$m" "$@"
	gen "$sock" "$T/$m.g" --json --temperature 0 --max-tokens 48 "$QUOTE"
	gen "$sock" "$T/$m.s" --temperature 0.8 --seed 7 --max-tokens 40 "$QUOTE"
	gen "$sock" "$T/$m.n2" --temperature 0.8 --seed 5 -n 2 --max-tokens 32 "$QUOTE"
	gen "$sock" "$T/$m.lp" --json --temperature 0.7 --seed 3 --max-tokens 32 --logprobs 2 \
		--regex '[A-Za-z ,.]{10,300}' "$QUOTE"
	for i in g lp; do # what the output is, without timings and counters
		$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps([d["text"], d["token_ids"], d.get("logprobs"), d["finish_reason"]]))' \
			"$T/$m.$i" >"$T/$m.${i}x" 2>"$T/$m.${i}x.err"
		echo $? >"$T/$m.${i}x.rc"
	done
	local jobs=()
	for i in 1 2 3; do
		gen "$sock" "$T/$m.c$i" --temperature 0.7 --seed $((20 + i)) --max-tokens 32 "$QUOTE" &
		jobs+=($!)
	done
	wait "${jobs[@]}"
	stop_kvd "$KVD_PID" || fail "$m: kvd exit status $?"
}

run_pressed() { # MODE ARGS...
	local m=$1 name=p$1 sock=$T/p$1.sock i
	shift
	start_kvd "$name" "$sock" --model "$REAL_MODEL" --pool-size 6M --threads 2 --speculative "$m" \
		--swap-file "$T/$name.swap" --swap-size 64M --ledger "$T/$name.ledger" "$@"
	local jobs=()
	for i in 1 2 3 4; do
		gen "$sock" "$T/$m.pr$i" --temperature $([ $i -le 2 ] && echo 0 || echo 0.8) --seed $i --max-tokens 80 \
			"Request $i. $QUOTE" &
		jobs+=($!)
	done
	wait "${jobs[@]}"
	stop_kvd "$KVD_PID" || fail "$name: kvd exit status $?"
}

same() { # NAME...
	local n
	for n in "$@"; do
		[ "$(cat "$T/off.$n.rc")" = 0 ] || fail "off $n: exit $(cat "$T/off.$n.rc"): $(cat "$T/off.$n.err")"
		[ "$(cat "$T/draft.$n.rc")" = 0 ] || fail "draft $n: exit $(cat "$T/draft.$n.rc"): $(cat "$T/draft.$n.err")"
		[ -s "$T/off.$n" ] || fail "off $n: no output"
		cmp -s "$T/off.$n" "$T/draft.$n" ||
			fail "$n differs with a draft model: off '$(head -c 300 "$T/off.$n")' draft '$(head -c 300 "$T/draft.$n")'"
	done
}

run_cases off
run_cases draft --draft-model "$REAL_MODEL"
grep -q "draft model '" "$T/draft.log" || fail "no draft model loaded: $(cat "$T/draft.log")"
same gx s n2 lpx c1 c2 c3
read -r drafted accepted < <($PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["spec_drafted_tokens"], d["spec_accepted_tokens"])' "$T/draft.g")
[ "$drafted" -ge 20 ] || fail "the greedy request drafted $drafted tokens with a draft model"
[ $((accepted * 100)) -ge $((drafted * 90)) ] || fail "the model drafting for itself: $accepted of $drafted accepted"
grep -q "^--- sample 1 (" "$T/draft.n2" || fail "-n 2 printed no second sample: $(cat "$T/draft.n2")"
ok "greedy, seeded, -n 2, 3 at once, regex + logprobs: byte-identical with a draft model (greedy: $accepted of $drafted drafts accepted)"

run_pressed off
run_pressed draft --draft-model "$REAL_MODEL" --draft-pool-size 3M
same pr1 pr2 pr3 pr4
pre=$($PY -c 'import json,sys; print(sum(json.loads(l).get("preemptions", 0) for l in open(sys.argv[1]) if l.strip()))' \
	"$T/pdraft.ledger")
[ "$pre" -gt 0 ] || fail "the 6M pool preempted no request"
acc=$(sed -n 's/.*speculative decoding: [0-9]* tokens drafted in [0-9]* steps, \([0-9]*\) accepted.*/\1/p' "$T/pdraft.log" | tail -n 1)
[ "${acc:-0}" -gt 0 ] || fail "the pressed draft run accepted no draft token"
ok "4 at once in a 6M pool with swap and a 3M draft pool ($pre preemptions, $acc drafts accepted): byte-identical"

other=$(tiny_model gqa)
"$KVD" --config /dev/null --socket "$T/bad.sock" --model "$REAL_MODEL" --speculative draft --draft-model "$other" \
	2>"$T/bad.log" &
pid=$!
wait $pid && fail "a draft model with another vocabulary was accepted"
grep -q "cannot draft for .*: the draft model's" "$T/bad.log" || fail "refusal does not name the difference: $(cat "$T/bad.log")"
ok "another vocabulary refused: $(grep -o "the draft model's.*" "$T/bad.log" | head -n 1)"

"$KVD" --config /dev/null --socket "$T/none.sock" --model "$REAL_MODEL" --speculative draft 2>"$T/none.log" &
pid=$!
wait $pid && fail "mode = draft without a draft model started"
grep -q "needs a draft model" "$T/none.log" || fail "no clear error: $(cat "$T/none.log")"
ok "mode = draft without a draft model: $(grep -o "mode = draft needs.*" "$T/none.log")"
