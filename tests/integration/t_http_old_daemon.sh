#!/usr/bin/env bash
# t_http_old_daemon.sh — kvd-http, kvctl and libkvclient beside an older kvd.
# The test build of kvd (kvd-faulty) says another version in WELCOME
# (KVD_TEST_SERVER_VERSION), so what the clients gate on the daemon's
# version is checked against a daemon that answers as the old one would
# have been asked:
#  * WELCOME names the chat format ("mistral") to a 0.11.0 client in 208
#    bytes; a 0.10.0 client gets the 176 bytes it accepts;
#  * the daemon as it is (0.11.0) ends a forced call's prompt with the
#    family's call opener (Mistral's [TOOL_CALLS] token: one token more
#    than the same conversation with tool_choice none) and the call is an
#    array of one; a daemon saying 0.10.0 predates the opener: the prompt
#    is the conversation's alone and the call a bare object; both come back
#    as a tool call;
#  * a daemon saying 0.8.0 predates tool roles in conversations: kvd-http
#    renders the tools, the call and its result itself, as text in the
#    generic (Hermes-style) format, and the request succeeds — with another
#    prompt than the same request to a 0.11.0 daemon, which renders a tiny
#    Mistral's own [AVAILABLE_TOOLS] / [TOOL_CALLS] / [TOOL_RESULTS] format; "speculative": false is not sent to it (a 0.8.0
#    daemon would refuse the unknown flag) and the request succeeds;
#  * a daemon saying 0.6.0 predates constraints: response_format
#    json_schema and a forced tool call are refused by kvd-http with a 400
#    unsupported_parameter naming the versions (nothing reaches the
#    daemon), a plain request still answers; kvctl generate --json-schema
#    exits with a message saying the daemon is too old.
source "$(dirname "$0")/lib.sh"
need_bins
FAULTY=$ROOT/$BUILD/tests/kvd-faulty
HTTPD=${KVD_HTTP:-$ROOT/$BUILD/bin/kvd-http}
[ -x "$FAULTY" ] || fail "$FAULTY not built (make all)"
[ -x "$HTTPD" ] || fail "$HTTPD not built (make all)"
[ -x "$KVCTL" ] || fail "$KVCTL not built (make all)"
VPY=$ROOT/.venv/bin/python
[ -x "$VPY" ] || fail "$VPY missing (scripts/setup)"
"$VPY" "$ROOT/scripts/gen_tiny_models.py" --arch --only mistral "$T/models" >/dev/null 2>&1 ||
	fail "cannot generate tiny-mistral"
# Mistral's template and marker tokens (as t_http_tools_family.sh), a
# context long enough for byte-level prompts with tools
printf '%s' "{{- bos_token }}{%- if tools %}{{- '[AVAILABLE_TOOLS] [' }}{%- endif %}{{- '[INST] ' + content + '[/INST]' }}" >"$T/mistral.jinja"
M=$T/mistral.gguf
"$VPY" "$ROOT/tests/integration/lib/retemplate_gguf.py" --ctx 4096 "$T/models/tiny-mistral.gguf" "$M" "$T/mistral.jinja" \
	'[INST]' '[/INST]' '[TOOL_CALLS]' '[AVAILABLE_TOOLS]' '[/AVAILABLE_TOOLS]' '[TOOL_RESULTS]' '[/TOOL_RESULTS]' ||
	fail "cannot retemplate tiny-mistral"

start_old() { # NAME VERSION: kvd-faulty saying VERSION, and kvd-http in front of it
	local name=$1
	if [ -n "$2" ]; then
		KVD_TEST_SERVER_VERSION=$2 KVD="$FAULTY" start_kvd "kvd-$name" "$T/$name.sock" --model "$M" --threads 2 --pool-size 32M
	else
		KVD="$FAULTY" start_kvd "kvd-$name" "$T/$name.sock" --model "$M" --threads 2 --pool-size 32M
	fi
	start_http "http-$name" --kvd-socket "$T/$name.sock"
}
stop_both() {
	kill -TERM "$HTTP_PID" "$KVD_PID" 2>/dev/null
	wait "$HTTP_PID" "$KVD_PID" 2>/dev/null
}
post() { # PATH BODY OUT: the HTTP status
	curl -s -o "$3" -w '%{http_code}' -H 'Content-Type: application/json' "$B$1" -d "$2"
}

