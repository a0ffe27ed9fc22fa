#!/usr/bin/env bash
# t_http.sh — kvd-http, the OpenAI-compatible gateway, with real clients.
#
# kvd runs the default model (SmolLM2-135M); kvd-http runs in front of it
# with an API key. Checked:
#   - the official `openai` Python package (tests/http/openai_check.py):
#     chat and completions, streaming and not, stream_options.include_usage,
#     cached_tokens from the prefix cache, a multi-turn conversation whose
#     cached_tokens grows turn by turn, stop strings, 32 concurrent greedy
#     streams equal to their solo runs, errors as exception classes; n
#     and logprobs / top_logprobs (tests/http/samples_check.py)
#   - a conversation with earlier turns gives the same prompt and answer
#     through kvd-http (streamed or not) as through kvctl chat
#   - curl: server-sent events ending in "data: [DONE]" whose text equals
#     the non-streamed answer; status codes 400 / 401 / 404 / 405 / 413 / 431;
#     /health without a key; /metrics in Prometheus text
#   - an HTTP client that disconnects mid-stream (and one that gives up on a
#     non-streamed answer, and one streaming n = 3 choices): kvd's used pages
#     return to their baseline
#     (kvctl stats --json), the ledger says "cancelled", /metrics counts it
#   - a client that sends its headers too slowly is cut off (client_timeout)
#   - connections beyond max_connections are refused
#   - socket activation: systemd-socket-activate hands kvd-http its socket
#   - systemd-analyze verify accepts kvd-http.service and kvd-http.socket,
#     and rates the service's exposure "OK"; --help lists every key of
#     etc/kvd-http.conf, which kvd-http accepts as shipped
# test-run: long
source "$(dirname "$0")/lib.sh"
need_bins
HTTPD=${KVD_HTTP:-$ROOT/$BUILD/bin/kvd-http} # KVD_HTTP: another build (e.g. under ASan)
VPY=$ROOT/.venv/bin/python
[ -x "$HTTPD" ] || skip "$HTTPD not built (libmicrohttpd-dev / libjansson-dev missing: run scripts/setup)"
[ -x "$KVCTL" ] || skip "$KVCTL not built"
command -v curl >/dev/null || skip "curl not installed"
[ -x "$VPY" ] && "$VPY" -c 'import openai' 2>/dev/null || skip "the openai package is not in .venv (run scripts/setup)"
[ -f "$REAL_MODEL" ] || skip "default model missing (run scripts/setup)"

# ---- the shipped files
if command -v systemd-analyze >/dev/null; then
	mkdir -p "$T/units" "$T/bin"
	cp "$HTTPD" "$T/bin/kvd-http"
	cp systemd/kvd-http.socket "$T/units/"
	sed "s|^ExecStart=[^ ]*|ExecStart=$T/bin/kvd-http|" systemd/kvd-http.service >"$T/units/kvd-http.service"
	(cd "$T/units" && systemd-analyze verify ./kvd-http.service ./kvd-http.socket) >"$T/verify.out" 2>&1 ||
		fail "systemd-analyze verify: $(cat "$T/verify.out")"
	[ ! -s "$T/verify.out" ] || fail "systemd-analyze verify warned: $(cat "$T/verify.out")"
	grep -qx 'ListenStream=127.0.0.1:8484' systemd/kvd-http.socket || fail "kvd-http.socket is not on loopback:8484"
	exposure=$(cd "$T/units" && systemd-analyze security --offline=yes ./kvd-http.service 2>/dev/null |
		sed -n 's/.*Overall exposure level for kvd-http.service: \([0-9.]*\).*/\1/p')
	[ -n "$exposure" ] && $PY -c "import sys; sys.exit(0 if float('$exposure') < 4 else 1)" ||
		fail "kvd-http.service exposure '$exposure' (wanted < 4)"
	ok "systemd-analyze verify kvd-http.service kvd-http.socket; exposure $exposure"
else
	echo "note: systemd-analyze not installed; unit files not verified"
fi
"$HTTPD" --help >"$T/help.out" || fail "kvd-http --help"
for k in $(sed -n 's/^\([a-z_]*\) =.*/\1/p' etc/kvd-http.conf); do
	grep -q "^    $k = " "$T/help.out" || fail "--help does not list $k"
