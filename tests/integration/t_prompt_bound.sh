#!/usr/bin/env bash
# t_prompt_bound.sh — a prompt far over the context is refused after about a
# context's worth of tokenizing, not after all of it: 1 MB of text (about
# 400,000 tokens) sent to the default model (context 8,192 tokens) is
# refused with "at least N prompt tokens ... exceeds the context window", N
# a little over the room the context leaves, not the text's full count, in
# chat and raw mode; `kvctl count` of the same text still gives the exact
# count. (The window policies, which may run past the context, are never
# bounded: daemon/handlers.c.)
source "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || fail "$KVCTL not built"
[ -f "$REAL_MODEL" ] || fail "default model missing (run scripts/setup)"
S=$T/kvd.sock
start_kvd bound "$S" --model "$REAL_MODEL" --threads 2
$PY -c 'import sys; p = "the quick brown fox jumps over the lazy dog, 1234567890. "; sys.stdout.write((p * (1048576 // len(p) + 1))[:1048576])' >"$T/big.txt"
full=$(KVD_SOCKET=$S "$KVCTL" count - <"$T/big.txt") || fail "kvctl count: $full"
[ "$full" -gt 100000 ] || fail "the text counts $full tokens"
for mode in chat raw; do
	args=(); [ $mode = raw ] && args=(--raw)
	KVD_SOCKET=$S "$KVCTL" generate "${args[@]}" --max-tokens 8 - <"$T/big.txt" >/dev/null 2>"$T/$mode.err" &&
		fail "$mode: a 1 MB prompt was accepted"
	grep -qE "at least [0-9]+ prompt tokens \+ max_tokens 8 = [0-9]+ exceeds the context window" "$T/$mode.err" ||
		fail "$mode: the refusal does not say the prompt is over the context: $(cat "$T/$mode.err")"
	n=$(grep -oE 'at least [0-9]+' "$T/$mode.err" | grep -oE '[0-9]+')
	[ "$n" -lt $((full / 10)) ] || fail "$mode: tokenized $n of $full tokens before refusing"
	ok "$mode: a 1 MB prompt ($full tokens) refused after $n tokens: $(head -n 1 "$T/$mode.err")"
done
again=$(KVD_SOCKET=$S "$KVCTL" count - <"$T/big.txt")
[ "$again" = "$full" ] || fail "kvctl count changed: $full then $again"
ok "kvctl count still gives the exact count ($full)"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
