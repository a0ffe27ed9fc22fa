#!/usr/bin/env bash
# t_http_params.sh — what kvd-http accepts, refuses and says about its API.
#
# Checked against a tiny model:
#   - a body nested deeper than HTTP_MAX_JSON_DEPTH (32) gets 400 naming the
#     depth; 32 levels inside an ignored key are parsed
#   - other servers' extras that change the output (ignore_eos, structured_outputs,
#     min_tokens, ...) get 400 naming the parameter, on both endpoints; their
#     neutral values and metadata keys (user) are accepted; 'priority' is an
#     integer in range (else 400 naming it), 'cache_salt' a short string
#   - the completions endpoint's context overflow names 'prompt', chat's
#     'messages'
#   - --help describes today's API: n, logprobs, earlier conversation turns
source "$(dirname "$0")/lib.sh"
need_bins
HTTPD=${KVD_HTTP:-$ROOT/$BUILD/bin/kvd-http}
[ -x "$HTTPD" ] || skip "$HTTPD not built (libmicrohttpd-dev / libjansson-dev missing: run scripts/setup)"
command -v curl >/dev/null || skip "curl not installed"

"$HTTPD" --help >"$T/help.out" || fail "kvd-http --help"
for w in 'n (parallel samples' 'logprobs and top_logprobs' 'assistant turns' 'priority'; do
	grep -q "$w" "$T/help.out" || fail "--help does not mention '$w'"
done
! grep -q 'turns are refused' "$T/help.out" || fail "--help still says earlier turns are refused"
ok "--help describes n, logprobs, conversation turns and what is refused"

TINY=$(tiny_model gqa)
S=$T/kvd.sock
start_kvd kvd "$S" --model "$TINY" --threads 1
start_http http --kvd-socket "$S"

# post ENDPOINT BODY -> "status param" of the answer
post() {
	curl -s -o "$T/out.json" -w '%{http_code}' "$B/v1/$1" -d "$2" >"$T/code"
	echo "$(cat "$T/code") $($PY -c 'import json,sys
try: e = json.load(open(sys.argv[1])).get("error") or {}
except Exception: e = {}
print(e.get("param") or "-")' "$T/out.json")"
}
C='"prompt":"hi","max_tokens":2'
M='"messages":[{"role":"user","content":"hi"}],"max_tokens":2'

deep=$($PY -c 'print("[" * 40 + "]" * 40)')
r=$(post completions "{$C,\"x\":$deep}"); [ "${r%% *}" = 400 ] || fail "40 levels: $r"
grep -q 'deeper than 32' "$T/out.json" || fail "40 levels: $(cat "$T/out.json")"
ok32=$($PY -c 'print("[" * 31 + "]" * 31)')
r=$(post completions "{$C,\"x\":$ok32}"); [ "${r%% *}" = 200 ] || fail "32 levels: $r $(cat "$T/out.json")"
ok "a body nested 40 deep: 400; 32 deep: served"

for kv in '"priority":"high"' '"priority":2000000' '"ignore_eos":true' '"structured_outputs":{"json":{"type":"object"}}' '"min_tokens":10' \
	'"stop_token_ids":[2]' '"skip_special_tokens":false' '"repetition_penalty":1.3' '"echo":true'; do
	key=$(echo "$kv" | sed 's/^"\([a-z_]*\)".*/\1/')
	for ep in completions chat/completions; do
		body=$C; [ $ep = completions ] || body=$M
		r=$(post $ep "{$body,$kv}")
		[ "$r" = "400 $key" ] || fail "$ep with $kv: '$r' $(cat "$T/out.json")"
	done
done
for kv in '"priority":0' '"priority":-5' '"priority":7' '"ignore_eos":false' '"skip_special_tokens":true' '"user":"u1"' '"cache_salt":"s1"' \
	'"metadata":{"a":"b"}'; do
	r=$(post completions "{$C,$kv}"); [ "${r%% *}" = 200 ] || fail "completions with $kv: $r $(cat "$T/out.json")"
	r=$(post chat/completions "{$M,$kv}"); [ "${r%% *}" = 200 ] || fail "chat with $kv: $r $(cat "$T/out.json")"
done
ok "output-changing extras and a bad priority: 400 naming them; priorities, neutral values, user, cache_salt, metadata: 200"

CTX=$(curl -sf "$B/v1/models" | $PY -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["max_model_len"])')
long=$($PY -c "print(' '.join(['word'] * $CTX))")
r=$(post completions "{\"prompt\":\"$long\",\"max_tokens\":4}")
[ "$r" = "400 prompt" ] || fail "completions over the context: '$r' $(cat "$T/out.json")"
grep -q context_length_exceeded "$T/out.json" || fail "completions over the context: $(cat "$T/out.json")"
r=$(post chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$long\"}],\"max_tokens\":4}")
[ "$r" = "400 messages" ] || fail "chat over the context: '$r' $(cat "$T/out.json")"
ok "context overflow: completions names 'prompt', chat 'messages'"
