#!/usr/bin/env bash
# t_kvctl.sh — kvctl's command line: every command's manual (--help, and
# 'kvctl help COMMAND', 'kvctl help --help'), options it does not know are
# errors that name them (a '-n 40' is refused as a number of samples), plural
# and singular in 'plan'; then, against kvd on the default model: a
# --max-tokens beyond the context names the context size, 'generate --raw
# --special' sends special tokens, 'kvctl chat' (refusals of bad JSON
# conversations; [system, user] the same as generate --system; the next turn
# found in the prefix cache; a conversation through the upload ring; kvd's own
# checks of a turn list), and kvd refuses a KV pool smaller than one page by
# saying so.
source "$(dirname "$0")/lib.sh"
[ -x "$KVCTL" ] || skip "$KVCTL not built"

# expect_rc RC NAME ARGS...: kvctl's exit status; its output in $T/out, $T/err
expect_rc() {
	local want=$1 name=$2; shift 2
	"$KVCTL" "$@" >"$T/out" 2>"$T/err"
	local rc=$?
	[ $rc = "$want" ] || fail "$name: exit $rc, expected $want ($(head -n 3 "$T/err"))"
}

# ---- manuals ------------------------------------------------------------------------------
cmds=$("$KVCTL" --help | sed -n '/^COMMANDS/,/^$/p' | sed -nE 's/^    ([a-z]+) .*/\1/p')
[ "$(echo "$cmds" | wc -w)" -ge 9 ] || fail "kvctl --help lists too few commands: $cmds"
for c in $cmds; do
	expect_rc 0 "kvctl $c --help" "$c" --help
	for sec in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" EXAMPLES; do
		grep -q "^$sec\$" "$T/out" || fail "kvctl $c --help has no $sec section"
	done
	grep -q "^    kvctl $c - " "$T/out" || fail "kvctl $c --help: NAME does not say 'kvctl $c - ...'"
	cp "$T/out" "$T/help1"
	expect_rc 0 "kvctl help $c" help "$c"
	cmp -s "$T/out" "$T/help1" || fail "'kvctl help $c' differs from 'kvctl $c --help'"
done
ok "every command has a manual (NAME .. EXAMPLES): $(echo $cmds)"
expect_rc 2 "kvctl help nosuch" help nosuch
grep -q "no command 'nosuch'" "$T/err" || fail "help nosuch: $(cat "$T/err")"

# ---- unknown options are errors that name them --------------------------------------------------
expect_rc 2 "generate -x" --socket "$T/none.sock" generate -x "hi"
grep -q "unknown option '-x'" "$T/err" || fail "generate -x: $(cat "$T/err")"
# -n is the number of samples: a token count there is refused, naming --max-tokens
expect_rc 2 "generate -n 40" --socket "$T/none.sock" generate -n 40 "hi"
grep -q "samples from 1 to 16" "$T/err" && grep -q -- "--max-tokens" "$T/err" ||
	fail "generate -n 40: $(cat "$T/err")"
expect_rc 2 "stats -x" --socket "$T/none.sock" stats -x
grep -q "unknown option '-x'" "$T/err" || fail "stats -x: $(cat "$T/err")"
expect_rc 2 "plan --bogus" plan --bogus=3
grep -q "unknown option '--bogus'" "$T/err" || fail "plan --bogus=3: $(cat "$T/err")"
expect_rc 2 "generate --max-tokens (no value)" generate --max-tokens
grep -q "option '--max-tokens' needs a value" "$T/err" || fail "generate --max-tokens: $(cat "$T/err")"
expect_rc 2 "kvctl -q" -q stats
grep -q "unknown option '-q'" "$T/err" || fail "kvctl -q: $(cat "$T/err")"
expect_rc 2 "generate --special without --raw" --socket "$T/none.sock" generate --special hi
grep -q -- "--special goes with --raw" "$T/err" || fail "--special without --raw: $(cat "$T/err")"
ok "unknown options and missing values are usage errors that name the option"

# ---- kvctl chat: the conversation is checked before anything is sent ---------------------------------
chat_in() { # INPUT RC NAME [ARGS...]: kvctl chat reading INPUT on stdin
	local input=$1 want=$2 name=$3; shift 3
	printf '%s' "$input" | "$KVCTL" --socket "$T/none.sock" chat "$@" >"$T/out" 2>"$T/err"
	local rc=$?
	[ $rc = "$want" ] || fail "chat, $name: exit $rc, expected $want ($(head -n 3 "$T/err"))"
}
HAVE_CHAT_JSON=1
printf '[{"role":"user","content":"hi"}]' | "$KVCTL" --socket "$T/none.sock" chat >/dev/null 2>"$T/err"
if grep -q "built without jansson" "$T/err"; then
	HAVE_CHAT_JSON=0
	echo "skipped: the kvctl chat checks: kvctl was built without jansson (install libjansson-dev)"
