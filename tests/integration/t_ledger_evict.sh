#!/usr/bin/env bash
# t_ledger_evict.sh — evicted_tokens.prefix_eviction: prompt tokens computed
# again although the same owner's identical prefix had been cached, and
# evicted. The tiny model in a pool too small to keep two long prompts:
#   - prompt A, then A again: the second maps its cached prefix (H tokens)
#     and recomputes nothing that was evicted;
#   - prompt B from uid 65534, long enough that its pages must reclaim A's
#     cached ones (pages_evicted grows): then A recomputes what was evicted,
#     its cached tokens plus its prefix_eviction tokens are the H of before,
#     and its prefix_evicted_by names 65534;
#   - another uid sending A has no evicted prefix of its own (the index and
#     its memory of evictions are scoped by owner): 0;
#   - after `kvctl cache drop`, A recomputes all H tokens as evicted, by no
#     requester (prefix_evicted_by null);
#   - A's own long prompt G evicts part of A: A recomputes it, evicted by 0;
#   - a prompt never sent before: 0;
#   - kvctl ledger --report sums them in its prefix answer and per requester,
#     and charges each evicting uid with the tokens its evictions cost.
source "$(dirname "$0")/lib.sh"
need_bins
command -v setpriv >/dev/null || skip "setpriv missing (needed to run a client as a non-root uid)"
TINY=$(tiny_model gqa)
K() { "$KVCTL" --socket "$S" "$@"; }
NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups)
S=$T/kvd.sock
L=$T/ledger.jsonl
printf '[server]\nsocket_mode = 0666\n[log]\nledger = %s\n' "$L" >"$T/kvd.conf"
start_kvd tiny "$S" --config "$T/kvd.conf" --model "$TINY" --pool-size 256K --threads 1
"$RAW" -s "$S" stats >"$T/stats0.json" || fail "stats"
read -r PAGES BS < <($PY -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["pages_total"], s["block_size"])' "$T/stats0.json")
# A: about a third of the pool; B: about three quarters (they cannot both stay cached;
# a word of these is about six tokens of the tiny model)
words() { $PY -c 'import sys; n,w=int(sys.argv[1]),sys.argv[2]; print(" ".join("%s%d" % (w, i) for i in range(n)))' "$@"; }
A=$(words $((PAGES * BS / 3 / 6)) alpha)
B=$(words $((PAGES * BS * 3 / 4 / 6)) beta)
G=$(words $((PAGES * BS * 3 / 4 / 6)) gamma)
K generate --raw --temperature 0 --max-tokens 1 "$A" >/dev/null || fail "A (1)"
K generate --raw --temperature 0 --max-tokens 1 "$A" >/dev/null || fail "A (2)"
NOBODY_GEN=("${NOBODY[@]}" "$KVCTL" --socket "$S" generate --raw --temperature 0 --max-tokens 1)
"${NOBODY_GEN[@]}" "$B" >/dev/null || fail "B as 65534"
K generate --raw --temperature 0 --max-tokens 1 "$A" >/dev/null || fail "A (3)"
"${NOBODY_GEN[@]}" "$A" >/dev/null || fail "A as 65534"
K cache drop >/dev/null || fail "kvctl cache drop"
K generate --raw --temperature 0 --max-tokens 1 "$A" >/dev/null || fail "A (4)"
K generate --raw --temperature 0 --max-tokens 1 "$G" >/dev/null || fail "G"
K generate --raw --temperature 0 --max-tokens 1 "$A" >/dev/null || fail "A (5)"
K generate --raw --temperature 0 --max-tokens 1 "never sent before, $A" >/dev/null || fail "C"
"$RAW" -s "$S" stats >"$T/stats1.json" || fail "stats"
K ledger --report --json >"$T/report.json" || fail "kvctl ledger --report --json"
K ledger --report >"$T/report.txt" || fail "kvctl ledger --report"
$PY - "$L" "$T/stats0.json" "$T/stats1.json" "$T/report.json" "$BS" <<'PYEOF' || fail "prefix_eviction does not match"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
s0, s1 = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
rp = json.load(open(sys.argv[4]))
bs = int(sys.argv[5])
assert len(recs) == 9, len(recs)
a1, a2, b, a3, other, a4, g, a5, c = recs
ev = lambda r: r["evicted_tokens"]["prefix_eviction"]
assert a1["prompt_tokens"] == a2["prompt_tokens"] == a3["prompt_tokens"] == a4["prompt_tokens"] == a5["prompt_tokens"], recs
assert b["uid"] == 65534 and a3["uid"] == 0, (b["uid"], a3["uid"])
H = a2["cached_tokens"]
assert H >= 3 * bs and H >= a1["prompt_tokens"] - bs, (H, a1["prompt_tokens"])  # A's whole pages were shared
assert (a1["cached_tokens"], ev(a1), ev(a2), ev(b)) == (0, 0, 0, 0), (a1, a2, b)
assert s1["pages_evicted"] > s0["pages_evicted"], (s0["pages_evicted"], s1["pages_evicted"])
assert ev(a3) > 0 and a3["cached_tokens"] + ev(a3) == H, (a3["cached_tokens"], ev(a3), H)
assert ev(a3) % bs == 0 or a3["cached_tokens"] + ev(a3) == a3["prompt_tokens"] - 1, ev(a3)
assert other["uid"] == 65534 and other["cached_tokens"] == 0 and ev(other) == 0, other
assert a4["cached_tokens"] == 0 and ev(a4) == H, (a4["cached_tokens"], ev(a4), H)
assert ev(c) == 0 and c["cached_tokens"] == 0, c
assert a3["kv"]["evicted_prefix_tokens"] == ev(a3), a3["kv"]
# who evicted: B's uid for a3, nobody for the drop, A itself after G
by = lambda r: r["evicted_tokens"].get("prefix_evicted_by", "absent")
assert by(a3) == 65534, a3["evicted_tokens"]
assert "prefix_evicted_by" in a4["evicted_tokens"] and by(a4) is None, a4["evicted_tokens"]
assert ev(g) == 0 and ev(a5) > 0 and a5["cached_tokens"] + ev(a5) == H and by(a5) == 0, (g["evicted_tokens"], a5)
for r in (a1, a2, b, other, g, c):  # nothing recomputed: no evictor named
    assert by(r) == "absent", r["evicted_tokens"]
