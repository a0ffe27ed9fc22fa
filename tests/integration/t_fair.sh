#!/usr/bin/env bash
# t_fair.sh — a client flooding TOKENIZE cannot slow another client's
# stream by more than 20 %.
#
# Noise-robust by construction: the stream is timed alone and then with the
# flooder running, as a pair, TRIALS times in the same run on the same
# daemon; the median of the pairs' ratios is compared, so load from other
# processes on the machine (which drifts slowly) hits both halves of a pair
# alike and an outlier pair does not count. kvd runs one engine thread, so
# the clients have a core. The flooder must still get replies: limited,
# not starved.
source "$(dirname "$0")/lib.sh"
need_bins
HOSTILE=$ROOT/$BUILD/tests/kvd_hostile
[ -x "$HOSTILE" ] || skip "$HOSTILE not built"
MODEL=$REAL_MODEL
[ -f "$MODEL" ] || MODEL=$(tiny_model gqa)
S=$T/kvd.sock
TRIALS=${FAIR_TRIALS:-7}
N=${FAIR_TOKENS:-96}
LIMIT_PCT=120

start_kvd fair "$S" --model "$MODEL" --pool-size 64M --threads 1
PROMPT="Counting: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
"$RAW" -s "$S" generate --raw -n 8 "$PROMPT" >/dev/null 2>&1 || fail "warm-up"

stream_us() { # time one stream of N tokens, in microseconds
	local t0=$(date +%s%N)
	"$RAW" -s "$S" generate --raw -n "$N" "$PROMPT" >/dev/null 2>"$T/stream.err" || fail "stream: $(cat "$T/stream.err")"
	grep -q "generated=$N" "$T/stream.err" || fail "stream: $(cat "$T/stream.err")"
	echo $(( ($(date +%s%N) - t0) / 1000 ))
}

alone=(); flooded=(); ratios=()
for i in $(seq 1 "$TRIALS"); do
	a=$(stream_us)
	"$HOSTILE" -s "$S" --seconds 120 flood >"$T/flood$i.out" 2>&1 &
	FP=$!
	for k in $(seq 1 100); do grep -q FLOODING "$T/flood$i.out" && break; sleep 0.05; done
	grep -q FLOODING "$T/flood$i.out" || fail "the flooder did not start: $(cat "$T/flood$i.out")"
	sleep 0.3 # let the flood fill the daemon's socket
	f=$(stream_us)
	kill -TERM "$FP"; wait "$FP"
	[ -n "$a" ] && [ -n "$f" ] || fail "a timed stream failed"
	replies=$(awk '/^REPLIES/ {print $2}' "$T/flood$i.out")
	[ "${replies:-0}" -gt 0 ] || fail "the flooder got no replies at all (starved rather than limited): $(cat "$T/flood$i.out")"
	alone+=("$a"); flooded+=("$f"); ratios+=("$(( f * 1000 / a ))")
	echo "trial $i: alone $a us, flooded $f us ($(( f * 100 / a ))%), flooder got $replies replies"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# Each flooded run is paired with the run just before it, which saw the
# same background load; the median of the pairs' ratios is what counts.
pm=$(median "${ratios[@]}")
pct=$(( (pm + 5) / 10 ))
echo "stream of $N tokens: median ratio flooded/alone over $TRIALS pairs: ${pct}% (medians: alone $(median "${alone[@]}") us, flooded $(median "${flooded[@]}") us)"
[ "$pct" -le "$LIMIT_PCT" ] || fail "a TOKENIZE flooder slowed another stream to ${pct}% of its time alone (limit ${LIMIT_PCT}%)"
ok "a TOKENIZE flooder slows another stream to ${pct}% (limit ${LIMIT_PCT}%), and is itself still served"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