else
	chat_in '[{"role":"user","content":"hi"}' 2 "bad JSON"
	grep -q "line 1, column" "$T/err" || fail "chat, bad JSON: $(cat "$T/err")"
	chat_in '{"role":"user","content":"hi"}' 2 "not an array"
	grep -q "non-empty JSON array" "$T/err" || fail "chat, not an array: $(cat "$T/err")"
	chat_in '[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]' 2 "assistant last"
	grep -q "the last message is the assistant's" "$T/err" || fail "chat, assistant last: $(cat "$T/err")"
	chat_in '[{"role":"ipython","content":"x"},{"role":"user","content":"hi"}]' 2 "unknown role"
	grep -q 'message 0: unknown role "ipython"' "$T/err" || fail "chat, unknown role: $(cat "$T/err")"
	chat_in '[{"role":"user","content":"hi","name":"x"}]' 2 "extra member"
	grep -q 'unknown member "name"' "$T/err" || fail "chat, extra member: $(cat "$T/err")"
	chat_in '[{"role":"user","content":"a\u0000b"}]' 2 "NUL in content"
	grep -q 'u0000' "$T/err" || fail "chat, NUL: $(cat "$T/err")"
	chat_in '[{"role":"user","role":"user","content":"hi"}]' 2 "duplicate key"
	chat_in '[{"role":"user","content":"hi"}]' 2 "--system" --system x
	grep -q 'a system prompt is a "system" message' "$T/err" || fail "chat --system: $(cat "$T/err")"
	chat_in '[{"role":"user","content":"hi"}]' 3 "no daemon" # valid: it gets as far as connecting
	"$KVCTL" --socket "$T/none.sock" chat "$T/no-such-file.json" >/dev/null 2>"$T/err"; rc=$?
	[ $rc = 7 ] && grep -q "no-such-file.json: No such file" "$T/err" || fail "chat FILE missing: exit $rc, $(cat "$T/err")"
	ok "kvctl chat refuses bad conversations by name (bad JSON at line/column, roles, last turn, NUL, duplicates)"
fi

# ---- plan: singular and plural ----------------------------------------------------------------------
expect_rc 0 "plan, one of each" plan --layers 1 --kv-heads 1 --head-dim 64 --context 1 --memory 4K
grep -q -- "-> 1 page -> 1 sequence of 1 token$" "$T/out" || fail "plan singular: $(cat "$T/out")"
expect_rc 0 "plan, several" plan --layers 1 --kv-heads 1 --head-dim 64 --context 32 --memory 16K
grep -q -- "-> 4 pages -> 2 sequences of 32 tokens$" "$T/out" || fail "plan plural: $(cat "$T/out")"
ok "plan: '1 page -> 1 sequence', '4 pages -> 2 sequences'"
expect_rc 2 "plan --window without --global-layers" plan --layers 6 --kv-heads 1 --head-dim 64 --window 5
expect_rc 2 "plan --global-layers without the model" plan --window 5 --global-layers 1
expect_rc 2 "plan, every layer global" plan --layers 6 --kv-heads 1 --head-dim 64 --window 5 --global-layers 6

# ---- against the daemon --------------------------------------------------------------------------------
[ -f "$REAL_MODEL" ] || skip "the default model $REAL_MODEL is missing (scripts/setup fetches it); the checks without a daemon passed"
need_bins
S=$T/kvd.sock
start_kvd main "$S" --model "$REAL_MODEL" --backend cpu --pool-size 64M
ctx=$("$KVCTL" --socket "$S" version --json | sed -E 's/.*"n_ctx":([0-9]+).*/\1/')
[ -n "$ctx" ] && [ "$ctx" -gt 0 ] || fail "no n_ctx from kvctl version --json"

