#!/usr/bin/env bash
# t_context_policy.sh — context policies through the daemon (kvd on a tiny
# random-weight model with max_model_len 128):
#   - the default (error) refuses a generation past the context;
#   - sliding-window and sinks generate 4x the context: the DONE record and
#     the ledger say how much was dropped, pages in use stay flat (the
#     ledger's pages_peak is the same for 1x and 4x the context) and within
#     the window's bound, the K/V kept is the window (plus the sinks);
#   - the tokens the daemon generates equal kvd_stream's (the engine-level
#     driver the streaming NumPy reference checks, tests/reference/t_window.sh)
#     for the same prompt and window: scheduling, chunking and the prefix
#     cache do not change the policy's result;
#   - a window policy the backend cannot do is refused with a message (the
#     CUDA plug-in has no kv_shift; checked in tests/gpu when a GPU exists);
#   - truncate-oldest on a session drops whole oldest turns and keeps the
#     system prompt: the tokens dropped equal the session's history up to a
#     turn boundary minus the system block, tokenized independently.
. "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || skip "$KVCTL not built"
STREAM=$ROOT/$BUILD/tests/kvd_stream
[ -x "$STREAM" ] || fail "$STREAM not built"
M=$(tiny_model mha)
S=$T/kvd.sock
L=$T/ledger.jsonl
export KVD_SOCKET=$S
start_kvd main "$S" --model "$M" --max-model-len 128 --pool-size 4M --threads 1 --block-size 16 --ledger "$L"

PROMPT="the quick brown fox"
out=$("$KVCTL" generate --raw --temperature 0 --max-tokens 600 "$PROMPT" 2>&1)
rc=$?
[ $rc -ne 0 ] || fail "600 tokens past a 128-token context were accepted without a policy"
echo "$out" | grep -q "context window" || fail "refusal does not name the context window: $out"
ok "without a policy, generating past the context is refused ($out)"

"$KVCTL" tokenize "$PROMPT" | tr ' ' ',' >"$T/prompt.ids"

check_window() { # POLICY EXTRA-ARGS...
	local policy=$1; shift
	"$KVCTL" generate --raw --temperature 0 --max-tokens 600 --context-policy "$policy" "$@" --json "$PROMPT" \
		>"$T/$policy.json" || fail "$policy: generate failed: $(cat "$T/$policy.json")"
	"$KVCTL" generate --raw --temperature 0 --max-tokens 120 --context-policy "$policy" "$@" --json "$PROMPT" \
		>"$T/$policy.short.json" || fail "$policy: short generate failed"
	local win sinks=0
	win=$(echo "$@" | sed -n 's/.*--window \([0-9]*\).*/\1/p')
	case "$*" in *--sinks*) sinks=16 ;; esac
	"$STREAM" --model "$M" --tokens-file "$T/prompt.ids" --policy "$policy" --window "$win" --sinks 4 \
		--block-size 16 --generate 600 >"$T/$policy.stream.json" 2>"$T/stream.log" || fail "kvd_stream failed"
	$PY - "$T/$policy.json" "$T/$policy.short.json" "$L" "$T/$policy.stream.json" "$policy" "$win" "$sinks" <<'PYEOF' || fail "$policy: see above"
import json, sys
full, short, ledger, stream, policy, win, sinks = sys.argv[1:8]
win, sinks = int(win), int(sinks)
full, short, st = json.load(open(full)), json.load(open(short)), json.load(open(stream))
recs = [json.loads(l) for l in open(ledger)]
rl = [r for r in recs if r.get("context_policy") == policy]
assert len(rl) == 2, "ledger: %d %s records" % (len(rl), policy)
long_rec, short_rec = rl[0], rl[1]
bs, maxw = 16, win + 15
n = full["prompt_tokens"] + full["generated_tokens"]
assert n > 4 * 128, "only %d tokens (prompt + generated), less than 4x the context" % n
kv = long_rec["kv"]
# the last sampled token is not computed: K/V for n - 1 tokens, some dropped
assert kv["len_tokens"] + kv["dropped_tokens"] == n - 1, kv
assert full["context_dropped_tokens"] == kv["dropped_tokens"] == long_rec["context_dropped_tokens"] > 0, \
    (full["context_dropped_tokens"], kv["dropped_tokens"])
assert sinks + win - 1 <= kv["len_tokens"] <= sinks + maxw, "kept %d tokens, window %d..%d + sinks %d" % (
    kv["len_tokens"], win, maxw, sinks)
bound = sinks // bs + (maxw + bs - 1) // bs
assert kv["pages_peak"] <= bound, "pages peak %d > bound %d" % (kv["pages_peak"], bound)
assert short_rec["kv"]["pages_peak"] == kv["pages_peak"], "pages peak %d at 1x the context, %d at 4x" % (
    short_rec["kv"]["pages_peak"], kv["pages_peak"])
g = full["token_ids"]
assert g == st["generated"][:len(g)], "daemon and kvd_stream diverge at token %d" % next(
    i for i in range(len(g)) if i >= len(st["generated"]) or g[i] != st["generated"][i])
