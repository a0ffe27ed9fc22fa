#!/usr/bin/env bash
# t_http_burst.sh — kvd-http's capacity: many HTTP requests over few kvd connections.
#
# kvd caps every user at [server] max_clients_per_user connections (32 by
# default), and kvd-http is one user. Checked:
#   - 200 concurrent short requests through one kvd-http, against kvd's
#     defaults, are all served (200): kvd-http carries them over at most
#     kvd_connections connections, up to kvd's max_requests_per_client
#     each, and queues the rest; kvd's ps shows it never held more than
#     kvd_connections connections (kvd-http runs as uid 65534: root is
#     exempt from the per-user cap)
#   - beyond its bounded queue (max_queued) a request gets 429
#     rate_limit_exceeded — never 503: with kvd_connections = 1 and
#     max_queued = 4, 40 concurrent requests give only 200s and 429s
# test-run: alone (measures queueing under a burst)
source "$(dirname "$0")/lib.sh"
need_bins
HTTPD=${KVD_HTTP:-$ROOT/$BUILD/bin/kvd-http}
[ -x "$HTTPD" ] || skip "$HTTPD not built (libmicrohttpd-dev / libjansson-dev missing: run scripts/setup)"
command -v curl >/dev/null || skip "curl not installed"
[ -f "$REAL_MODEL" ] || skip "default model missing (run scripts/setup)"

# kvd-http runs as a plain user, as deployed (root and admins are exempt
# from max_clients_per_user)
AS=()
if [ "$(id -u)" = 0 ]; then
	command -v setpriv >/dev/null || skip "setpriv missing (needed to run kvd-http as a non-root uid)"
	AS=(setpriv --reuid=65534 --regid=65534 --clear-groups)
fi
S=$T/kvd.sock
printf '[server]\nsocket_mode = 0666\n' >"$T/kvd.conf"
start_kvd kvd "$S" --config "$T/kvd.conf" --model "$REAL_MODEL" --threads 2
free_port() { $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_health() {
	local i
	for i in $(seq 1 100); do
		[ "$(curl -s -o /dev/null -w '%{http_code}' "$1/health")" = 200 ] && return 0
		sleep 0.1
	done
	fail "kvd-http not healthy at $1"
}

PORT=$(free_port)
"${AS[@]}" "$HTTPD" --kvd-socket "$S" --listen "127.0.0.1:$PORT" 2>"$T/http.log" &
PIDS+=($!)
wait_health "http://127.0.0.1:$PORT"
# the most connections kvd sees at once, sampled while the burst runs
( m=0; while :; do
	c=$(stat_of "$S" clients 2>/dev/null) && [ "${c:-0}" -gt "$m" ] && { m=$c; echo "$m" >"$T/maxclients"; }
	sleep 0.2
done ) &
MON=$!
PIDS+=($MON)
$PY tests/http/burst.py "http://127.0.0.1:$PORT" 200 4 90 >"$T/burst.json" || fail "burst.py"
kill $MON 2>/dev/null
$PY - "$T/burst.json" <<'PYEOF' || fail "200 concurrent requests: $(cat "$T/burst.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["codes"] == {"200": 200}, r
PYEOF
maxc=$(cat "$T/maxclients" 2>/dev/null || echo 0)
# kvd-http's connections (4 by default), plus the monitor's own
[ "$maxc" -le 5 ] || fail "kvd saw $maxc connections at once (kvd_connections is 4)"
ok "200 concurrent requests: all 200 ($(cat "$T/burst.json")); kvd saw at most $maxc connections"

# a small gateway: 1 kvd connection (16 in flight) + 4 queued; 40 at once
P2=$(free_port)
"${AS[@]}" "$HTTPD" --kvd-socket "$S" --listen "127.0.0.1:$P2" --kvd-connections 1 --max-queued 4 2>"$T/http2.log" &
PIDS+=($!)
wait_health "http://127.0.0.1:$P2"
$PY tests/http/burst.py "http://127.0.0.1:$P2" 40 48 90 >"$T/small.json" || fail "burst.py (small)"
$PY - "$T/small.json" <<'PYEOF' || fail "40 requests at a gateway of 16 + 4: $(cat "$T/small.json")"
import json, sys
r = json.load(open(sys.argv[1]))
c = r["codes"]
assert set(c) <= {"200", "429"}, r
assert c.get("200", 0) >= 20 and c.get("429", 0) >= 1, r
assert set(r["errors"]) <= {"429:rate_limit_exceeded"}, r
PYEOF
ok "40 requests at kvd_connections = 1, max_queued = 4: $(cat "$T/small.json") (429 only beyond the queue, no 503)"
