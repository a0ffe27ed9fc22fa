#!/usr/bin/env bash
# t_http_slowloris.sh — kvd-http against clients that send or read too slowly.
#
# Checked, with kvd-http at max_connections = 64, request_timeout = 3 and
# client_timeout = 3:
#   - slowloris: 64 sockets take every connection slot and trickle one
#     header line each second (each byte resets libmicrohttpd's idle
#     timeout); every one is closed by the absolute request deadline (within
#     request_timeout plus a margin), and a normal client that keeps trying
#     is served within a few seconds;
#   - a stream whose client stops reading (a 4 KiB receive buffer, never
#     read) is cut after client_timeout without progress, long before its
#     max_tokens, and its request is cancelled in kvd (requests_running
#     back to 0, counted in /metrics).
# test-run: alone (measures how long connections are held)
source "$(dirname "$0")/lib.sh"
need_bins
HTTPD=${KVD_HTTP:-$ROOT/$BUILD/bin/kvd-http}
[ -x "$HTTPD" ] || skip "$HTTPD not built (libmicrohttpd-dev / libjansson-dev missing: run scripts/setup)"
command -v curl >/dev/null || skip "curl not installed"
[ -f "$REAL_MODEL" ] || skip "default model missing (run scripts/setup)"

S=$T/kvd.sock
printf '[log]\nledger = %s\n' "$T/ledger.jsonl" >"$T/kvd.conf"
start_kvd kvd "$S" --config "$T/kvd.conf" --model "$REAL_MODEL" --threads 2
PORT=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
B=http://127.0.0.1:$PORT
"$HTTPD" --kvd-socket "$S" --listen "127.0.0.1:$PORT" --max-connections 64 --request-timeout 3 \
	--client-timeout 3 2>"$T/http.log" &
PIDS+=($!)
for i in $(seq 1 100); do
	[ "$(curl -s -o /dev/null -w '%{http_code}' "$B/health")" = 200 ] && break
	sleep 0.1
done

$PY - "$PORT" <<'PYEOF' || fail "slowloris"
import socket, sys, threading, time, http.client
port = int(sys.argv[1])
socks = []
for i in range(64):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    s.setblocking(False)
    socks.append(s)
t0 = time.time()
closed = {}
served_at = None
while time.time() - t0 < 15 and (len(closed) < len(socks) or served_at is None):
    for i, s in enumerate(socks):
        if i in closed:
            continue
        try:
            if s.recv(4096) == b"":
                closed[i] = time.time() - t0
                continue
        except BlockingIOError:
            pass
        except OSError:
            closed[i] = time.time() - t0
            continue
        try:
            s.send(b"X-Trickle-%d: %d\r\n" % (i, int(time.time() * 10)))
        except OSError:
            closed[i] = time.time() - t0
    if served_at is None:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                served_at = time.time() - t0
            c.close()
        except (OSError, http.client.HTTPException):
            pass
    time.sleep(1)
assert len(closed) == len(socks), f"only {len(closed)} of {len(socks)} trickling sockets were closed in 15 s"
assert max(closed.values()) < 9, f"trickling sockets closed after {max(closed.values()):.1f} s (request_timeout 3)"
assert served_at is not None and served_at < 10, f"a normal client was not served in 10 s ({served_at})"
print(f"ok: 64 trickling sockets closed {min(closed.values()):.1f} .. {max(closed.values()):.1f} s after they "
      f"started (request_timeout 3 s); a normal client served {served_at:.1f} s in")
PYEOF

stat() { "$KVCTL" --socket "$S" stats --json 2>/dev/null | $PY -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
$PY - "$PORT" <<'PYEOF' &
import socket, sys, time
port = int(sys.argv[1])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect(("127.0.0.1", port))
body = b'{"prompt":"Here is a very long story about a dragon.","max_tokens":4000,"temperature":0,"stream":true}'
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
          % (len(body), body))
s.recv(512)      # the headers and the first event, then nothing more
time.sleep(60)
PYEOF
READER=$!
PIDS+=($READER)
for i in $(seq 1 100); do [ "$(stat_of "$S" requests_running)" = 1 ] && break; sleep 0.1; done
[ "$(stat_of "$S" requests_running)" = 1 ] || fail "the unread stream is not running"
t0=$(date +%s.%N)
wait_stat "$S" requests_running 0 25 || fail "a stream nobody reads still runs in kvd after 25 s (client_timeout 3)"
dt=$($PY -c "import time; print(f'{time.time() - $t0:.1f}')")
$PY -c "import sys; sys.exit(0 if $dt < 20 else 1)" || fail "a stream nobody reads was cut only after $dt s (client_timeout 3)"
fin=$(tail -1 "$T/ledger.jsonl" | $PY -c 'import json,sys; r = json.load(sys.stdin); print(r["finish"], r.get("generated_tokens"))')
[ "${fin%% *}" = cancelled ] || fail "the unread stream ended '$fin' after $dt s, not cancelled"
gen=$(curl -s "$B/metrics" | sed -n 's/^kvd_http_unread_streams_total //p')
[ "${gen:-0}" -ge 1 ] || fail "/metrics: kvd_http_unread_streams_total is '${gen}'"
kill "$READER" 2>/dev/null
ok "a stream whose client stopped reading was cut $dt s after it started (client_timeout 3 s) and cancelled in kvd (ledger: $fin tokens)"
