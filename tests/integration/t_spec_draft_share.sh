#!/usr/bin/env bash
# t_spec_draft_share.sh — a draft model of other weights, the drafter in
# kvctl stats, and the draft pool divided by owner.
#
#  * A draft model with the default model's vocabulary but only its first
#    24 of 30 blocks (tests/integration/lib/truncate_gguf.py): it drafts
#    tokens the target rejects as well as ones it accepts. Greedy, seeded
#    and two concurrent requests are byte-identical to mode = off, and the
#    greedy request's --json counters show drafts accepted and rejected
#    (the draft sequence cut back and caught up again).
#  * kvctl stats names the drafter: mode draft, the draft model's pool.
#  * A hostile user (uid 65534) keeps 4 long requests drafting against a
#    6M draft pool (17 pages; they fill it, as far as whole draft sequences
#    fit). Another user's (65533) request, started once they hold at least
#    12 (far over the 8 of two users' shares), must still draft at least
#    half of its tokens (the default model drafting for itself, under the
#    same kind of regex, accepts nearly all), and its output must be
#    byte-identical to mode = off. (Which owner is cut back, and the
#    draft sequences taken back from one over its share, are checked in
#    test_sched's test_spec_draft_exact.)
source "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || skip "$KVCTL not built"
[ -f "$REAL_MODEL" ] || skip "no default model at $REAL_MODEL (scripts/setup)"
command -v setpriv >/dev/null || skip "setpriv missing"
VPY=$ROOT/.venv/bin/python
[ -x "$VPY" ] || VPY=python3
A="setpriv --reuid=65534 --regid=65534 --clear-groups"
B="setpriv --reuid=65533 --regid=65533 --clear-groups"

QUOTE="Repeat the following paragraph exactly, word for word: The lighthouse keeper climbed the spiral stairs \
every evening at dusk, carrying a lantern and a small notebook in which he recorded the color of the sea."
VICTIM="Copy this sentence twice: the quick brown fox jumps over the lazy dog near the river bank."
VRX='(la ){40}' # the victim's constraint: it ends by itself (exit 0), every token drafted for

gen() { # SOCK OUT ARGS...
	local sock=$1 out=$2
	shift 2
	"$KVCTL" --socket "$sock" generate "$@" >"$out" 2>"$out.err"
	echo $? >"$out.rc"
}
text_of() { # JSON -> what the output is, without timings and counters
	$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps([d["text"], d["token_ids"], d["finish_reason"]]))' "$1"
}
kstat() { # SOCK KEY: one counter of kvctl stats --json (kvd_raw is a client too old for the draft ones)
	"$KVCTL" --socket "$1" stats --json | $PY -c "import json,sys; print(json.load(sys.stdin)['$2'])"
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
	gen "$sock" "$T/$m.v" --json --temperature 0 --max-tokens 100 --regex "$VRX" "$VICTIM"
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

# ---- the draft pool divided by owner --------------------------------------------
S=$T/share.sock
printf '[server]\nsocket_mode = 0666\n' >"$T/share.conf"
start_kvd share "$S" --config "$T/share.conf" --model "$REAL_MODEL" --pool-size 64M --threads 2 \
	--speculative draft --draft-model "$REAL_MODEL" --draft-pool-size 6M
# the flood: 250 tokens each under a regex no end token can finish early
# (kvctl exits 8: cut by --max-tokens)
jobs=()
for i in 1 2 3 4; do
	( $A "$KVCTL" --socket "$S" generate --temperature 0 --max-tokens 250 --regex '(la ){500}' "Flood $i. $QUOTE" \
		>"$T/a$i.out" 2>"$T/a$i.err"; echo $? >"$T/a$i.rc" ) &
	jobs+=($!)
done
for i in $(seq 1 200); do
	[ "$(kstat "$S" spec_draft_pages_used)" -ge 12 ] && break
	sleep 0.05
done
used=$(kstat "$S" spec_draft_pages_used)
[ "$used" -ge 12 ] || fail "the hostile user's 4 requests hold only $used of the draft pool's 17 pages"
$B "$KVCTL" --socket "$S" generate --json --temperature 0 --max-tokens 100 --regex "$VRX" "$VICTIM" >"$T/share.v" 2>"$T/share.v.err" ||
	fail "the other user's request: $(cat "$T/share.v.err")"
wait "${jobs[@]}"
for i in 1 2 3 4; do
	[ "$(cat "$T/a$i.rc")" = 8 ] || fail "hostile request $i: exit $(cat "$T/a$i.rc") (8 expected): $(cat "$T/a$i.err")"
done
stop_kvd "$KVD_PID" || fail "share: kvd exit status $?"
text_of "$T/share.v" >"$T/share.vx"
same share vx
read -r drafted accepted < <(counts_of "$T/share.v")
gen_n=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["generated_tokens"])' "$T/share.v")
[ $((drafted * 2)) -ge "$gen_n" ] ||
	fail "beside a user filling the draft pool, another user's request drafted $drafted tokens for $gen_n generated"
ok "a user holding the draft pool ($used of 17 pages) does not starve another's drafts:" \
	"$drafted drafted ($accepted accepted) for $gen_n tokens; output byte-identical"
