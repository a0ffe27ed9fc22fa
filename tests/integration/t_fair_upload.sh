#!/usr/bin/env bash
# t_fair_upload.sh — a user flooding large uploads through the ring (kvctl
# count of 1 MB texts, over 4 connections) cannot slow another client's
# stream by more than 20 %.
#
# A text over 32 KiB travels through the shared-memory upload ring, and
# the daemon renders and tokenizes it when its last record arrives; that
# work is charged to its user's share of the loop like socket frames are
# (daemon/stream.c, uploads_pump), so a user over its share stops being
# read until it has earned it back. Measured as in t_fair.sh: kvd's own
# CPU time (user + system) from a stream's GENERATE to its DONE, alone and
# then with the flood running, as pairs; the median of the pairs' ratios
# must stay within the limit. The flood starts before the stream, so the
# one upload that may be tokenized as the stream begins (an upload is not
# cut in pieces) is a small part of a stream of N tokens. The flooders
# must still get answers: limited, not starved.
# test-run: alone (fairness between owners is measured in step time)
source "$(dirname "$0")/lib.sh"
need_bins
HOSTILE=$ROOT/$BUILD/tests/kvd_hostile
[ -x "$HOSTILE" ] || skip "$HOSTILE not built"
command -v setpriv >/dev/null || skip "setpriv missing"
MODEL=$REAL_MODEL
[ -f "$MODEL" ] || MODEL=$(tiny_model gqa)
S=$T/kvd.sock
TRIALS=${FAIR_TRIALS:-3}
N=${FAIR_TOKENS:-128}
LIMIT_PCT=120
FLOODERS=4
FLOOD_AS="setpriv --reuid=65534 --regid=65534 --clear-groups"

printf '[server]\nsocket_mode = 0666\n' >"$T/kvd.conf"
start_kvd fairup "$S" --config "$T/kvd.conf" --model "$MODEL" --pool-size 64M --threads 1
PROMPT="Counting: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
"$RAW" -s "$S" generate --raw -n 8 "$PROMPT" >/dev/null 2>&1 || fail "warm-up"
# 1 MB of text that tokenizes slowly (no long merges): about 0.6 s of
# tokenizing each on one core
$PY -c "import random; r = random.Random(7); a = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/'
print(''.join(r.choice(a) if i % 100 else '\n' for i in range(1, 1000000)))" >"$T/big.txt"
chmod 644 "$T/big.txt"

stream() { # one stream of N tokens: "WALL_US CPU_TICKS", from GENERATE sent to DONE read
	"$HOSTILE" -s "$S" stream "$KVD_PID" "$N" "$PROMPT" 2>"$T/stream.err" || { cat "$T/stream.err" >&2; return 1; }
}

ratios=(); wratios=()
for i in $(seq 1 "$TRIALS"); do
	read -r aw ac < <(stream) || fail "a timed stream failed"
	FP=()
	for j in $(seq 1 "$FLOODERS"); do
		( while :; do KVD_SOCKET=$S $FLOOD_AS "$KVCTL" count <"$T/big.txt" >>"$T/flood$i.$j.out" 2>&1 || sleep 0.05; done ) &
		FP+=($!); PIDS+=($!)
	done
	for k in $(seq 1 200); do [ -s "$T/flood$i.1.out" ] && break; sleep 0.05; done
	read -r fw fc < <(stream) || fail "a timed stream failed"
	for p in "${FP[@]}"; do kill -TERM "$p" 2>/dev/null; done
	wait "${FP[@]}" 2>/dev/null
	[ -n "$ac" ] && [ "$ac" -gt 0 ] && [ -n "$fc" ] || fail "no CPU time measured"
	replies=$(cat "$T"/flood$i.*.out | grep -c '^[0-9][0-9]*$')
	[ "${replies:-0}" -gt 0 ] || fail "the flooders got no answers at all (starved rather than limited): $(head -c 300 "$T/flood$i.1.out")"
	ratios+=("$(( fc * 1000 / ac ))"); wratios+=("$(( fw * 1000 / aw ))")
	echo "trial $i: alone ${aw} us wall, ${ac} ticks kvd CPU; flooded ${fw} us, ${fc} ticks" \
		"(CPU $(( fc * 100 / ac ))%, wall $(( fw * 100 / aw ))%); flooders got $replies answers"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
pct=$(( ($(median "${ratios[@]}") + 5) / 10 ))
wpct=$(( ($(median "${wratios[@]}") + 5) / 10 ))
echo "stream of $N tokens, median over $TRIALS pairs of flooded/alone: kvd CPU ${pct}%, wall clock ${wpct}% (wall clock reported only)"
[ "$pct" -le "$LIMIT_PCT" ] || fail "a flood of 1 MB ring uploads made another stream cost ${pct}% of kvd's time alone (limit ${LIMIT_PCT}%)"
ok "1 MB ring uploads from $FLOODERS connections of one user: another stream costs ${pct}% of kvd's time alone (limit ${LIMIT_PCT}%); the flooders are still answered"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
