#!/usr/bin/env bash
# t_local_release.sh — releasing the K/V that windowed layers no longer read
# ([kv] release_local, kvmm_seq_release).
#
# tiny-gemma3 has six layers: five attend over a window of 5 positions, one
# (the last) over everything (scripts/gen_tiny_models.py); tiny-mistral's two
# layers both have the window. Once a page is older than the window, only
# the global layer reads it: its share goes to a packed page holding six
# pages' worth (n_layer / n_global = 6), and with no global layer nothing is
# kept. Checked here:
#   - logits are bit-identical with and without release, for page sizes 1, 4
#     and 16, whole and chunked prompts, a batch of sequences, shuffled page
#     placement, and every sequence swapped out and back in after each step
#   - the pages a sequence holds at the end are what that layout gives,
#     computed here from the model's structure: L tokens, page size B,
#     window W: released r = (L - W) / B pages (when L >= W + B), held =
#     ceil(L / B) - r + ceil(r / 6) for tiny-gemma3 and ceil(L / B) - r for
#     tiny-mistral
#   - the daemon does it by default and not with --no-release-local (the
#     ledger's kv record: released_tokens, packed_pages), with the same
#     text, the same seeded parallel samples (forks of released sequences)
#     and the same two-turn session (its second turn reusing the first's KV)
#   - a context whose whole K/V would not fit the pool is served with
#     release and refused without
source "$(dirname "$0")/lib.sh"
need_bins
EVAL=$ROOT/$BUILD/tests/kvd_eval
[ -x "$EVAL" ] || fail "$EVAL missing (make)"
G=$(tiny_model gemma3)
M=$(tiny_model mistral)
toks=$(seq -s, 3 2 121) # 60 prompt tokens

