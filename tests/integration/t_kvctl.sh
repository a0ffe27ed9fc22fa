#!/usr/bin/env bash
# t_kvctl.sh — kvctl's command line: every command's manual (--help, and
# 'kvctl help COMMAND', 'kvctl help --help'), options it does not know are
# errors that name them (a '-n 2' is not read as a flag and a prompt), plural
# and singular in 'plan'; then, against kvd on the default model: a
# --max-tokens beyond the context names the context size, 'generate --raw
# --special' sends special tokens, and kvd refuses a KV pool smaller than one
# page by saying so.
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
expect_rc 2 "generate -n 2" --socket "$T/none.sock" generate -n 2 "hi"
grep -q "unknown option '-n'" "$T/err" && grep -q -- "--max-tokens" "$T/err" ||
	fail "generate -n 2: $(cat "$T/err")"
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

# ---- plan: singular and plural ----------------------------------------------------------------------
expect_rc 0 "plan, one of each" plan --layers 1 --kv-heads 1 --head-dim 64 --context 1 --memory 4K
grep -q -- "-> 1 page -> 1 sequence of 1 token$" "$T/out" || fail "plan singular: $(cat "$T/out")"
expect_rc 0 "plan, several" plan --layers 1 --kv-heads 1 --head-dim 64 --context 32 --memory 16K
grep -q -- "-> 4 pages -> 2 sequences of 32 tokens$" "$T/out" || fail "plan plural: $(cat "$T/out")"
ok "plan: '1 page -> 1 sequence', '4 pages -> 2 sequences'"

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
stop_kvd "$KVD_PID"

# ---- a KV pool smaller than one page --------------------------------------------------------------------
"$KVD" --config /dev/null --model "$REAL_MODEL" --backend cpu --socket "$T/small.sock" --pool-size 64K \
	>/dev/null 2>"$T/small.log" && fail "kvd started with a 64 KiB pool"
grep -q "smaller than one page" "$T/small.log" || fail "a pool smaller than one page: $(tail -n 2 "$T/small.log")"
ok "pool of 64K: $(grep -o 'KV pool.*' "$T/small.log" | head -n 1)"