done
"$HTTPD" --config etc/kvd-http.conf --listen 127.0.0.1:1 --version >/dev/null || fail "etc/kvd-http.conf refused"
printf '[http]\nmax_body_bytes = lots\n' >"$T/bad.conf"
"$HTTPD" --config "$T/bad.conf" 2>"$T/bad.err"; rc=$?
[ $rc = 78 ] && grep -q 'bad.conf:2:' "$T/bad.err" || fail "a bad config: exit $rc, $(cat "$T/bad.err")"
ok "--help lists every key of etc/kvd-http.conf; the file loads; a bad value exits 78 naming its line"

free_port() { $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

S=$T/kvd.sock
printf '[log]\nledger = %s\n' "$T/ledger.jsonl" >"$T/kvd.conf"
start_kvd kvd "$S" --config "$T/kvd.conf" --model "$REAL_MODEL" --max-num-seqs 64 --threads 2
KEY=sk-test-$RANDOM$RANDOM
printf '%s\n' "$KEY" >"$T/key"
PORT=$(free_port)
B=http://127.0.0.1:$PORT

# start_http NAME ARGS... : kvd-http in the background, ready when /health answers
start_http() {
	local name=$1; shift
	"$HTTPD" --kvd-socket "$S" "$@" 2>"$T/$name.log" &
	HTTP_PID=$!
	PIDS+=("$HTTP_PID")
}
wait_health() { # URL
	local i
	for i in $(seq 1 100); do
		[ "$(curl -s -o /dev/null -w '%{http_code}' "$1/health")" = 200 ] && return 0
		sleep 0.1
	done
	fail "kvd-http not healthy at $1"
}
start_http http --listen "127.0.0.1:$PORT" --api-key-file "$T/key"
MAIN_HTTP=$HTTP_PID
wait_health "$B"
AUTH=(-H "Authorization: Bearer $KEY")
MODEL=$(curl -sf "${AUTH[@]}" "$B/v1/models" | $PY -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])') ||
	fail "GET /v1/models"
ok "kvd-http on 127.0.0.1:$PORT serves '$MODEL'"

# ---- the official openai package
"$VPY" "$ROOT/tests/http/openai_check.py" "$B/v1" "$KEY" "$MODEL" || fail "openai client checks"
# n and log-probabilities
"$VPY" "$ROOT/tests/http/samples_check.py" "$B/v1" "$KEY" "$MODEL" "$KVCTL" "$S" || fail "n / logprobs checks"

# ---- curl: SSE
REQ='{"messages":[{"role":"user","content":"Why is the sky blue?"}],"max_tokens":24,"temperature":0'
curl -sfN "${AUTH[@]}" -D "$T/sse.h" "$B/v1/chat/completions" -d "$REQ,\"stream\":true}" >"$T/sse.out" ||
	fail "curl stream"
curl -sf "${AUTH[@]}" "$B/v1/chat/completions" -d "$REQ}" >"$T/whole.json" || fail "curl non-stream"
grep -qi '^content-type: text/event-stream' "$T/sse.h" || fail "SSE content type: $(cat "$T/sse.h")"
$PY - "$T/sse.out" "$T/whole.json" <<'PYEOF' || fail "SSE stream malformed"
import json, sys
raw = open(sys.argv[1]).read()
assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
events = [e for e in raw.split("\n\n") if e]
assert all(e.startswith("data: ") for e in events), events
chunks = [json.loads(e[6:]) for e in events[:-1]]
text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
whole = json.load(open(sys.argv[2]))
assert text == whole["choices"][0]["message"]["content"], (text, whole)
assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
assert len({c["id"] for c in chunks}) == 1
PYEOF
ok "curl: SSE ends in data: [DONE], its text equals the non-streamed answer"

# ---- a conversation with earlier turns: the same prompt and answer as kvctl chat
CONV='[{"role":"system","content":"Be brief."},{"role":"user","content":"Name a colour."},
{"role":"assistant","content":"Blue."},{"role":"user","content":"Name another one."}]'
curl -sf "${AUTH[@]}" "$B/v1/chat/completions" -d "{\"messages\":$CONV,\"max_tokens\":16,\"temperature\":0}" \
	>"$T/conv.json" || fail "curl multi-turn chat"
