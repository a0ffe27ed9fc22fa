#!/usr/bin/env bash
# t_conn_limits.sh — one user cannot take every connection slot.
#
# max_clients 8, 2 of them reserved for administrators, 4 per user, idle
# timeout 2 s:
#   - uid 65534 opening 6 connections without HELLO gets 4
#   - uid 65533, with one connection uploading, opening 4 more with HELLO gets
#     the 1 left to non-administrators
#   - root still gets STATS answered (a reserved slot)
#   - the idle connections are closed after the idle timeout; a connection
#     with a request in flight (a ring upload that never comes) is not
#   - once they are closed, the user gets in again
source "$(dirname "$0")/lib.sh"
need_bins
HOSTILE=$ROOT/$BUILD/tests/kvd_hostile
[ -x "$HOSTILE" ] || skip "$HOSTILE not built"
command -v setpriv >/dev/null || skip "setpriv missing"
TINY=$(tiny_model gqa)
S=$T/kvd.sock
U1="setpriv --reuid=65534 --regid=65534 --clear-groups"
U2="setpriv --reuid=65533 --regid=65533 --clear-groups"

printf '[server]\nsocket_mode = 0666\nmax_clients = 8\nadmin_reserved_clients = 2\nmax_clients_per_user = 4\nidle_timeout = 2\n' >"$T/kvd.conf"
start_kvd limits "$S" --config "$T/kvd.conf" --model "$TINY" --pool-size 8M --threads 1

$U1 "$HOSTILE" -s "$S" --seconds 9 hold 6 >"$T/h1.out" 2>&1 &
H1=$!
for i in $(seq 1 100); do grep -q HELD "$T/h1.out" && break; sleep 0.1; done
grep -q "HELD 4 refused 2" "$T/h1.out" || fail "per-user limit: $(cat "$T/h1.out")"
grep -q "code=-1004 .*max_clients_per_user" "$T/h1.out" || fail "per-user limit: no IPC_ERR_LIMIT: $(cat "$T/h1.out")"
ok "uid 65534 holding connections without HELLO: 4 of 6 admitted (server.max_clients_per_user)"

$U2 "$HOSTILE" -s "$S" --seconds 5 upload-hang >"$T/up.out" 2>&1 &
UP=$!
for i in $(seq 1 100); do grep -q UPLOADING "$T/up.out" && break; sleep 0.1; done
grep -q UPLOADING "$T/up.out" || fail "upload-hang not admitted: $(cat "$T/up.out")"
$U2 "$HOSTILE" -s "$S" --seconds 6 hold 4 --hello >"$T/h2.out" 2>&1 &
H2=$!
for i in $(seq 1 100); do grep -q HELD "$T/h2.out" && break; sleep 0.1; done
grep -q "HELD 1 refused 3" "$T/h2.out" || fail "reserved slots: $(cat "$T/h2.out")"
grep -q "code=-1004 .*too many clients" "$T/h2.out" || fail "reserved slots: no IPC_ERR_LIMIT: $(cat "$T/h2.out")"
timeout 10 "$RAW" -s "$S" stats >"$T/stats.json" 2>&1 || fail "root's STATS refused with every non-admin slot taken: $(cat "$T/stats.json")"
ok "with every non-administrator slot taken, root still gets STATS (admin_reserved_clients)"
wait "$UP"
grep -q "UPLOADING" "$T/up.out" && grep -q "^OPEN" "$T/up.out" ||
	fail "a connection with a request in flight was closed as idle (or never admitted): $(cat "$T/up.out")"
wait "$H2"
grep -q "CLOSED_BY_DAEMON 1" "$T/h2.out" || fail "idle connections not closed after idle_timeout: $(cat "$T/h2.out")"
ok "idle connections closed after server.idle_timeout; one with a request in flight kept"
$U2 "$RAW" -s "$S" hello >"$T/again.out" 2>&1 || fail "uid 65533 not admitted after its idle connections went: $(cat "$T/again.out")"
wait "$H1"
ok "slots come back once idle connections are closed"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