expect_rc 4 "--max-tokens beyond the context" --socket "$S" generate --max-tokens $((ctx * 4)) hi
grep -q "context window is $ctx tokens" "$T/err" || fail "--max-tokens $((ctx * 4)): $(cat "$T/err")"
grep -q "Argument list too long" "$T/err" && fail "--max-tokens beyond the context still says E2BIG: $(cat "$T/err")"
ok "--max-tokens $((ctx * 4)): $(sed 's/^kvctl: //' "$T/err" | head -n 1)"
# within the largest accepted value, but prompt + max_tokens over the context: the daemon's words
expect_rc 4 "prompt + --max-tokens over the context" --socket "$S" generate --raw --max-tokens "$ctx" "hello there"
grep -q "context window of $ctx tokens" "$T/err" || fail "prompt + max_tokens over the context: $(cat "$T/err")"
ok "prompt + --max-tokens $ctx: $(sed 's/^kvctl: //' "$T/err" | head -n 1)"

# --raw --special: "<|im_start|>" is one token; without --special it is text
sp='<|im_start|>'
expect_rc 0 "tokenize --special" --socket "$S" tokenize --special "$sp"
[ "$(wc -w <"$T/out")" = 1 ] || fail "tokenize --special '$sp' is not one token: $(cat "$T/out")"
expect_rc 0 "generate --raw --special" --socket "$S" generate --raw --special --temperature 0 --max-tokens 1 --json "$sp"
with=$(sed -E 's/.*"prompt_tokens":([0-9]+).*/\1/' "$T/out")
expect_rc 0 "generate --raw" --socket "$S" generate --raw --temperature 0 --max-tokens 1 --json "$sp"
without=$(sed -E 's/.*"prompt_tokens":([0-9]+).*/\1/' "$T/out")
bos=$("$KVCTL" --socket "$S" count --bos --special "$sp")
[ "$with" = "$bos" ] || fail "generate --raw --special '$sp': $with prompt tokens, expected $bos (count --bos --special)"
[ "$without" -gt "$with" ] || fail "generate --raw '$sp' without --special: $without prompt tokens, not more than $with"
ok "generate --raw --special sends '$sp' as a special token ($with prompt tokens; $without as text)"

if [ "$HAVE_CHAT_JSON" = 1 ]; then
	# a system + user conversation renders exactly like generate --system: same tokens, same answer
	printf '[{"role":"system","content":"Be brief."},{"role":"user","content":"Name a colour."}]' >"$T/c1.json"
	expect_rc 0 "chat FILE" --socket "$S" chat --temperature 0 --max-tokens 12 --json "$T/c1.json"
	cp "$T/out" "$T/c1.out"
	expect_rc 0 "generate --system" --socket "$S" generate --system "Be brief." --temperature 0 --max-tokens 12 --json \
		"Name a colour."
	$PY - "$T/c1.out" "$T/out" <<'PYEOF' || fail "chat [system, user] differs from generate --system"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["text"] == b["text"] and a["prompt_tokens"] == b["prompt_tokens"], (a, b)
PYEOF
	# the conversation grows by the answer and a new question: its earlier turns come from the cache
	$PY - "$T/c1.json" "$T/c1.out" >"$T/c2.json" <<'PYEOF'
import json, sys
conv = json.load(open(sys.argv[1]))
conv += [{"role": "assistant", "content": json.load(open(sys.argv[2]))["text"]},
         {"role": "user", "content": "Name another one."}]
print(json.dumps(conv))
PYEOF
	"$KVCTL" --socket "$S" chat --temperature 0 --max-tokens 12 --json <"$T/c2.json" >"$T/c2.out" ||
		fail "chat on stdin: $(cat "$T/c2.out")"
	p1=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompt_tokens"])' "$T/c1.out")
	read -r p2 c2 < <($PY -c 'import json,sys; d = json.load(open(sys.argv[1])); print(d["prompt_tokens"], d["cached_tokens"])' "$T/c2.out")
	[ "$p2" -gt "$p1" ] && [ "$c2" -ge $((p1 / 16 * 16)) ] && [ "$c2" -gt 0 ] ||
		fail "second turn: $p2 prompt tokens, $c2 cached; the first turn had $p1 (its full pages should be cached)"
	ok "chat: [system, user] = generate --system ($p1 prompt tokens); the next turn finds $c2 of its $p2 tokens cached"
	# tool turns (kvd 0.9.0): rendered by kvd in ChatML's (Qwen's) tool format, the same tokens as that text
	$PY - "$T" <<'PYEOF'