TOOLS='"tools":[{"type":"function","function":{"name":"get_time","description":"the time in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]'
TURNS='"messages":[{"role":"user","content":"what time is it in Oslo?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_time","arguments":"{\"city\":\"Oslo\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"12:00"}]'
TOOLREQ="{\"model\":\"mistral\",$TURNS,$TOOLS,\"max_tokens\":4,\"temperature\":0}"

prompt_of() { $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens"])' "$1"; }
ASK='"messages":[{"role":"user","content":"time in Oslo?"}]'
# the city an enum: a tiny byte-level model's free strings run long
ETOOLS='"tools":[{"type":"function","function":{"name":"get_time","description":"the time in a city","parameters":{"type":"object","properties":{"city":{"enum":["Oslo","Rome"]}},"required":["city"],"additionalProperties":false}}}]'
forced_call() { # TAG: a forced call's prompt tokens, less those of the same conversation with tool_choice none
	[ "$(post /v1/chat/completions "{\"model\":\"mistral\",$ASK,$ETOOLS,\"tool_choice\":\"none\",\"max_tokens\":1}" "$T/$1n.json")" = 200 ] ||
		fail "tool_choice none ($1): $(cat "$T/$1n.json")"
	[ "$(post /v1/chat/completions "{\"model\":\"mistral\",$ASK,$ETOOLS,\"tool_choice\":\"required\",\"max_tokens\":200,\"temperature\":0}" "$T/$1f.json")" = 200 ] ||
		fail "a forced call ($1): $(cat "$T/$1f.json")"
	$PY - "$T/$1f.json" <<'PYEOF' || fail "a forced call ($1) is not a get_time call: $(cat "$T/$1f.json")"
import json, sys
c = json.load(open(sys.argv[1]))["choices"][0]
assert c["finish_reason"] == "tool_calls" and len(c["message"]["tool_calls"]) == 1, c
f = c["message"]["tool_calls"][0]["function"]
assert f["name"] == "get_time" and json.loads(f["arguments"])["city"] in ("Oslo", "Rome"), f
PYEOF
	echo $(($(prompt_of "$T/$1f.json") - $(prompt_of "$T/$1n.json")))
}

# ---- the real version: the daemon renders the tool turns --------------------------
start_old new ""
grep -q "KVD_TEST_SERVER_VERSION" "$T/kvd-new.log" && fail "kvd-faulty said another version without being asked"
# WELCOME names the chat format to 0.11.0 clients (208 bytes); older ones get 0.8.0's 176
w=$("$RAW" -s "$T/new.sock" hello)
case $w in *" bytes 208 chat_format 'mistral' "*) ;; *) fail "WELCOME to a 0.11.0 client: $w" ;; esac
w=$(KVD_RAW_CLIENT_VERSION=0x000a00 "$RAW" -s "$T/new.sock" hello)
case $w in *" bytes 176 chat_format '' "*) ;; *) fail "WELCOME to a 0.10.0 client: $w" ;; esac
[ "$(post /v1/chat/completions "$TOOLREQ" "$T/new.json")" = 200 ] || fail "tool turns (0.11.0): $(cat "$T/new.json")"
p_new=$(prompt_of "$T/new.json")
d_new=$(forced_call new) || exit 1
[ "$d_new" = 1 ] || fail "a forced call's prompt (0.11.0) has $d_new tokens more than tool_choice none's, not the one of [TOOL_CALLS]"
stop_both

# ---- 0.10.0: a forced call without the family's opener --------------------------------
start_old v10 0.10.0
d_old=$(forced_call v10) || exit 1
[ "$d_old" = 0 ] || fail "a forced call's prompt (0.10.0) has $d_old tokens more than tool_choice none's (an opener sent to a daemon without it)"
stop_both
ok "a forced call: [TOOL_CALLS] ends its prompt on 0.11.0 (an array of one call back), not on 0.10.0 (a bare call object back)"