curl -sfN "${AUTH[@]}" "$B/v1/chat/completions" \
	-d "{\"messages\":$CONV,\"max_tokens\":16,\"temperature\":0,\"stream\":true}" >"$T/conv.sse" ||
	fail "curl multi-turn chat, streamed"
echo "$CONV" | KVD_SOCKET=$S "$KVCTL" chat --max-tokens 16 --temperature 0 --json >"$T/conv.kvctl" ||
	fail "kvctl chat: $(cat "$T/conv.kvctl")"
$PY - "$T/conv.json" "$T/conv.sse" "$T/conv.kvctl" <<'PYEOF' || fail "multi-turn chat through kvd-http differs from kvctl chat"
import json, sys
http = json.load(open(sys.argv[1]))
sse = [json.loads(e[6:]) for e in open(sys.argv[2]).read().split("\n\n") if e.startswith("data: {")]
kv = json.load(open(sys.argv[3]))
text = http["choices"][0]["message"]["content"]
assert text and text == kv["text"], (http, kv)
assert "".join(c["choices"][0]["delta"].get("content") or "" for c in sse) == text, sse
assert http["usage"]["prompt_tokens"] == kv["prompt_tokens"], (http["usage"], kv)
print(f"ok: a 4-message conversation: {text!r} ({kv['prompt_tokens']} prompt tokens), the same through kvd-http "
      "(streamed or not) and kvctl chat")
PYEOF

# ---- status codes
code() { curl -s -o "$T/code.out" -w '%{http_code}' "$@"; }
is_error() { $PY -c 'import json,sys; e = json.load(open(sys.argv[1]))["error"]; assert e["message"] and e["type"]' "$T/code.out" ||
	fail "not an OpenAI error object: $(cat "$T/code.out")"; }
[ "$(code "$B/v1/chat/completions" -d "$REQ}")" = 401 ] || fail "no key: not 401"; is_error
[ "$(code -H "Authorization: Bearer x$KEY" "$B/v1/models")" = 401 ] || fail "wrong key: not 401"; is_error
[ "$(code "${AUTH[@]}" "$B/v1/chat/completions" -d '{"messages": [')" = 400 ] || fail "bad JSON: not 400"; is_error
[ "$(code "${AUTH[@]}" "$B/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"temperature":7}')" = 400 ] ||
	fail "temperature 7: not 400"; is_error
[ "$(code "${AUTH[@]}" "$B/v1/completions" -d '{"prompt":"x","model":"gpt-4"}')" = 404 ] || fail "unknown model: not 404"; is_error
[ "$(code "${AUTH[@]}" "$B/v2/nothing")" = 404 ] || fail "unknown URL: not 404"; is_error
[ "$(code "${AUTH[@]}" -X PUT "$B/v1/models")" = 405 ] || fail "PUT: not 405"; is_error
$PY -c 'import json; print(json.dumps({"prompt": "a" * (1 << 20)}))' >"$T/big.json"
[ "$(code "${AUTH[@]}" "$B/v1/completions" --data-binary @"$T/big.json")" = 413 ] || fail "1 MiB body: not 413"; is_error
[ "$(code "${AUTH[@]}" -H 'Transfer-Encoding: chunked' "$B/v1/completions" --data-binary @"$T/big.json")" = 413 ] ||
	fail "1 MiB chunked body: not 413"; is_error
[ "$(code "${AUTH[@]}" -H "X-Pad: $(head -c 40000 /dev/zero | tr '\0' x)" "$B/v1/models")" = 431 ] ||
	fail "40 KB header: not 431"
[ "$(code "$B/health")" = 200 ] || fail "/health without a key: not 200"
curl -sf "${AUTH[@]}" "$B/metrics" >"$T/metrics" || fail "/metrics"
for m in 'kvd_up 1' 'kvd_pages_total [0-9]+' 'kvd_prefix_hit_tokens_total [1-9]' 'kvd_http_responses_total\{code="401"\} [1-9]' \
	'kvd_http_responses_total\{code="413"\} 2' 'kvd_http_generations_total\{endpoint="chat"\} [1-9]'; do
	grep -qxE "$m[0-9]*" "$T/metrics" || fail "/metrics lacks '$m'"
