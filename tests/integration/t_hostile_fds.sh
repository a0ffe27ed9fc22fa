#!/usr/bin/env bash
# t_hostile_fds.sh — a client that tampers with every fd kvd handed it
# cannot stall the daemon.
#
# The hostile client (kvd_hostile nonblock) clears O_NONBLOCK on the fds it
# got in WELCOME, fills whatever the daemon writes to, races the daemon for
# whatever it reads, and starts a stream it never reads. Meanwhile another
# client must get its whole stream (and a STATS reply), and SIGTERM must
# still stop the daemon within a few seconds.
source "$(dirname "$0")/lib.sh"
need_bins
HOSTILE=$ROOT/$BUILD/tests/kvd_hostile
[ -x "$HOSTILE" ] || skip "$HOSTILE not built"
TINY=$(tiny_model gqa)
S=$T/kvd.sock

start_kvd hostile "$S" --model "$TINY" --pool-size 32M --threads 2
"$HOSTILE" -s "$S" --seconds 60 nonblock >"$T/hostile.out" 2>"$T/hostile.err" &
HP=$!
PIDS+=("$HP")
for i in $(seq 1 100); do grep -q ATTACKING "$T/hostile.out" && break; sleep 0.1; done
grep -q ATTACKING "$T/hostile.out" || fail "the hostile client did not start: $(cat "$T/hostile.err")"
sleep 0.5 # let the daemon push tokens at the hostile client

for round in 1 2 3; do
	timeout 20 "$RAW" -s "$S" generate --raw -n 48 "another client, round $round" >"$T/gen$round.out" 2>"$T/gen$round.err" ||
		fail "round $round: another client's stream did not complete (exit $?): $(tail -n 2 "$T/gen$round.err")"
	grep -q '^DONE finish=length.*generated=48' "$T/gen$round.err" || fail "round $round: $(cat "$T/gen$round.err")"
done
ok "another client streams while a client clears O_NONBLOCK on its fds and fills/races them"
timeout 10 "$RAW" -s "$S" stats >"$T/stats.json" || fail "STATS not answered during the attack"
ok "STATS answered during the attack"

kill -0 "$HP" 2>/dev/null || echo "note: the hostile client ended early"
kill -TERM "$KVD_PID"
for i in $(seq 1 100); do kill -0 "$KVD_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$KVD_PID" 2>/dev/null && fail "SIGTERM did not stop kvd within 10 s while the hostile client was connected"
wait "$KVD_PID"; rc=$?
[ $rc = 0 ] || fail "kvd exited $rc after SIGTERM"
ok "SIGTERM stops kvd promptly with the hostile client still connected"
