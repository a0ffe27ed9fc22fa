#!/usr/bin/env bash
# t_http_model.sh — the names kvd-http serves the model under:
#   - the id is the model file's base name without .gguf (kvd sends it in
#     WELCOME), listed by /v1/models with general.name as an alias;
#   - a request naming the id or general.name (spaces and all) is served, and
#     answers with the id; no "model" at all is served; any other name is a
#     404 model_not_found; /v1/models/NAME answers for the id and each alias;
#   - a configured model_id replaces the id, and the file's base name and
#     general.name stay accepted as aliases.
source "$(dirname "$0")/lib.sh"
need_bins
HTTPD=${KVD_HTTP:-$ROOT/$BUILD/bin/kvd-http}
[ -x "$HTTPD" ] || skip "$HTTPD not built (libmicrohttpd-dev / libjansson-dev missing: run scripts/setup)"
command -v curl >/dev/null || skip "curl not installed"
[ -f "$REAL_MODEL" ] || skip "default model missing (run scripts/setup)"
S=$T/kvd.sock
start_kvd kvd "$S" --model "$REAL_MODEL" --threads 2
FILE_ID=$(basename "$REAL_MODEL" .gguf)
GNAME="Smollm2 135M 8k Lc100K Mix1 Ep2" # the default model's general.name

models() { curl -sf "$B/v1/models" | $PY -c 'import json,sys; m=json.load(sys.stdin)["data"][0]; print(m["id"]); [print(a) for a in m.get("aliases", [])]'; }
# gen NAME-JSON -> "STATUS MODEL-IN-ANSWER"
gen() {
	local body
	body=$($PY -c 'import json,sys; d={"prompt":"Hi","max_tokens":1,"temperature":0}
if sys.argv[1]: d["model"]=json.loads(sys.argv[1])
print(json.dumps(d))' "$1")
	curl -s -w '\n%{http_code}' -H 'Content-Type: application/json' -d "$body" "$B/v1/completions" >"$T/resp"
	local code; code=$(tail -n 1 "$T/resp")
	echo "$code $(head -n -1 "$T/resp" | $PY -c 'import json,sys; d=json.load(sys.stdin); print(d.get("model") or d["error"]["code"])')"
}
urlq() { $PY -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$1"; }
mcode() { curl -s -o /dev/null -w '%{http_code}' "$B/v1/models/$(urlq "$1")"; }

start_http http --kvd-socket "$S"
mapfile -t M < <(models)
[ "${M[0]}" = "$FILE_ID" ] || fail "/v1/models id '${M[0]}', wanted '$FILE_ID'"
[ "${M[1]:-}" = "$GNAME" ] || fail "/v1/models aliases '${M[*]:1}', wanted '$GNAME'"
[ "$(gen "\"$FILE_ID\"")" = "200 $FILE_ID" ] || fail "model '$FILE_ID': $(cat "$T/resp")"
[ "$(gen "\"$GNAME\"")" = "200 $FILE_ID" ] || fail "model '$GNAME': $(cat "$T/resp")"
[ "$(gen '')" = "200 $FILE_ID" ] || fail "no model: $(cat "$T/resp")"
[ "$(gen '"gpt-4"')" = "404 model_not_found" ] || fail "model gpt-4: $(cat "$T/resp")"
[ "$(mcode "$FILE_ID")" = 200 ] && [ "$(mcode "$GNAME")" = 200 ] && [ "$(mcode gpt-4)" = 404 ] ||
	fail "/v1/models/NAME: $(mcode "$FILE_ID") $(mcode "$GNAME") $(mcode gpt-4)"
ok "id '$FILE_ID' (the file's base name), alias '$GNAME'; other names 404"
kill "$HTTP_PID"; wait "$HTTP_PID" 2>/dev/null

printf 'model_id = smollm\n' >"$T/http.conf"
start_http http2 --config "$T/http.conf" --kvd-socket "$S"
mapfile -t M < <(models)
[ "${M[*]}" = "smollm $GNAME $FILE_ID" ] || fail "configured: /v1/models '${M[*]}'"
for n in smollm "$GNAME" "$FILE_ID"; do
	[ "$(gen "\"$n\"")" = "200 smollm" ] || fail "configured, model '$n': $(cat "$T/resp")"
done
[ "$(gen '"SmolLM2"')" = "404 model_not_found" ] || fail "configured, model SmolLM2: $(cat "$T/resp")"
ok "model_id = smollm: served as smollm, '$GNAME' and '$FILE_ID' accepted"
