#!/usr/bin/env bash
# t_gateway_fair.sh — behind kvd-http, one API key flooding cannot starve
# another. kvd trusts kvd-http's user ([server] gateway_users = 65534), so
# each tenant kvd-http names (one per API key) is an owner of its own in
# kvd's fair scheduler. Key A sends FLOODERS concurrent long completions
# (max_tokens 1000) into a 68-page pool, so the pool is full and A's
# requests preempt each other; key B then sends a short one, which must
# finish within LIMIT_FACTOR times its idle time plus a margin for this
# shared machine, with the same text as alone. Without gateway_users every
# HTTP request is kvd-http's one uid and B's request waits behind the whole
# flood (GATEWAY_OFF=1 runs that case and expects the limit to be missed).
# test-run: alone (fairness between owners is measured in step time)
source "$(dirname "$0")/lib.sh"
need_bins
HTTPD=${KVD_HTTP:-$ROOT/$BUILD/bin/kvd-http}
[ -x "$HTTPD" ] || fail "$HTTPD not built"
command -v curl >/dev/null || skip "curl not installed"
command -v setpriv >/dev/null || skip "setpriv missing"
[ -f "$REAL_MODEL" ] || fail "default model missing (run scripts/setup)"
FLOODERS=${FAIR_FLOODERS:-8}
LIMIT_FACTOR=4
MARGIN_S=6
S=$T/kvd.sock
gw="gateway_users = 65534"; [ "${GATEWAY_OFF:-0}" = 1 ] && gw=
printf '[server]\nsocket_mode = 0666\n%s\n' "$gw" >"$T/kvd.conf"
start_kvd gwfair "$S" --config "$T/kvd.conf" --model "$REAL_MODEL" --pool-size 24M --threads 1
printf 'key-flood-a\nkey-short-b\n' >"$T/keys"; chown 65534 "$T/keys"; chmod 600 "$T/keys"
printf 'api_key_file = %s\n' "$T/keys" >"$T/http.conf"
HTTP_AS=(setpriv --reuid=65534 --regid=65534 --clear-groups)
start_http http --config "$T/http.conf" --kvd-socket "$S"
complete() { # KEY MAX_TOKENS PROMPT TIMEOUT OUT
	curl -s -m "$4" -o "$5" -w '%{http_code}' -H "Authorization: Bearer $1" -H 'Content-Type: application/json' \
		-d "{\"prompt\":\"$3\",\"max_tokens\":$2,\"temperature\":0}" "$B/v1/completions"
}
victim() { # NAME TIMEOUT -> wall ms
	local t0 t1 code
	t0=$(date +%s%N)
	code=$(complete key-short-b 32 "The capital of France is" "$2" "$T/$1.json")
	t1=$(date +%s%N)
	[ "$code" = 200 ] || { echo "TIMEOUT"; return 0; }
	echo $(( (t1 - t0) / 1000000 ))
}
text_of() { $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$1"; }
complete key-short-b 4 "warm up" 60 /dev/null >/dev/null
idle_ms=$(victim idle 60)
[ "$idle_ms" != TIMEOUT ] || fail "the short request failed on the idle daemon"
FP=()
for j in $(seq 1 "$FLOODERS"); do
	( while :; do complete key-flood-a 1000 "Write a very long story about a dragon who $j" 120 /dev/null >/dev/null || sleep 0.2; done ) &
	FP+=($!); PIDS+=($!)
done
for i in $(seq 1 600); do
	read -r free running < <("$RAW" -s "$S" stats | $PY -c "import json,sys; d=json.load(sys.stdin); print(d['pages_free'], d['requests_running'])")
	[ "$free" -le 4 ] && [ "$running" -ge 2 ] && break
	sleep 0.1
done
[ "$free" -le 4 ] || fail "the flood did not fill the pool (pages free: $free)"
sleep 1
limit_s=$(( idle_ms * LIMIT_FACTOR / 1000 + MARGIN_S ))
( sleep $((limit_s - 1)); KVD_SOCKET=$S "$KVCTL" ps >"$T/ps.out" 2>&1 ) &
flood_ms=$(victim flooded "$limit_s")
for p in "${FP[@]}"; do kill -TERM "$p" 2>/dev/null; done
echo "key B's short request: ${idle_ms} ms alone, $flood_ms ms beside $FLOODERS flooding streams of key A (limit ${limit_s} s)"
if [ "${GATEWAY_OFF:-0}" = 1 ]; then
	[ "$flood_ms" = TIMEOUT ] || [ "$flood_ms" -gt $((limit_s * 1000)) ] ||
		fail "without gateway_users the short request was not held back ($flood_ms ms): the test cannot tell"
	ok "without gateway_users key B waits behind key A's flood (past ${limit_s} s)"
	exit 0
fi
[ "$flood_ms" != TIMEOUT ] || fail "key B's short request got no answer within ${limit_s} s beside key A's flood; kvctl ps then: $(cat "$T/ps.out")"
[ "$(text_of "$T/idle.json")" = "$(text_of "$T/flooded.json")" ] || fail "the short request's text changed under the flood"
ok "gateway tenants are owners: key B's short request ${flood_ms} ms beside key A's flood (alone ${idle_ms} ms, limit ${limit_s} s)"
