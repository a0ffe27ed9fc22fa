#!/usr/bin/env bash
# t_http_structured.sh — kvd-http's structured output, tools and route table
# on the default model (SmolLM2-135M), through curl-like requests and the
# official openai package (tests/integration/http_structured.py says what
# each check asserts):
#   - route table: 404 for an unknown path, 405 with Allow for a wrong method
#   - two constraints in one request: 400 invalid_constraint naming both
#   - tools, assistant tool calls and tool results rendered in the generic
#     <tools>/<tool_call>/<tool_response> format (the same tokens as that
#     text sent as plain turns); tool_choice auto parses <tool_call> blocks
#     into tool_calls, streamed as OpenAI streams them
#   - with kvd 0.7.0: response_format json_schema outputs validate
#     (jsonschema), json_object, GBNF grammar, guided_choice, guided_regex;
#     schema and grammar errors as 400 with pointer / line and column;
#     tool_choice required and named, streamed and not, with a round trip
source "$(dirname "$0")/lib.sh"
need_bins
HTTPD=${KVD_HTTP:-$ROOT/$BUILD/bin/kvd-http}
VPY=$ROOT/.venv/bin/python
[ -x "$HTTPD" ] || skip "$HTTPD not built (libmicrohttpd-dev / libjansson-dev missing: run scripts/setup)"
[ -x "$VPY" ] && "$VPY" -c 'import openai, jsonschema' 2>/dev/null ||
	skip "openai or jsonschema is not in .venv (run scripts/setup)"
[ -f "$REAL_MODEL" ] || skip "default model missing (run scripts/setup)"

S=$T/kvd.sock
start_kvd kvd "$S" --model "$REAL_MODEL" --threads 2
start_http http --kvd-socket "$S"
timeout 240 "$VPY" "$ROOT/tests/integration/http_structured.py" "$B" || fail "http_structured.py failed"