import json, sys
t = sys.argv[1]
tools = [{"name": "get_time", "description": "Time in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
calls = [{"id": "call_1", "name": "get_time", "arguments": {"city": "Paris"}}]
json.dump([{"role": "system", "content": "Be brief."}, {"role": "tools", "content": tools},
           {"role": "user", "content": "Time in Paris?"}, {"role": "assistant", "content": ""},
           {"role": "tool_calls", "content": json.dumps(calls)}, {"role": "tool", "content": "14:05"}],
          open(t + "/tools.json", "w"))
block = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
         "function signatures within <tools></tools> XML tags:\n<tools>\n" +
         json.dumps({"type": "function", "function": tools[0]}) +
         "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
         "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
         "<args-json-object>}\n</tool_call>")
json.dump([{"role": "system", "content": "Be brief.\n\n" + block}, {"role": "user", "content": "Time in Paris?"},
           {"role": "assistant", "content": '<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n'
                                            '</tool_call>'},
           {"role": "user", "content": "<tool_response>\n14:05\n</tool_response>"}], open(t + "/plain.json", "w"))
PYEOF
	"$KVCTL" --socket "$S" chat --temperature 0 --max-tokens 4 --json "$T/tools.json" >"$T/tools.out" ||
		fail "chat with tool turns: $(cat "$T/tools.out")"
	"$KVCTL" --socket "$S" chat --temperature 0 --max-tokens 4 --json "$T/plain.json" >"$T/plain.out" ||
		fail "chat, the tool turns as text: $(cat "$T/plain.out")"
	pt=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompt_tokens"])' "$T/tools.out")
	pp=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["prompt_tokens"])' "$T/plain.out")
	[ "$pt" = "$pp" ] || fail "tool turns: $pt prompt tokens; the same as text: $pp"
	ok "chat with tools, tool_calls and a tool result last: rendered in the ChatML tool format ($pt prompt tokens, as that text)"
	# a conversation beyond the inline limit travels through the upload ring: kvd renders and counts it
	$PY -c 'import json; print(json.dumps([{"role":"user","content":"word " * 9000},
		{"role":"assistant","content":"ok"},{"role":"user","content":"again"}]))' >"$T/big.json"
	expect_rc 4 "a 45 KB conversation" --socket "$S" chat --max-tokens 8 "$T/big.json"
	grep -qE "[0-9]{4,} prompt tokens \+ max_tokens 8 = [0-9]+ exceeds the context window of $ctx tokens" "$T/err" ||
		fail "a 45 KB conversation: $(cat "$T/err")"
	ok "a 45 KB conversation goes through the ring and is rendered: $(sed 's/^kvctl: //' "$T/err" | head -n 1)"
	# kvd checks a list that arrived through the ring itself (kvd_raw writes it unchecked)
	if [ -x "$RAW" ]; then
		"$RAW" -s "$S" generate --turns --ring -n 4 '2:hi|3:yo' >/dev/null 2>"$T/raw.err"; rc=$?
		[ $rc = 2 ] && grep -q "code=-22 .*the last chat turn is the assistant's; it must be the user's" "$T/raw.err" ||
			fail "kvd and a ring list ending with the assistant: exit $rc, $(cat "$T/raw.err")"
		"$RAW" -s "$S" generate --turns --ring -n 4 '2:hi|9:x|2:again' >/dev/null 2>"$T/raw.err"; rc=$?
		[ $rc = 2 ] && grep -q "code=-22 .*chat turn 1 is malformed (unknown role" "$T/raw.err" ||
			fail "kvd and a ring list with role 9: exit $rc, $(cat "$T/raw.err")"
		"$RAW" -s "$S" generate --turns --ring -n 4 --temperature 0 '1:Be brief.|2:Name a colour.' >/dev/null 2>"$T/raw.err" ||
			fail "kvd_raw --turns --ring: $(cat "$T/raw.err")"
		ok "kvd refuses turn lists that arrived malformed through the ring with an ERROR naming the rule; a good one is served"
	fi
fi
stop_kvd "$KVD_PID"

# ---- a KV pool smaller than one page --------------------------------------------------------------------
"$KVD" --config /dev/null --model "$REAL_MODEL" --backend cpu --socket "$T/small.sock" --pool-size 64K \
	>/dev/null 2>"$T/small.log" && fail "kvd started with a 64 KiB pool"
grep -q "smaller than one page" "$T/small.log" || fail "a pool smaller than one page: $(tail -n 2 "$T/small.log")"
ok "pool of 64K: $(grep -o 'KV pool.*' "$T/small.log" | head -n 1)"