print("  %s: %d tokens through a 128-token context, %d dropped, %d kept, pages peak %d (1x: %d, bound %d); "
      "same tokens as kvd_stream" % (policy, n, kv["dropped_tokens"], kv["len_tokens"], kv["pages_peak"],
                                     short_rec["kv"]["pages_peak"], bound))
PYEOF
	ok "$policy generates 4x the context in flat memory"
}
check_window sliding-window --window 64
check_window sinks --window 64 --sinks 4

out=$("$KVCTL" generate --raw --max-tokens 10 --context-policy sinks --window 500 "$PROMPT" 2>&1) &&
	fail "a window larger than the context was accepted"
echo "$out" | grep -q "do not fit the context" || fail "oversized window: unclear refusal: $out"
ok "a window that does not fit the context is refused ($out)"
out=$("$KVCTL" generate --raw --max-tokens 10 -n 2 --context-policy sliding-window --window 100 "$PROMPT" 2>&1) &&
	fail "samples under a window policy were served: $out"
grep -q "2 samples cannot be combined with context policy sliding-window" <<<"$out" ||
	fail "samples under a window policy: unclear refusal: $out"
ok "parallel samples under a window policy are refused with a reason"

# ---- truncate-oldest on a session ------------------------------------------------
SYS="Be terse."
sid=$("$KVCTL" session open --context-policy truncate-oldest) || fail "session open failed"
head=$("$KVCTL" tokenize --special "<|im_start|>system
$SYS<|im_end|>" | wc -w)
: >"$T/turns"
for i in 1 2 3 4 5 6; do
	"$KVCTL" generate --session "$sid" --system "$SYS" --temperature 0 --max-tokens 12 --json \
		"Question number $i: tell me about the colours of the sea and the sky." >>"$T/turns" ||
		fail "turn $i failed: $(tail -1 "$T/turns")"
done
"$KVCTL" session close "$sid"
$PY - "$T/turns" "$L" "$head" <<'PYEOF' || fail "truncate-oldest: see above"
import json, sys
turns = [json.loads(l) for l in open(sys.argv[1])]
head = int(sys.argv[3])
recs = [json.loads(l) for l in open(sys.argv[2]) if '"truncate-oldest"' in l]
assert len(recs) == len(turns), (len(recs), len(turns))
hist = 0          # session history before each turn (untruncated bookkeeping)
ends = []         # history length at the end of each earlier turn: the turn boundaries
truncated = 0
for i, (t, r) in enumerate(zip(turns, recs)):
    drop = t["context_dropped_tokens"]
    assert drop == r["context_dropped_tokens"], (drop, r)
    if drop:
        # the dropped span is the history from the end of the system block to a turn boundary
        assert any(drop == e - head for e in ends), "dropped %d tokens; turn ends %s, system block %d" % (
            drop, ends, head)
        assert r["context_truncated_turns"] >= 1
        hist -= drop
        ends = [e - drop for e in ends if e - drop > head]
        truncated += 1
    n_new = t["prompt_tokens"] - hist
    assert n_new > 0, (t, hist)
    assert t["prompt_tokens"] + 12 <= 128, "turn %d: %d prompt tokens + 12 past the context" % (i, t["prompt_tokens"])
    hist = t["prompt_tokens"] + t["generated_tokens"]
    ends.append(hist)
assert truncated >= 1, "no turn was truncated: %s" % [t["prompt_tokens"] for t in turns]
print("  %d turns, %d truncated; dropped spans start right after the %d-token system block" % (
    len(turns), truncated, head))
PYEOF
ok "truncate-oldest drops the oldest turns and keeps the system prompt"

stop_kvd "$KVD_PID" || fail "kvd exited with an error"

# ---- the configured default ([scheduler] context_policy) ------------------------------
S2=$T/kvd2.sock
export KVD_SOCKET=$S2
start_kvd second "$S2" --model "$M" --max-model-len 128 --pool-size 4M --threads 1 --context-policy sinks \
	--ledger "$T/ledger2.jsonl"
LONG="$PROMPT $PROMPT $PROMPT $PROMPT $PROMPT $PROMPT $PROMPT $PROMPT $PROMPT $PROMPT"
"$KVCTL" generate --raw --temperature 0 --max-tokens 100 --json "$LONG" >"$T/default.json" ||
	fail "with context_policy = sinks, a request past the context failed: $(cat "$T/default.json")"
$PY - "$T/default.json" "$T/ledger2.jsonl" <<'PYEOF' || fail "configured default policy: see above"
import json, sys
d = json.load(open(sys.argv[1]))
r = [json.loads(l) for l in open(sys.argv[2])][-1]
assert d["prompt_tokens"] + d["generated_tokens"] > 128, d
assert d["context_dropped_tokens"] > 0 and r["context_policy"] == "sinks", (d, r)
print("  no policy named, [scheduler] context_policy = sinks: %d + %d tokens, %d dropped" % (
    d["prompt_tokens"], d["generated_tokens"], d["context_dropped_tokens"]))
PYEOF
ok "the configured context policy applies to requests that name none"
stop_kvd "$KVD_PID" || fail "kvd exited with an error"
