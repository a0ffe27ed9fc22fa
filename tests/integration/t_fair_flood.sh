#!/usr/bin/env bash
# t_fair_flood.sh — one user flooding the scheduler cannot starve another.
#
# uid 65534 opens FLOODERS connections, each asking again and again for a
# long generation (max_tokens 1000) from a pool of 68 pages (1088 tokens),
# so the pool is full and its own requests preempt one another; uid 65533
# then asks for a short one. The scheduler shares the engine between
# owners (daemon/sched_fair.c): the short request is admitted at once and
# gets about half of the engine's time, so it must finish within
# LIMIT_FACTOR times its time on the idle daemon plus a margin for this
# shared machine, and give the same text as alone. Before the scheduler
# shared between owners it waited behind every older request of the flood
# (minutes). The flood must still be served.
# test-run: alone (fairness between owners is measured in step time)
source "$(dirname "$0")/lib.sh"
need_bins
command -v setpriv >/dev/null || skip "setpriv missing"
MODEL=$REAL_MODEL
[ -f "$MODEL" ] || skip "the default model is missing ($MODEL)"
S=$T/kvd.sock
FLOODERS=${FAIR_FLOODERS:-8}
LIMIT_FACTOR=4
MARGIN_S=6
A="setpriv --reuid=65534 --regid=65534 --clear-groups"
V="setpriv --reuid=65533 --regid=65533 --clear-groups"

printf '[server]\nsocket_mode = 0666\n' >"$T/kvd.conf"
start_kvd fairflood "$S" --config "$T/kvd.conf" --model "$MODEL" --pool-size 24M --threads 1
VPROMPT="The capital of France is"
APROMPT="Write a very long story about a dragon who"

victim() { # the short request: its text in $T/$1.out, its wall time (ms) on stdout
	local t0 t1
	t0=$(date +%s%N)
	timeout "$2" $V "$RAW" -s "$S" generate --raw -n 32 "$VPROMPT" >"$T/$1.out" 2>"$T/$1.err" ||
		fail "the short request ($1) failed or timed out after $2 s: $(tail -c 300 "$T/$1.err")"
	t1=$(date +%s%N)
	echo $(( (t1 - t0) / 1000000 ))
}

"$RAW" -s "$S" generate --raw -n 4 "$VPROMPT" >/dev/null 2>&1 || fail "warm-up"
idle_ms=$(victim idle 60) || exit 1

FP=()
for j in $(seq 1 "$FLOODERS"); do
	( while :; do $A "$RAW" -s "$S" generate --raw -n 1000 "$APROMPT $j" >/dev/null 2>&1 || sleep 0.2; done ) &
	FP+=($!)
	PIDS+=($!)
done
# the pool full and the flood preempting itself
for i in $(seq 1 600); do
	pre=$("$RAW" -s "$S" stats | $PY -c "import json,sys; d=json.load(sys.stdin); print(d['pages_free'], d['requests_running'])")
	read -r free running <<<"$pre"
	[ "$free" -le 4 ] && [ "$running" -ge 2 ] && break
	sleep 0.1
done
[ "$free" -le 4 ] || fail "the flood did not fill the pool (pages free: $free)"
sleep 1

limit_s=$(( idle_ms * LIMIT_FACTOR / 1000 + MARGIN_S ))
flood_gen() { # tokens the flood's live requests have generated (kvctl ps, as root)
	KVD_SOCKET=$S "$KVCTL" ps --json | $PY -c "import json,sys; print(sum(r['generated_tokens'] for r in json.load(sys.stdin)['requests'] if r['uid'] == 65534))"
}
gen_before=$(flood_gen); done_before=$(stat_of "$S" requests_completed)
flood_ms=$(victim flooded "$limit_s") || exit 1
gen_flood=$(( $(flood_gen) - gen_before )); done_flood=$(( $(stat_of "$S" requests_completed) - done_before - 1 ))
cmp -s "$T/idle.out" "$T/flooded.out" || fail "the short request's text changed under the flood"
for p in "${FP[@]}"; do kill -TERM "$p" 2>/dev/null; done
wait "${FP[@]}" 2>/dev/null
echo "short request of uid 65533: ${idle_ms} ms alone, ${flood_ms} ms beside $FLOODERS flooding connections of uid 65534 (limit ${limit_s} s); the flood's live requests got $gen_flood tokens meanwhile"
[ "$gen_flood" -gt 0 ] || [ "$done_flood" -gt 0 ] || fail "the flood was not served while the short request ran"
ok "a flood from $FLOODERS connections of one user leaves another user's short request ${flood_ms} ms (alone ${idle_ms} ms, limit ${limit_s} s)"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
