#!/usr/bin/env bash
# t_priority.sh — a request's priority orders one owner's requests. With
# max_num_seqs 1, while a long request runs, the same user queues B
# (priority 0) and then C (priority -5): C is admitted, and finishes,
# before B, though it came later; with equal priorities the order is
# arrival. A priority never ranks a request against another user's (that
# is the fair scheduler's, t_fair_flood.sh). Bad values are refused by
# kvctl before anything is sent.
# test-run: alone (queue order depends on a request still running)
source "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || fail "$KVCTL not built"
[ -f "$REAL_MODEL" ] || fail "default model missing (run scripts/setup)"
S=$T/kvd.sock
start_kvd prio "$S" --model "$REAL_MODEL" --max-num-seqs 1 --threads 2
gen() { # NAME PRIORITY MAX_TOKENS: finish time (ns) in $T/NAME.t
	KVD_SOCKET=$S "$KVCTL" generate --raw --temperature 0 --max-tokens "$3" --priority "$2" "Tell me about $1" \
		>"$T/$1.out" 2>"$T/$1.err"
	date +%s%N >"$T/$1.t"
}
long() { # the request the two queue behind: 1,200 tokens under a constraint that no
	# end-of-sequence token can finish early (it is cut by --max-tokens: exit 8);
	# long enough that both others are queued behind it on a fast machine too
	# (400 tokens ended before the second arrived once)
	KVD_SOCKET=$S "$KVCTL" generate --raw --temperature 0 --max-tokens 1200 --regex '(la ){1500}' "Sing" \
		>"$T/long.out" 2>"$T/long.err"
	[ $? = 8 ] || fail "the long request did not run to --max-tokens: $(cat "$T/long.err")"
}
order() { # FIRST SECOND PRIO_FIRST_ARRIVAL PRIO_SECOND_ARRIVAL: which of the two queued ends first
	long &
	local pl=$!
	for i in $(seq 1 100); do [ "$(stat_of "$S" requests_running)" = 1 ] && break; sleep 0.05; done
	gen "$1" "$3" 8 & local p1=$!
	for i in $(seq 1 100); do [ "$(stat_of "$S" requests_waiting)" = 1 ] && break; sleep 0.05; done
	gen "$2" "$4" 8 & local p2=$!
	for i in $(seq 1 100); do [ "$(stat_of "$S" requests_waiting)" = 2 ] && break; sleep 0.05; done
	[ "$(stat_of "$S" requests_waiting)" = 2 ] || fail "the two requests did not queue behind the long one"
	wait $pl $p1 $p2 || fail "a request failed: $(cat "$T"/*.err)"
	[ "$(cat "$T/$1.t")" -lt "$(cat "$T/$2.t")" ] && echo "$1" || echo "$2"
}
first=$(order b c 0 -5)
[ "$first" = c ] || fail "C (priority -5, queued second) did not finish before B (priority 0)"
ok "within one user, priority -5 queued after priority 0 is served first"
first=$(order d e 0 0)
[ "$first" = d ] || fail "with equal priorities the later request finished first"
ok "equal priorities: arrival order"
KVD_SOCKET=$S "$KVCTL" generate --priority 2000000 hi >/dev/null 2>"$T/bad.err" && fail "priority 2000000 accepted"
grep -q -- '--priority' "$T/bad.err" || fail "the refusal does not name --priority: $(cat "$T/bad.err")"
ok "an out-of-range priority is refused: $(head -n 1 "$T/bad.err")"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
