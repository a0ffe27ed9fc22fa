#!/usr/bin/env bash
# t_spec_draft_other.sh — a draft model of other weights, and the drafter
# in kvctl stats.
#
#  * A draft model with the default model's vocabulary but only its first
#    24 of 30 blocks (tests/integration/lib/truncate_gguf.py): it drafts
#    tokens the target rejects as well as ones it accepts. Greedy, seeded
#    and two concurrent requests are byte-identical to mode = off, and the
#    greedy request's --json counters show drafts accepted and rejected
#    (the draft sequence cut back and caught up again).
#  * kvctl stats names the drafter: mode draft, the draft model's pool.
#
# The draft pool's division by owner is tested in test_sched
# (test_spec_draft_exact: one owner's six requests overfill the pool beside
# another's two, which must still draft for at least half their tokens):
# on this default model drafting for itself a draft costs as much as a
# target step, so with several streams kvd rightly drafts nothing and no
# pool fills.
source "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || skip "$KVCTL not built"
[ -f "$REAL_MODEL" ] || skip "no default model at $REAL_MODEL (scripts/setup)"
VPY=$ROOT/.venv/bin/python
[ -x "$VPY" ] || VPY=python3

QUOTE="Repeat the following paragraph exactly, word for word: The lighthouse keeper climbed the spiral stairs \
every evening at dusk, carrying a lantern and a small notebook in which he recorded the color of the sea."
RX_PROMPT="Copy this sentence twice: the quick brown fox jumps over the lazy dog near the river bank."

gen() { # SOCK OUT ARGS...
	local sock=$1 out=$2
	shift 2
	"$KVCTL" --socket "$sock" generate "$@" >"$out" 2>"$out.err"
	echo $? >"$out.rc"
}
text_of() { # JSON -> what the output is, without timings and counters
	$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps([d["text"], d["token_ids"], d["finish_reason"]]))' "$1"
}
counts_of() { # JSON -> drafted accepted
	$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["spec_drafted_tokens"], d["spec_accepted_tokens"])' "$1"
}

run_cases() { # NAME ARGS...
	local m=$1 sock=$T/$1.sock i
	shift
	start_kvd "$m" "$sock" --model "$REAL_MODEL" --pool-size 64M --threads 2 "$@"
	gen "$sock" "$T/$m.g" --json --temperature 0 --max-tokens 48 "$QUOTE"
	gen "$sock" "$T/$m.s" --temperature 0.8 --seed 7 --max-tokens 40 "$QUOTE"
	gen "$sock" "$T/$m.v" --json --temperature 0 --max-tokens 100 --regex '(la ){40}' "$RX_PROMPT"
	local jobs=()
	for i in 1 2; do
		gen "$sock" "$T/$m.c$i" --temperature 0.7 --seed $((20 + i)) --max-tokens 32 "Request $i. $QUOTE" &
		jobs+=($!)
	done
	wait "${jobs[@]}"
	[ "$m" = off ] || "$KVCTL" --socket "$sock" stats --json >"$T/$m.stats" || fail "$m: kvctl stats --json"
	[ "$m" = off ] || "$KVCTL" --socket "$sock" stats >"$T/$m.stats.txt" || fail "$m: kvctl stats"
	stop_kvd "$KVD_PID" || fail "$m: kvd exit status $?"
	for i in g s v c1 c2; do
		[ "$(cat "$T/$m.$i.rc")" = 0 ] || fail "$m $i: exit $(cat "$T/$m.$i.rc"): $(cat "$T/$m.$i.err")"
		[ -s "$T/$m.$i" ] || fail "$m $i: no output"
	done
	text_of "$T/$m.g" >"$T/$m.gx"
	text_of "$T/$m.v" >"$T/$m.vx"
}

same() { # NAME CASE...
	local m=$1 n
	shift
	for n in "$@"; do
		cmp -s "$T/off.$n" "$T/$m.$n" ||
			fail "$n differs with $m: off '$(head -c 300 "$T/off.$n")' $m '$(head -c 300 "$T/$m.$n")'"
	done
}

"$VPY" "$ROOT/tests/integration/lib/truncate_gguf.py" "$REAL_MODEL" "$T/draft24.gguf" 24 ||
	fail "cannot write the truncated draft model"
run_cases off --speculative off
run_cases trunc --speculative draft --draft-model "$T/draft24.gguf"
grep -q "draft model '" "$T/trunc.log" || fail "no draft model loaded: $(cat "$T/trunc.log")"
same trunc gx s vx c1 c2
read -r drafted accepted < <(counts_of "$T/trunc.g")
[ "$accepted" -gt 0 ] || fail "the 24-block draft model: none of $drafted drafts accepted"
[ "$accepted" -lt "$drafted" ] || fail "the 24-block draft model: all $drafted drafts accepted (no cut-back exercised)"
ok "a 24-of-30-block draft model: greedy, seeded, 2 at once byte-identical (greedy: $accepted of $drafted drafts accepted)"

read -r mode dtot < <($PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["spec_mode"], d["spec_draft_pages_total"])' "$T/trunc.stats")
[ "$mode" = 3 ] || fail "kvctl stats --json: spec_mode $mode, not 3 (draft)"
[ "$dtot" -gt 0 ] || fail "kvctl stats --json: no draft pool"
grep -Eq '^ *mode +draft' "$T/trunc.stats.txt" || fail "kvctl stats does not show the mode: $(grep -A12 speculation "$T/trunc.stats.txt")"
grep -Eq "draft model's pool +$dtot pages" "$T/trunc.stats.txt" ||
	fail "kvctl stats does not show the draft pool: $(grep -A12 speculation "$T/trunc.stats.txt")"
ok "kvctl stats: mode draft, a draft pool of $dtot pages"
