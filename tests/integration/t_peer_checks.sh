#!/usr/bin/env bash
# t_peer_checks.sh — who a connection is, checked at every point it matters.
#
#   - a connection whose credentials (SO_PEERCRED) cannot be read is refused
#     (fault injected with KVD_TEST_FAULTS=peercred in kvd-faulty, the test
#     build), never taken for uid 0; the kvd that is installed reads no test
#     variable, so the same setting there changes nothing
#   - SIGHUP re-applies server.allowed_users to connections already open: a
#     user taken off the list is sent IPC_ERR_DENIED and disconnected, and a
#     user still on it keeps its connection
#   - a second HELLO gets an ERROR about the connection, which is then closed
source "$(dirname "$0")/lib.sh"
need_bins
HOSTILE=$ROOT/$BUILD/tests/kvd_hostile
[ -x "$HOSTILE" ] || skip "$HOSTILE not built"
command -v setpriv >/dev/null || skip "setpriv missing"
TINY=$(tiny_model gqa)

# ---- credentials that cannot be read ---------------------------------------------
FAULTY=$ROOT/$BUILD/tests/kvd-faulty
[ -x "$FAULTY" ] || skip "$FAULTY not built"
S=$T/fault.sock
KVD_TEST_FAULTS=peercred "$FAULTY" --config /dev/null --socket "$S" --model "$TINY" --pool-size 8M --threads 1 \
	2>"$T/fault.log" &
FP=$!
PIDS+=("$FP")
for i in $(seq 1 300); do [ -S "$S" ] && grep -q listening "$T/fault.log" && break; sleep 0.1; done
grep -q "KVD_TEST_FAULTS" "$T/fault.log" || fail "kvd-faulty did not arm KVD_TEST_FAULTS=peercred: $(cat "$T/fault.log")"
"$RAW" -s "$S" hello >"$T/fault.out" 2>&1 && fail "a connection without credentials was served"
grep -q 'code=-1007' "$T/fault.out" || fail "expected IPC_ERR_DENIED: $(cat "$T/fault.out")"
grep -q "cannot read its credentials" "$T/fault.log" || fail "no log line for the refused connection"
kill -TERM "$FP"; wait "$FP"
ok "a connection whose SO_PEERCRED cannot be read is refused (IPC_ERR_DENIED), not taken for root"

# ---- the shipped kvd reads no test variable ---------------------------------------
S=$T/plain.sock
KVD_TEST_FAULTS=peercred "$KVD" --config /dev/null --socket "$S" --model "$TINY" --pool-size 8M --threads 1 \
	2>"$T/plain.log" &
PP=$!
PIDS+=("$PP")
for i in $(seq 1 300); do [ -S "$S" ] && grep -q listening "$T/plain.log" && break; sleep 0.1; done
grep -q listening "$T/plain.log" || fail "kvd did not start: $(cat "$T/plain.log")"
"$RAW" -s "$S" hello >"$T/plain.out" 2>&1 || fail "bin/kvd acted on KVD_TEST_FAULTS: $(cat "$T/plain.out")"
! grep -q "KVD_TEST_FAULTS" "$T/plain.log" || fail "bin/kvd read KVD_TEST_FAULTS: $(grep KVD_TEST_FAULTS "$T/plain.log")"
stop_kvd "$PP" || fail "kvd exit status $?"
ok "bin/kvd ignores KVD_TEST_FAULTS (only the test build kvd-faulty injects faults)"

# ---- SIGHUP re-checks the allow-list ------------------------------------------------
S=$T/kvd.sock
printf '[server]\nsocket_mode = 0666\nallowed_users = 65534, 65533\n' >"$T/kvd.conf"
start_kvd reload "$S" --config "$T/kvd.conf" --model "$TINY" --pool-size 8M --threads 1
setpriv --reuid=65534 --regid=65534 --clear-groups "$HOSTILE" -s "$S" --seconds 8 watch >"$T/w1.out" 2>&1 &
W1=$!
setpriv --reuid=65533 --regid=65533 --clear-groups "$HOSTILE" -s "$S" --seconds 3 watch >"$T/w2.out" 2>&1 &
W2=$!
for i in $(seq 1 100); do grep -q WELCOMED "$T/w1.out" && grep -q WELCOMED "$T/w2.out" && break; sleep 0.1; done
grep -q WELCOMED "$T/w1.out" || fail "uid 65534 not admitted: $(cat "$T/w1.out")"
grep -q WELCOMED "$T/w2.out" || fail "uid 65533 not admitted: $(cat "$T/w2.out")"
printf '[server]\nsocket_mode = 0666\nallowed_users = 65533\n' >"$T/kvd.conf"
kill -HUP "$KVD_PID"
wait "$W1" || fail "uid 65534 kept its connection after SIGHUP took it off the list: $(cat "$T/w1.out")"
grep -q 'code=-1007' "$T/w1.out" || fail "no IPC_ERR_DENIED before the close: $(cat "$T/w1.out")"
wait "$W2" && fail "uid 65533, still allowed, lost its connection: $(cat "$T/w2.out")"
grep -q "still open" "$T/w2.out" || fail "uid 65533: $(cat "$T/w2.out")"
ok "SIGHUP: a connection of a user no longer allowed gets IPC_ERR_DENIED and is closed; an allowed one stays"

# ---- a second HELLO ---------------------------------------------------------------------
"$HOSTILE" -s "$S" hello-twice >"$T/hh.out" 2>&1 || fail "second HELLO: $(cat "$T/hh.out")"
grep -q 'code=-71 request=0 ' "$T/hh.out" || fail "second HELLO: expected -EPROTO about the connection: $(cat "$T/hh.out")"
"$RAW" -s "$S" hello >/dev/null 2>&1 || fail "kvd stopped serving after the second HELLO"
ok "a second HELLO gets -EPROTO with request id 0 and the connection is closed"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