done
$PY - "$T/metrics" <<'PYEOF' || fail "/metrics is not Prometheus text"
import re, sys
for l in open(sys.argv[1]):
    l = l.rstrip("\n")
    assert l.startswith("# HELP ") or l.startswith("# TYPE ") or re.fullmatch(r'[a-z_][a-z0-9_]*(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? [0-9.e+-]+', l), l
PYEOF
ok "401 / 400 / 404 / 405 / 413 (sized and chunked) / 431 as OpenAI errors; /health open; /metrics Prometheus text"

# ---- disconnect mid-stream: the request is cancelled, pages come back
pages() { KVD_SOCKET=$S "$KVCTL" stats --json | $PY -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
wait_pages() { # KEY VALUE
	local i v
	for i in $(seq 1 50); do v=$(pages "$1"); [ "$v" = "$2" ] && return 0; sleep 0.1; done
	echo "$1 is $v, expected $2" >&2; return 1
}
base_used=$(pages pages_used)
[ "$base_used" = 0 ] || fail "pages_used is $base_used before the disconnect test"
LONG='{"prompt":"Here is a very long story about a dragon.","max_tokens":4000,"temperature":0,"stream":true}'
for how in stream whole samples; do
	body=$LONG; running=1
	[ $how = whole ] && body=${LONG/,\"stream\":true/}
	[ $how = samples ] && { body=${LONG/\"stream\":true/\"stream\":true,\"n\":3}; running=3; } # three forked samples
	curl -sN "${AUTH[@]}" "$B/v1/completions" -d "$body" >"$T/dis.out" 2>/dev/null &
	CP=$!
	for i in $(seq 1 100); do [ "$(pages requests_running)" = $running ] && break; sleep 0.05; done
	[ "$(pages requests_running)" = $running ] || fail "$how: the long request is not running"
	sleep 0.5
	used=$(pages pages_used)
	[ "$used" -gt 0 ] || fail "$how: no pages used mid-generation"
	kill -KILL $CP; wait $CP 2>/dev/null
	wait_pages pages_used "$base_used" || fail "$how: pages not freed after the HTTP client left"
	wait_pages requests_running 0 || fail "$how: request still running"
	[ "$(tail -1 "$T/ledger.jsonl" | $PY -c 'import json,sys; print(json.load(sys.stdin)["finish"])')" = cancelled ] ||
		fail "$how: ledger: $(tail -1 "$T/ledger.jsonl")"
	[ $how != whole ] && { grep -q '^data: ' "$T/dis.out" || fail "$how: nothing streamed before the disconnect"; }
	ok "$how: HTTP client left mid-generation -> cancelled in kvd, pages_used $used -> $base_used"
done
grep -qx 'kvd_http_client_disconnects_total 3' <<<"$(curl -sf "${AUTH[@]}" "$B/metrics")" || fail "/metrics: disconnects not counted"
# the gateway still serves, and its pooled kvd connections are healthy
curl -sf "${AUTH[@]}" "$B/v1/completions" -d '{"prompt":"hello","max_tokens":4}' >/dev/null || fail "serving after disconnects"

# ---- kvd's limits and absence: 429, 400 context_length_exceeded, 503
TINY=$(tiny_model gqa)
S2=$T/kvd2.sock
printf '[scheduler]\nmax_num_seqs = 1\nmax_waiting = 1\n' >"$T/kvd2.conf"
start_kvd kvd2 "$S2" --config "$T/kvd2.conf" --model "$TINY" --threads 1
P4=$(free_port)
"$HTTPD" --kvd-socket "$S2" --listen "127.0.0.1:$P4" 2>"$T/http4.log" &
PIDS+=($!)
wait_health "http://127.0.0.1:$P4"
# six requests at once (a barrier: the tiny model answers one in ~0.1 s)
$PY tests/http/burst.py "http://127.0.0.1:$P4" 6 300 60 >"$T/q.json" || fail "burst.py"
read -r n200 n429 <<<"$($PY -c 'import json,sys; r = json.load(open(sys.argv[1])); c = r["codes"]
assert set(c) <= {"200", "429"} and set(r["errors"]) <= {"429:rate_limit_exceeded"}, r
print(c.get("200", 0), c.get("429", 0))' "$T/q.json")" || fail "queue full: $(cat "$T/q.json")"
[ "$n429" -ge 1 ] && [ "$n200" -ge 1 ] || fail "queue full: $(cat "$T/q.json")"
CTX=$(curl -sf "http://127.0.0.1:$P4/v1/models" | $PY -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["max_model_len"])') ||
	fail "/v1/models without max_model_len"
for mt in $CTX $((CTX + 1)); do
	[ "$(code "http://127.0.0.1:$P4/v1/completions" -d "{\"prompt\":\"x y z\",\"max_tokens\":$mt}")" = 400 ] ||
		fail "max_tokens $mt with a context of $CTX: not 400 ($(cat "$T/code.out"))"
	grep -q '"code":"context_length_exceeded"' "$T/code.out" || fail "context overflow: $(cat "$T/code.out")"
done
stop_kvd "$KVD_PID"
[ "$(code "http://127.0.0.1:$P4/v1/completions" -d '{"prompt":"x"}')" = 503 ] || fail "kvd down: not 503"; is_error
[ "$(code "http://127.0.0.1:$P4/health")" = 503 ] || fail "/health with kvd down: not 503"
ok "kvd's queue full ($n429 of 6) -> 429 rate_limit_exceeded; prompt + max_tokens beyond the context ($CTX) -> 400 context_length_exceeded; kvd down -> 503"

# ---- slow client, connection limit (two more instances with tight limits: a
# one-second client_timeout would also cut the idle connections that fill the
# connection limit if the machine is slow, so the limit gets its own instance)
P2=$(free_port)
start_http tight --listen "127.0.0.1:$P2" --client-timeout 1
P2B=$(free_port)
start_http limit --listen "127.0.0.1:$P2B" --max-connections 2 --client-timeout 60
wait_health "http://127.0.0.1:$P2"
wait_health "http://127.0.0.1:$P2B"
$PY - "$P2" "$P2B" <<'PYEOF' || fail "limits"
import socket, sys, time
port, port_limit = int(sys.argv[1]), int(sys.argv[2])
# a client that sends half a request line and stalls is cut off
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"GET /hea")
t0 = time.time()
s.settimeout(10)
assert s.recv(1024) == b"", "slow client got data"
dt = time.time() - t0
assert 0.5 < dt < 5, dt
s.close()
# two idle connections fill max_connections = 2: a third is closed unanswered
a = socket.create_connection(("127.0.0.1", port_limit)); b = socket.create_connection(("127.0.0.1", port_limit))
time.sleep(0.3)
c = socket.create_connection(("127.0.0.1", port_limit))
c.settimeout(5)
c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
try:
    got = c.recv(1024)
except ConnectionResetError:
    got = b""
assert got == b"", got
# and once one of the two goes, a new connection is served
a.close(); c.close()
for i in range(50):
    d = socket.create_connection(("127.0.0.1", port_limit))
    d.settimeout(5)
    try:
        d.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        got = d.recv(1024)
    except (ConnectionResetError, BrokenPipeError):
        got = b""
    d.close()
    if got.startswith(b"HTTP/1.1 200"):
        break
    time.sleep(0.1)
assert got.startswith(b"HTTP/1.1 200"), got
b.close()
print(f"ok: a stalled client was cut off after {dt:.1f} s; a third connection over max_connections = 2 was refused, and served once one closed")
PYEOF

# ---- socket activation
P3=$(free_port)
systemd-socket-activate -l "127.0.0.1:$P3" "$HTTPD" --kvd-socket "$S" --listen 127.0.0.1:1 2>"$T/activated.log" &
PIDS+=($!)
wait_health "http://127.0.0.1:$P3"
for i in $(seq 1 50); do grep -q "socket from systemd" "$T/activated.log" && break; sleep 0.1; done
grep -q "socket from systemd" "$T/activated.log" || fail "activated kvd-http did not use the passed socket"
ok "socket activation: kvd-http serves on the socket systemd passed (sd_listen_fds)"

# ---- clean stop
kill -TERM "$MAIN_HTTP"; wait "$MAIN_HTTP"; rc=$?
[ $rc = 0 ] || fail "kvd-http exited $rc on SIGTERM"
ok "SIGTERM: kvd-http exits 0"
