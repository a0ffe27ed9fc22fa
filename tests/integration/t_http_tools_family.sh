#!/usr/bin/env bash
# t_http_tools_family.sh — tools in each chat family's own format, end to
# end through kvd-http and the official openai package, on tiny
# random-weight models of the families (scripts/gen_tiny_models.py) given
# their family's chat template and marker tokens
# (tests/integration/lib/retemplate_gguf.py):
#   qwen3   ChatML (Qwen 2.5/3's <tool_call> format, also the generic one)
#   llama3  Llama 3.1's JSON calls and ipython turns
#   mistral [AVAILABLE_TOOLS] / [TOOL_CALLS] / [TOOL_RESULTS]
# Per family (tests/integration/http_tools_family.py says what is asserted):
# the prompt of a conversation with tools, a call and its result has the
# tokens of the family's reference rendering (written out in the test, and
# tokenized by kvd with special tokens parsed); a forced named call and
# required with parallel_tool_calls (one or more calls) come back as
# tool_calls whose arguments validate, streamed and not; a round trip is
# answered from the prefix cache; each family's call shape the model writes
# with tool_choice auto is parsed back into tool_calls.
source "$(dirname "$0")/lib.sh"
need_bins
HTTPD=${KVD_HTTP:-$ROOT/$BUILD/bin/kvd-http}
VPY=$ROOT/.venv/bin/python
[ -x "$HTTPD" ] || skip "$HTTPD not built (libmicrohttpd-dev / libjansson-dev missing: run scripts/setup)"
[ -x "$VPY" ] && "$VPY" -c 'import openai, jsonschema, gguf' 2>/dev/null ||
	skip "openai, jsonschema or gguf is not in .venv (run scripts/setup)"

mkdir -p "$T/models"
"$VPY" "$ROOT/scripts/gen_tiny_models.py" --arch --only llama3,mistral,qwen3 "$T/models" >/dev/null 2>&1 ||
	fail "cannot generate the tiny models"
# Only the markers matter to kvd's recognition of a template family.
printf '%s' "{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' }}{%- endfor %}" >"$T/llama3.jinja"
printf '%s' "{{- bos_token }}{%- if tools %}{{- '[AVAILABLE_TOOLS] [' }}{%- endif %}{{- '[INST] ' + content + '[/INST]' }}" >"$T/mistral.jinja"
# tiny-qwen3 keeps its own ChatML template
"$VPY" -c 'import gguf, sys; r = gguf.GGUFReader(sys.argv[1]); f = r.fields["tokenizer.chat_template"]
sys.stdout.write(bytes(f.parts[-1]).decode())' "$T/models/tiny-qwen3.gguf" >"$T/qwen3.jinja" || fail "no qwen3 template"
RT=$ROOT/tests/integration/lib/retemplate_gguf.py
"$VPY" "$RT" --ctx 4096 "$T/models/tiny-llama3.gguf" "$T/llama3.gguf" "$T/llama3.jinja" \
	'<|start_header_id|>' '<|end_header_id|>' '<|eot_id|>' || fail "cannot retemplate tiny-llama3"
"$VPY" "$RT" --ctx 4096 "$T/models/tiny-mistral.gguf" "$T/mistral.gguf" "$T/mistral.jinja" \
	'[INST]' '[/INST]' '[TOOL_CALLS]' '[AVAILABLE_TOOLS]' '[/AVAILABLE_TOOLS]' '[TOOL_RESULTS]' '[/TOOL_RESULTS]' ||
	fail "cannot retemplate tiny-mistral"
"$VPY" "$RT" --ctx 4096 "$T/models/tiny-qwen3.gguf" "$T/qwen3.gguf" "$T/qwen3.jinja" ||
	fail "cannot copy tiny-qwen3"

for fam in qwen3 llama3 mistral; do
	S=$T/$fam.sock
	start_kvd "kvd-$fam" "$S" --model "$T/$fam.gguf" --threads 2 --pool-size 64M
	start_http "http-$fam" --kvd-socket "$S"
	KVD_SOCKET=$S timeout 120 "$VPY" "$ROOT/tests/integration/http_tools_family.py" "$B" "$fam" "$KVCTL" ||
		fail "http_tools_family.py $fam failed"
	kill -TERM "$HTTP_PID" "$KVD_PID" 2>/dev/null
	wait "$HTTP_PID" "$KVD_PID" 2>/dev/null
done
ok "tools in the Qwen, Llama 3.1 and Mistral formats: rendered as the references, forced and parallel calls, round trips, auto parsing"
