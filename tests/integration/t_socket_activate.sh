#!/usr/bin/env bash
# t_socket_activate.sh — kvd under systemd-socket-activate with a stand-in
# notification socket (notify_recv.py), on the default model.
#
#   - activation: kvd is started by the first connection, on the socket it
#     is handed (LISTEN_FDS), and nothing is sent to NOTIFY_SOCKET before
#   - READY=1 once the model is loaded and the socket is live; STATUS= while
#     loading and while serving; WATCHDOG=1 pings at about half WATCHDOG_USEC
#   - a generation through the activated socket
#   - SIGHUP: RELOADING=1 then READY=1, what changed is applied, what needs a
#     restart is logged as such
#   - SIGTERM: STOPPING=1, new connections refused, a running request ends
#     with an ERROR IPC_ERR_SHUTDOWN after drain_timeout (never silence), and
#     kvd exits 0
# test-run: alone (a request must still be running at the drain timeout)
source "$(dirname "$0")/lib.sh"
need_bins
command -v systemd-socket-activate >/dev/null || skip "systemd-socket-activate not installed"
MODEL=$REAL_MODEL
[ -f "$MODEL" ] || MODEL=$(tiny_model gqa)

S=$T/kvd.sock
N=$T/notify.sock
NL=$T/notify.txt
$PY "$ROOT/tests/integration/notify_recv.py" "$N" "$NL" &
PIDS+=($!)
for i in $(seq 1 50); do [ -S "$N" ] && break; sleep 0.1; done
[ -S "$N" ] || fail "notify receiver did not start"

C=$T/kvd.conf
printf '[model]\npath = %s\n[kv]\npool_size = 64M\n[server]\ndrain_timeout = 1\n[log]\nlevel = info\n' "$MODEL" >"$C"
NOTIFY_SOCKET=$N WATCHDOG_USEC=400000 systemd-socket-activate --seqpacket -l "$S" \
	-E NOTIFY_SOCKET -E WATCHDOG_USEC "$KVD" --config "$C" 2>"$T/kvd.log" &
SA_PID=$!
PIDS+=($SA_PID)
for i in $(seq 1 50); do [ -S "$S" ] && break; sleep 0.1; done
[ -S "$S" ] || fail "systemd-socket-activate did not listen"
sleep 1
[ ! -s "$NL" ] || fail "kvd notified before the first connection: $(cat "$NL")"
ok "nothing started before the first connection"

"$RAW" -s "$S" hello >"$T/hello.out" 2>&1 || fail "first connection: $(cat "$T/hello.out")"
grep -q "listening on the socket passed by the service manager" "$T/kvd.log" || fail "kvd did not use the passed socket"
for i in $(seq 1 50); do grep -q " READY=1$" "$NL" && break; sleep 0.05; done # the receiver may lag
grep -q " READY=1$" "$NL" || fail "no READY=1"
grep -q " STATUS=loading model" "$NL" || fail "no STATUS while loading"
ready_t=$(awk '$2 == "READY=1" { print $1; exit }' "$NL")
load_t=$(awk '$2 ~ /^STATUS=loading/ { print $1; exit }' "$NL")
awk -v a="$load_t" -v b="$ready_t" 'BEGIN { exit !(a <= b) }' || fail "READY=1 before the loading STATUS"
ok "activated by the first connection: STATUS=loading at ${load_t}s, READY=1 at ${ready_t}s"

"$RAW" -s "$S" generate -n 12 "Hello!" >"$T/gen.out" 2>"$T/gen.err" || fail "generate: $(cat "$T/gen.err")"
[ -s "$T/gen.out" ] || fail "generate printed nothing"
sleep 1.5
grep -q " STATUS=serving: " "$NL" || fail "no STATUS=serving line"
w=$(grep -c " WATCHDOG=1$" "$NL")
[ "$w" -ge 4 ] || fail "only $w WATCHDOG=1 pings in about 2.5 s with WATCHDOG_USEC=400000"
ok "serving: $(grep ' STATUS=serving' "$NL" | tail -1 | cut -d' ' -f2-); $w watchdog pings"

# SIGHUP: a change applied now, one that needs a restart
KVD_PID=$(pgrep -P "$SA_PID" -x kvd || echo "$SA_PID") # socket-activate execs kvd in place
grep -qa kvd "/proc/$KVD_PID/cmdline" || fail "cannot find kvd's pid"
printf '[model]\npath = %s\n[kv]\npool_size = 64M\nblock_size = 32\n[server]\ndrain_timeout = 1\nmax_requests_per_client = 3\n[log]\nlevel = info\n' "$MODEL" >"$C"
n0=$(grep -c " READY=1$" "$NL")
kill -HUP "$KVD_PID"
for i in $(seq 1 50); do [ "$(grep -c " READY=1$" "$NL")" -gt "$n0" ] && break; sleep 0.1; done
grep -q " RELOADING=1$" "$NL" || fail "no RELOADING=1 on SIGHUP"
[ "$(grep -c " READY=1$" "$NL")" -gt "$n0" ] || fail "no READY=1 after the reload"
grep -q "kv.block_size changed; it takes effect only after a restart" "$T/kvd.log" || fail "restart-only change not reported"
grep -q "configuration reloaded: .*max_requests_per_client 3" "$T/kvd.log" || fail "reload not applied"
ok "SIGHUP: RELOADING=1 / READY=1, max_requests_per_client applied, block_size reported as needing a restart"

# SIGHUP with a broken file: the error is logged as file:line, kvd keeps serving
cp "$C" "$T/good.conf"
printf '[server]\nno_such_key = 1\n' >>"$C"
kill -HUP "$KVD_PID"
for i in $(seq 1 50); do grep -q "reload failed" "$T/kvd.log" && break; sleep 0.1; done
grep -q "reload: $C:[0-9]*: unknown key 'no_such_key'" "$T/kvd.log" || fail "broken reload not reported as file:line"
grep -q "reload failed; the running configuration stays" "$T/kvd.log" || fail "broken reload not refused"
"$RAW" -s "$S" hello >/dev/null 2>&1 || fail "kvd stopped serving after a broken reload"
cp "$T/good.conf" "$C"
ok "SIGHUP with an unknown key: '$C:N: unknown key' logged, configuration kept, still serving"

# SIGTERM while a request runs: it gets an ERROR IPC_ERR_SHUTDOWN after drain_timeout
"$RAW" -s "$S" generate -n 2000 "Write a very long story about the sea." >/dev/null 2>"$T/long.err" &
LP=$!
for i in $(seq 1 100); do [ "$("$RAW" -s "$S" stats 2>/dev/null | $PY -c 'import json,sys; print(json.load(sys.stdin)["requests_running"])')" = 1 ] && break; sleep 0.05; done
kill -TERM "$KVD_PID"
sleep 0.3
"$RAW" -s "$S" hello >/dev/null 2>&1 && echo "note: a connection after SIGTERM was still queued by the activator"
wait "$LP"; rc=$?
[ $rc = 2 ] || fail "running request: exit $rc, expected an ERROR ($(cat "$T/long.err"))"
grep -q "code=-1003" "$T/long.err" || fail "running request did not get IPC_ERR_SHUTDOWN: $(cat "$T/long.err")"
wait "$SA_PID"; rc=$?
[ $rc = 0 ] || fail "kvd exit status $rc after SIGTERM"
grep -q " STOPPING=1$" "$NL" || fail "no STOPPING=1"
ok "SIGTERM: STOPPING=1, the running request ended with IPC_ERR_SHUTDOWN after the drain timeout, exit 0"
exit 0