# ---- 0.8.0: kvd-http renders them, as text ----------------------------------------
start_old v08 0.8.0
grep -q "WELCOME says kvd 0.8.0" "$T/kvd-v08.log" || fail "kvd-faulty does not say 0.8.0: $(cat "$T/kvd-v08.log")"
[ "$("$KVCTL" --socket "$T/v08.sock" version --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["kvd"])')" = 0.8.0 ] ||
	fail "kvctl version does not show kvd 0.8.0: $("$KVCTL" --socket "$T/v08.sock" version --json)"
[ "$(post /v1/chat/completions "$TOOLREQ" "$T/v08.json")" = 200 ] || fail "tool turns (0.8.0): $(cat "$T/v08.json")"
p_old=$(prompt_of "$T/v08.json")
[ "$p_old" != "$p_new" ] ||
	fail "the tool turns gave the same $p_new prompt tokens from a 0.8.0 daemon as from a 0.11.0 one (not rendered by kvd-http)"
req="{\"model\":\"mistral\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"max_tokens\":4,\"temperature\":0,\"speculative\":false}"
[ "$(post /v1/chat/completions "$req" "$T/v08ns.json")" = 200 ] || fail "\"speculative\": false (0.8.0): $(cat "$T/v08ns.json")"
stop_both
ok "0.8.0: tool turns rendered by kvd-http as text ($p_old prompt tokens, $p_new in the daemon's own format from 0.11.0);" \
	"\"speculative\": false not sent, answered"

# ---- 0.6.0: no constraints -----------------------------------------------------------
start_old v06 0.6.0
schema='"response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}}'
code=$(post /v1/chat/completions "{\"model\":\"mistral\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8,$schema}" "$T/v06s.json")
[ "$code" = 400 ] || fail "json_schema to a 0.6.0 daemon: HTTP $code: $(cat "$T/v06s.json")"
$PY - "$T/v06s.json" <<'PYEOF' || fail "json_schema to a 0.6.0 daemon: $(cat "$T/v06s.json")"
import json, sys
e = json.load(open(sys.argv[1]))["error"]
assert e["code"] == "unsupported_parameter", e
assert "too old" in e["message"] and "0.7.0" in e["message"], e
PYEOF
forced="{\"model\":\"mistral\",\"messages\":[{\"role\":\"user\",\"content\":\"time in Oslo?\"}],$TOOLS,\"tool_choice\":\"required\",\"max_tokens\":16}"
code=$(post /v1/chat/completions "$forced" "$T/v06f.json")
[ "$code" = 400 ] || fail "a forced tool call to a 0.6.0 daemon: HTTP $code: $(cat "$T/v06f.json")"
grep -q unsupported_parameter "$T/v06f.json" || fail "a forced tool call to a 0.6.0 daemon: $(cat "$T/v06f.json")"
code=$(post /v1/chat/completions '{"model":"mistral","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0}' "$T/v06p.json")
[ "$code" = 200 ] || fail "a plain request to a 0.6.0 daemon: HTTP $code: $(cat "$T/v06p.json")"
[ "$(stat_of "$T/v06.sock" requests_completed)" = 1 ] || fail "the refused requests reached the daemon"
printf '{"type":"object","properties":{"a":{"type":"integer"}}}' >"$T/s.json"
"$KVCTL" --socket "$T/v06.sock" generate --json-schema "$T/s.json" --max-tokens 8 "hi" >"$T/kvctl.out" 2>"$T/kvctl.err" &&
	fail "kvctl generate --json-schema against a 0.6.0 daemon succeeded"
grep -Eqi 'too old|0\.7\.0|not supported' "$T/kvctl.err" || fail "kvctl's refusal does not say why: $(cat "$T/kvctl.err")"
stop_both
ok "0.6.0: json_schema and a forced tool call refused with 400 unsupported_parameter (nothing sent), a plain request answered;" \
	"kvctl: $(head -n 1 "$T/kvctl.err")"
