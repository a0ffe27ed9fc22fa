#!/usr/bin/env bash
# t_http_tenant.sh — kvd-http divides kvd's prefix cache by API key and by
# cache_salt: kvd-http runs as uid 65534 with two API keys, and
#   - a prompt sent twice with key A hits the cache the second time
#     (usage.prompt_tokens_details.cached_tokens), the same prompt with key
#     B does not, nor does key A with a cache_salt; the same salt shares,
#     another salt does not; a local user (uid 65533) sending the prompt
#     through kvctl does not hit the gateway's pages either;
#   - a cache_salt that is not a string of 1 to 48 bytes gets 400 naming it;
#   - the key file takes several keys (comments, blank lines) and refuses
#     one given twice.
source "$(dirname "$0")/lib.sh"
need_bins
HTTPD=${KVD_HTTP:-$ROOT/$BUILD/bin/kvd-http}
[ -x "$HTTPD" ] || fail "$HTTPD not built"
command -v curl >/dev/null || skip "curl not installed"
command -v setpriv >/dev/null || skip "setpriv missing"
[ -f "$REAL_MODEL" ] || fail "default model missing (run scripts/setup)"
AS=(setpriv --reuid=65534 --regid=65534 --clear-groups)
S=$T/kvd.sock
printf '[server]\nsocket_mode = 0666\ngateway_users = 65534\n' >"$T/kvd.conf"
start_kvd kvd "$S" --config "$T/kvd.conf" --model "$REAL_MODEL" --threads 2
printf '# two tenants\nkey-alpha-0001\n\nkey-beta-0002  \n' >"$T/keys"
chown 65534 "$T/keys"; chmod 600 "$T/keys"
printf 'api_key_file = %s\n' "$T/keys" >"$T/http.conf"
HTTP_AS=("${AS[@]}")
start_http http --config "$T/http.conf" --kvd-socket "$S"
U="$B/v1/completions"
PROMPT="The lighthouse keeper wrote in the log every evening: the wind, the sea, the ships that passed, and the name of each gull that came to the rail. One winter night the lamp went out."
cached() { # KEY SALT-JSON -> cached_tokens (or the HTTP status when not 200)
	local body
	body=$($PY -c 'import json,sys; d={"prompt":sys.argv[1],"max_tokens":1,"temperature":0}
if sys.argv[2]: d["cache_salt"]=json.loads(sys.argv[2])
print(json.dumps(d))' "$PROMPT" "$2")
	curl -s -w '\n%{http_code}' -H "Authorization: Bearer $1" -H 'Content-Type: application/json' -d "$body" "$U" >"$T/resp"
	local code; code=$(tail -n 1 "$T/resp")
	if [ "$code" != 200 ]; then echo "http$code"; return; fi
	head -n -1 "$T/resp" | $PY -c 'import json,sys; print(json.load(sys.stdin)["usage"]["prompt_tokens_details"]["cached_tokens"])'
}
[ "$(cached key-alpha-0001 '')" = 0 ] || fail "key A's first request hit"
h=$(cached key-alpha-0001 '')
[ "${h#http}" = "$h" ] && [ "$h" -ge 32 ] || fail "key A's resend hit only $h tokens"
[ "$(cached key-beta-0002 '')" = 0 ] || fail "key B hit key A's cached prompt"
[ "$(cached key-alpha-0001 '"s1"')" = 0 ] || fail "key A with cache_salt s1 hit the unsalted pages"
h1=$(cached key-alpha-0001 '"s1"')
[ "${h1#http}" = "$h1" ] && [ "$h1" -ge 32 ] || fail "key A + s1's resend hit only $h1 tokens"
[ "$(cached key-alpha-0001 '"s2"')" = 0 ] || fail "cache_salt s2 hit s1's pages"
[ "$(cached key-beta-0002 '"s1"')" = 0 ] || fail "key B with s1 hit key A's s1 pages"
lc=$(setpriv --reuid=65533 --regid=65533 --clear-groups "$KVCTL" --socket "$S" generate --raw --max-tokens 1 --temperature 0 --json -- "$PROMPT" |
	$PY -c 'import json,sys; print(json.load(sys.stdin)["cached_tokens"])')
[ "$lc" = 0 ] || fail "a local user hit the gateway's cached prompt ($lc)"
ok "tenants: key A resend $h cached, key A + salt $h1; key B, another salt, another key with the salt and a local user 0"
[ "$(cached key-alpha-0001 '""')" = http400 ] || fail "an empty cache_salt was accepted"
[ "$(cached key-alpha-0001 "\"$(printf 'x%.0s' $(seq 49))\"")" = http400 ] || fail "a 49-byte cache_salt was accepted"
[ "$(cached key-alpha-0001 '7')" = http400 ] || fail "a numeric cache_salt was accepted"
grep -q cache_salt "$T/resp" || fail "the 400 does not name cache_salt: $(cat "$T/resp")"
[ "$(cached wrong-key '')" = http401 ] || fail "a wrong key was accepted"
ok "cache_salt must be a string of 1 to 48 bytes (400 naming it); a wrong key gets 401"
printf 'same\nsame\n' >"$T/dup"
P2=$(free_port)
printf 'api_key_file = %s\n' "$T/dup" >"$T/http2.conf"
"$HTTPD" --config "$T/http2.conf" --kvd-socket "$S" --listen "127.0.0.1:$P2" 2>"$T/http2.log" && fail "a key file with a key twice was accepted"
grep -q 'twice' "$T/http2.log" || fail "the refusal does not say why: $(cat "$T/http2.log")"
ok "a key file naming one key twice is refused: $(tail -n 1 "$T/http2.log")"
