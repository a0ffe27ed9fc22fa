#!/usr/bin/env bash
# t_http_idle.sh — kvd-http after a quiet spell longer than kvd's idle_timeout.
#
# kvd closes connections that hold nothing for [server] idle_timeout
# seconds (ERROR -ETIMEDOUT). kvd-http keeps its kvd connections between
# requests, so after a lull every one of them is stale. Checked: with kvd
# at idle_timeout = 2, a first round of requests opens several pooled
# connections; after 4 s of silence a burst of 24 concurrent requests and
# /health all succeed (a failure on a pooled connection is retried once on
# a fresh one, and the stale connections are dropped), and so does a second
# lull followed by a lone /health.
# test-run: alone (measures idle timeouts)
source "$(dirname "$0")/lib.sh"
need_bins
HTTPD=${KVD_HTTP:-$ROOT/$BUILD/bin/kvd-http}
[ -x "$HTTPD" ] || skip "$HTTPD not built (libmicrohttpd-dev / libjansson-dev missing: run scripts/setup)"
command -v curl >/dev/null || skip "curl not installed"
[ -f "$REAL_MODEL" ] || skip "default model missing (run scripts/setup)"

S=$T/kvd.sock
printf '[server]\nidle_timeout = 2\n' >"$T/kvd.conf"
start_kvd kvd "$S" --config "$T/kvd.conf" --model "$REAL_MODEL" --threads 2
start_http http --kvd-socket "$S"

# burst N TAG: N concurrent short completions; prints their status codes
burst() {
	local n=$1 tag=$2 i
	for i in $(seq 1 "$n"); do
		curl -s -m 60 -o "$T/$tag.$i.out" -w '%{http_code}\n' "$B/v1/completions" \
			-d "{\"prompt\":\"Count to $i:\",\"max_tokens\":4,\"temperature\":0}" >"$T/$tag.$i.code" &
	done
	wait $(jobs -p | grep -v "^$$\$") 2>/dev/null
	cat "$T/$tag".*.code | sort | uniq -c | tr '\n' ' '
}
check_all_200() { # TAG N
	local bad
	bad=$(cat "$T/$1".*.code | grep -vc '^200$')
	[ "$bad" = 0 ] || fail "$1: $bad of $2 requests failed: $(cat "$T/$1".*.code | sort | uniq -c | tr '\n' ' ')" \
		"$(grep -h . "$T/$1".*.out | grep -v '"choices"' | head -3)"
}

codes=$(burst 24 warm)
check_all_200 warm 24
ok "24 concurrent requests on a fresh gateway: $codes"

sleep 4 # > idle_timeout: kvd has closed every pooled connection
codes=$(burst 24 lull)
check_all_200 lull 24
h=$(curl -s -o "$T/health.out" -w '%{http_code}' "$B/health")
[ "$h" = 200 ] || fail "/health after the lull: $h $(cat "$T/health.out")"
ok "after a 4 s lull (kvd idle_timeout 2 s): 24 concurrent requests: $codes; /health 200"

sleep 4
h=$(curl -s -o "$T/health.out" -w '%{http_code}' "$B/health")
[ "$h" = 200 ] || fail "/health alone after a second lull: $h $(cat "$T/health.out")"
codes=$(burst 8 again)
check_all_200 again 8
ok "after a second lull: /health 200, then 8 requests: $codes"