expect_held() { # MODEL_KIND LEN B -> "held released"
	$PY - "$@" <<'PYEOF'
import sys
kind, L, B = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
W = 5
n = (L + B - 1) // B
r = (L - W) // B if L >= W + B else 0
held = n - r + ((r + 5) // 6 if kind == "gemma3" else 0)
print(held, r)
PYEOF
}

n=0
for kind in gemma3 mistral; do
	model=$G; [ $kind = mistral ] && model=$M
	for bs in 1 4 16; do
		for chunk in 0 7; do
			args=(--model "$model" --tokens "$toks" --n-predict 90 --block-size $bs --chunk $chunk --threads 2)
			"$EVAL" "${args[@]}" --logits-out "$T/rel.bin" >"$T/rel.json" || fail "kvd_eval $kind bs $bs"
			"$EVAL" "${args[@]}" --keep-local --logits-out "$T/keep.bin" >"$T/keep.json" || fail "kvd_eval --keep-local"
			cmp -s "$T/rel.bin" "$T/keep.bin" || fail "$kind bs $bs chunk $chunk: logits differ with release"
			read -r held rel < <(expect_held $kind $((60 + 89)) $bs)
			$PY - "$T/rel.json" "$T/keep.json" "$held" "$rel" "$bs" <<'PYEOF' || fail "$kind bs $bs: pages held"
import json, sys
a, k = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
held, rel, bs = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
assert a["generated"] == k["generated"], (a["generated"], k["generated"])
assert a["kv_pages_released"] == rel and a["kv_pages_held"] == held, (a, held, rel)
assert k["kv_pages_released"] == 0 and k["kv_pages_held"] == (149 + bs - 1) // bs, k
PYEOF
			n=$((n + 1))
		done
	done
done
ok "$n runs: logits identical with release; pages held as the layout gives (e.g. gemma3 page 4: $(expect_held gemma3 149 4) of 38)"

# a batch with shuffled placement, and every sequence swapped out and in
# after every step (packed pages go to swap and come back)
for i in 1 2 3; do seq -s, $i 3 $((100 + i * 20)); done >"$T/batch"
for kind in gemma3 mistral; do
	model=$G; [ $kind = mistral ] && model=$M
	args=(--model "$model" --batch-file "$T/batch" --n-predict 40 --block-size 4 --chunk 9 --shuffle-seed 7)
	"$EVAL" "${args[@]}" --logits-out "$T/b_rel" >"$T/b_rel.json" || fail "kvd_eval batch $kind"
	"$EVAL" "${args[@]}" --keep-local --logits-out "$T/b_keep" >"$T/b_keep.json" || fail "kvd_eval batch --keep-local"
	"$EVAL" "${args[@]}" --swap-each-step --logits-out "$T/b_swap" >"$T/b_swap.json" || fail "kvd_eval batch --swap-each-step"
	for i in 0 1 2; do
		cmp -s "$T/b_rel.$i" "$T/b_keep.$i" || fail "$kind batch sequence $i: logits differ with release"
		cmp -s "$T/b_rel.$i" "$T/b_swap.$i" || fail "$kind batch sequence $i: logits differ after swapping"
	done
	grep -q '"kv_pages_released":[1-9]' "$T/b_swap.json" || fail "$kind: nothing was released: $(cat "$T/b_swap.json")"
done
ok "batches with shuffled pages, swapped out and in after every step: logits identical"

# the daemon: on by default, off with --no-release-local; the same text,
# the same seeded samples (forks share packed pages, copy them before
# writing) and the same two-turn session
text=$(for i in $(seq 1 40); do printf 'word%d and ' $i; done)
for mode in on off; do
	extra=(); [ $mode = off ] && extra=(--no-release-local)
	printf '[log]\nledger = %s\n' "$T/ledger-$mode.jsonl" >"$T/kvd-$mode.conf"
	start_kvd $mode "$T/$mode.sock" --config "$T/kvd-$mode.conf" --model "$G" --pool-size 16M --threads 2 \
		--block-size 4 "${extra[@]}"
	"$RAW" -s "$T/$mode.sock" generate --raw -n 40 --temperature 0 "$text" >"$T/out-$mode.txt" 2>"$T/done-$mode.txt" ||
		fail "generate ($mode): $(cat "$T/done-$mode.txt")"
	KVD_SOCKET=$T/$mode.sock "$KVCTL" generate --raw -n 3 --seed 11 --temperature 3 --max-tokens 30 --json \
		"$text" >"$T/samples-$mode.json" || fail "generate -n 3 ($mode)"
	"$RAW" -s "$T/$mode.sock" stats >"$T/stats-$mode.json" || fail "stats ($mode)"
	KVD_RAW_CLIENT_VERSION=0x000300 "$RAW" -s "$T/$mode.sock" stats >"$T/stats03-$mode.json" || fail "stats as 0.3 ($mode)"
	"$RAW" -s "$T/$mode.sock" session --raw -n 20 --temperature 0 "$text" "and then $text" >"$T/session-$mode.txt" \
		2>"$T/session-$mode.err" || fail "session ($mode): $(cat "$T/session-$mode.err")"
	grep -o 'prompt=[0-9]* cached=[0-9]* generated=[0-9]*' "$T/session-$mode.err" >"$T/session-$mode.done"
	stop_kvd "$KVD_PID" || fail "kvd ($mode) did not stop cleanly"
done
cmp -s "$T/out-on.txt" "$T/out-off.txt" || fail "the daemon's text differs with release"
$PY - "$T/samples-on.json" "$T/samples-off.json" <<'PYEOF' || fail "seeded samples differ with release"
import json, sys
a, b = (json.load(open(f))["samples"] for f in sys.argv[1:3])
assert len(a) == 3 and [s["token_ids"] for s in a] == [s["token_ids"] for s in b], (a, b)
PYEOF
cmp -s "$T/session-on.txt" "$T/session-off.txt" && cmp -s "$T/session-on.done" "$T/session-off.done" ||
	fail "the session's turns differ with release: $(cat "$T"/session-*.done)"
grep -q "cached=2[0-9][0-9] " "$T/session-on.done" || fail "the second turn did not reuse the session's KV: $(cat "$T/session-on.done")"
$PY - "$T/ledger-on.jsonl" "$T/ledger-off.jsonl" <<'PYEOF' || fail "ledger: $(cat "$T"/ledger-*.jsonl)"
import json, sys
recs_on = [json.loads(l) for l in open(sys.argv[1])]
on = recs_on[0]["kv"]
off = [json.loads(l) for l in open(sys.argv[2])][0]["kv"]
# the samples and the session's turns released pages too
assert sum(r["kv"]["released_tokens"] > 0 for r in recs_on[1:]) >= 4, recs_on[1:]
L = on["len_tokens"]
assert L == off["len_tokens"] and L > 100, (on, off)
r = (L - 5) // 4
assert on["released_tokens"] == 4 * r and on["packed_pages"] == (r + 5) // 6, on
assert on["pages"] == (L + 3) // 4 - r + (r + 5) // 6, on
assert off["released_tokens"] == 0 and off["packed_pages"] == 0 and off["pages"] == (L + 3) // 4, off
print(f"{L} tokens: {on['pages']} pages held with release, {off['pages']} without")
open(sys.argv[1] + ".len", "w").write(str(L))
PYEOF
# kvctl plan's bill for this model's layout agrees with what the daemon held
L=$(cat "$T/ledger-on.jsonl.len")
"$KVCTL" plan --layers 6 --kv-heads 1 --head-dim 64 --block-size 4 --window 5 --global-layers 1 --context "$L" \
	--json >"$T/plan.json" || fail "kvctl plan --window"
$PY - "$T/plan.json" "$T/ledger-on.jsonl" <<'PYEOF' || fail "kvctl plan: $(cat "$T/plan.json")"
import json, sys
plan = json.load(open(sys.argv[1]))
kv = [json.loads(l) for l in open(sys.argv[2])][0]["kv"]
assert plan["pages_per_request"] == kv["pages"], (plan, kv)
assert plan["released_pages"] * 4 == kv["released_tokens"] and plan["packed_pages"] == kv["packed_pages"], (plan, kv)
PYEOF
$PY - "$T" <<'PYEOF' || fail "stats: $(cat "$T"/stats*.json)"
import json, sys
t = sys.argv[1]
on, off, old = (json.load(open(t + "/%s.json" % n)) for n in ("stats-on", "stats-off", "stats03-on"))
# the first request and the samples' prompt (forks inherit what it released)
# each released the pages of at least 266 tokens less the window
assert on["pages_released"] >= 2 * ((266 - 5) // 4), on
assert on["pages_packed"] == 0 and on["pages_used"] == 0, on   # all finished: packed pages freed
assert off["pages_released"] == 0, off
assert old["pages_released"] == 0 and old["pages_packed"] == 0, old  # a 0.3 client's reserved fields
print("stats: pages_released", on["pages_released"])
PYEOF
ok "the daemon releases by default (ledger), not with --no-release-local; text, seeded samples and a session the same"

# a context whose whole K/V would not fit the pool is served with release
# (its pages held stay bounded), and refused without it. tiny-gemma3's
# pages of 4 tokens are 6 layers x K,V x 4 x 64 x 2 bytes = 6144 bytes.
for mode in on off; do
	extra=(); [ $mode = off ] && extra=(--no-release-local)
	start_kvd small-$mode "$T/s-$mode.sock" --model "$G" --pool-size $((40 * 6144)) --threads 2 --block-size 4 \
		--max-tokens-per-step 16 --no-prefix-caching "${extra[@]}"
	"$RAW" -s "$T/s-$mode.sock" generate --raw -n 40 --temperature 0 "$text" >"$T/small-$mode.txt" 2>"$T/small-done-$mode.txt"
	echo $? >"$T/small-rc-$mode"
	stop_kvd "$KVD_PID" || fail "kvd (small pool, $mode) did not stop cleanly"
done
[ "$(cat "$T/small-rc-on")" = 0 ] || fail "with release, 271 tokens in 40 pages: $(cat "$T/small-done-on.txt")"
cmp -s "$T/small-on.txt" "$T/out-on.txt" || fail "the small pool's text differs"
[ "$(cat "$T/small-rc-off")" = 2 ] && grep -q "^ERROR" "$T/small-done-off.txt" ||
	fail "without release, 68 pages in a pool of 40 should be refused: $(cat "$T/small-done-off.txt")"
ok "a 271-token context runs in a 40-page pool with release (68 pages without: refused: $(head -c 120 "$T/small-done-off.txt"))"