pf = rp["prefix"]
assert pf["recomputed_after_eviction_tokens"] == ev(a3) + ev(a4) + ev(a5), pf
assert pf["evictor_unknown_tokens"] == ev(a4) and pf["evictor_not_recorded_tokens"] == 0, pf
rows = {q["uid"]: q for q in rp["requesters"]}
assert rows[0]["prefix_eviction_tokens"] == ev(a3) + ev(a4) + ev(a5) and rows[65534]["prefix_eviction_tokens"] == 0, rows
assert rows[65534]["prefix_evictions_caused_tokens"] == ev(a3), rows
assert rows[0]["prefix_evictions_caused_tokens"] == ev(a5), rows
print("A: %d prompt tokens, %d shared; after B (uid 65534): %d cached + %d recomputed after eviction; "
      "after a drop: %d; after A's own G: %d" % (a1["prompt_tokens"], H, a3["cached_tokens"], ev(a3), ev(a4), ev(a5)))
open(sys.argv[4] + ".want", "w").write("%d %d %d\n" % (ev(a3), ev(a5), ev(a4)))
PYEOF
want=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["prefix"]["recomputed_after_eviction_tokens"])' "$T/report.json")
grep -q "tokens recomputed although an identical prefix had been cached and evicted: $want " "$T/report.txt" ||
	fail "the report page does not give the $want tokens: $(grep -i evicted "$T/report.txt")"
grep -q "PREFIX_AGAIN" "$T/report.txt" || fail "the requester table has no PREFIX_AGAIN column"
read -r BY_B BY_A UNKNOWN <"$T/report.json.want"
# the 65534 row: no PREFIX_AGAIN of its own, BY_B caused; the 0 row caused BY_A
grep -Eq "^ +65534 +[0-9]+ +[0-9]+ +[0-9]+ +0 +$BY_B " "$T/report.txt" ||
	fail "the report does not charge uid 65534 with the $BY_B tokens its eviction cost: $(grep -E '^ +65534 ' "$T/report.txt")"
grep -Eq "^ +0 +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +$BY_A " "$T/report.txt" ||
	fail "the report does not charge uid 0 with the $BY_A tokens of its self-eviction: $(grep -E '^ +0 ' "$T/report.txt")"
grep -q "PREFIX_AGAIN tokens with no requester as evictor (explicit drops, tenants): $UNKNOWN\$" "$T/report.txt" ||
	fail "the report does not give the $UNKNOWN tokens of the explicit drop: $(grep -i 'no requester' "$T/report.txt")"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
ok "tokens recomputed after their cached prefix was evicted are counted per request, scoped by owner, charged to the evicting uid, and summed by the report"
