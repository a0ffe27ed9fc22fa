#!/usr/bin/env bash
# t_ledger_report.sh — the ledger's accounting fields and kvctl ledger
# --report, each checked against a situation the test makes.
#
# SmolLM2 (real model): a long prompt (>= 1024 tokens), four short requests
# at once (a batch), one prompt sent twice (a shared prefix), a rejection
# (beyond the context window):
#   - every record names the model: name, the file's fingerprint (FNV-1a 64
#     of its size and first 64 KiB, recomputed here), 3 KV heads for 9 query
#     heads, head size 64, the KV type, one group of 30 full-attention layers
#   - slack_bytes = allocated - useful; KV read per step: the mean is the
#     total over the steps, the most is the whole final length's K/V
#   - the report's splits by prompt length and batch width, prefix hit
#     ratios, slack, per-type figures and rejections by cause equal what the
#     records and the counters say; --since in the future selects nothing
# The tiny model in a 1 MiB pool, as another uid: five long generations at
# once (some are preempted and recomputed) and one sliding-window request:
#   - evicted_tokens.preemption_recompute > 0 where preemptions > 0,
#     context_drop and the policy's window in the windowed record
#   - the report's requester rows sum those per uid
# The tiny model with one sequence at a time: of two requests sent together,
# the one queued behind the other waits for compute, not for memory
# (compute_wait_ns about the other's compute time, mem_wait_ns below it).
# The tiny Gemma 3 (generated here): its record lists two groups of layers,
# five with a window of 5 positions and one over everything, 1 KV head for 2
# query heads.
source "$(dirname "$0")/lib.sh"
need_bins
[ -f "$REAL_MODEL" ] || skip "$REAL_MODEL missing (run scripts/setup)"
command -v setpriv >/dev/null || skip "setpriv missing (needed to run a client as a non-root uid)"
TINY=$(tiny_model gqa)
K() { "$KVCTL" --socket "$S" "$@"; }
NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups)

# ---- the real model ---------------------------------------------------------------------
S=$T/kvd.sock
L=$T/ledger.jsonl
printf '[server]\nsocket_mode = 0666\n[log]\nledger = %s\n' "$L" >"$T/kvd.conf"
start_kvd real "$S" --config "$T/kvd.conf" --model "$REAL_MODEL" --pool-size 64M --threads 2
LONG=$(for i in $(seq 1 130); do printf 'The quick brown fox jumps over the lazy dog. '; done)
K generate --raw --temperature 0 --max-tokens 2 "$LONG" >/dev/null || fail "the long prompt"
P=()
for i in 1 2 3 4; do
	K generate --raw --temperature 0 --max-tokens 24 "Count from $i upwards:" >/dev/null & P+=($!)
done
wait "${P[@]}" || fail "a batched request failed"
SHARED="A shared prefix, long enough to fill a few pages of sixteen tokens each, repeated twice by the test. Go:"
K generate --raw --temperature 0 --max-tokens 2 "$SHARED" >/dev/null || fail "shared 1"
K generate --raw --temperature 0 --max-tokens 2 "$SHARED" >/dev/null || fail "shared 2"
"$RAW" -s "$S" generate -n 100000 "too long" >/dev/null 2>&1 # rejected: beyond the context window
[ "$(wc -l <"$L")" = 8 ] || fail "the ledger file has $(wc -l <"$L") records, expected 8"
"$RAW" -s "$S" stats >"$T/stats.json" || fail "stats"
K ledger --report --json >"$T/report.json" || fail "kvctl ledger --report --json"
K ledger --report >"$T/report.txt" || fail "kvctl ledger --report"
cat "$T/report.txt"
$PY - "$L" "$T/stats.json" "$T/report.json" "$REAL_MODEL" <<'PYEOF' || fail "records or report do not match"
import json, os, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
st = json.load(open(sys.argv[2]))
rp = json.load(open(sys.argv[3]))
path = sys.argv[4]
h = 0xcbf29ce484222325
for b in list(os.path.getsize(path).to_bytes(8, "little")) + list(open(path, "rb").read(64 * 1024)):
    h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
done = [r for r in recs if r["finish"] != "rejected"]
for r in done:
    m, kv = r["model"], r["kv"]
    assert m["fingerprint"] == "%016x" % h, (m["fingerprint"], "%016x" % h)
    assert (m["kv_heads"], m["query_heads"], m["head_dim"], m["layers"]) == (3, 9, 64, 30), m
    assert m["layer_windows"] == [{"window": 0, "layers": 30}], m
    assert m["kv_bytes_per_token"] == st["kv_bytes_per_token"] and m["page_bytes"] == st["page_bytes"], m
    assert m["name"] and m["kv_type"] in ("f16", "bf16", "f32", "q8_0", "q4_0"), m
    assert r["slack_bytes"] == kv["kv_bytes_allocated"] - kv["kv_bytes_useful"] > 0, r
    assert r["decode_read_bytes_mean"] == kv["kv_read_bytes"] // kv["steps"], r
    assert r["decode_read_bytes_max"] == kv["kv_read_bytes_max_step"] == kv["len_tokens"] * m["kv_bytes_per_token"], r
    assert r["evicted_tokens"] == {"context_drop": 0, "swap": 0, "preemption_recompute": 0, "prefix_eviction": 0}, r
    assert r["compute_wait_ns"] >= 0 and r["batch_width_mean"] >= 1, r
long = [r for r in done if r["prompt_tokens"] >= 1024]
assert len(long) == 1, [r["prompt_tokens"] for r in done]
batched = [r for r in done if r["batch_width_mean"] >= 1.5]
assert len(batched) >= 2, [r["batch_width_mean"] for r in done]
assert done[-1]["cached_tokens"] >= 16, done[-1]  # the second send of the shared prompt

held = lambda r: r["kv"]["pages_peak"] * r["model"]["page_bytes"]
def split(sel):
    return {"requests": len(sel), "kv_bytes": sum(map(held, sel)), "read_bytes": sum(r["kv"]["kv_read_bytes"] for r in sel)}
mem = rp["memory"]
assert mem["by_prompt_length"]["long"] == split(long), (mem, split(long))
assert mem["by_prompt_length"]["short"] == split([r for r in done if r["prompt_tokens"] < 256]), mem
assert mem["by_batch_width"]["batched"] == split(batched), mem
assert mem["by_batch_width"]["alone"] == split([r for r in done if r["batch_width_mean"] < 1.5]), mem
assert (mem["kv_heads"], mem["query_heads"]) == (3, 9), mem
assert mem["read_bytes_max_step"] == max(r["decode_read_bytes_max"] for r in done) == long[0]["decode_read_bytes_max"]
pf = rp["prefix"]
assert (pf["lookup_tokens"], pf["hit_tokens"]) == (st["prefix_query_tokens"], st["prefix_hit_tokens"]), (pf, st)
assert pf["hit_tokens"] >= done[-1]["cached_tokens"], pf
assert pf["cached_tokens"] == sum(r["cached_tokens"] for r in done) and pf["prompt_tokens"] == sum(r["prompt_tokens"] for r in done)
assert pf["recomputed_after_eviction_tokens"] == 0, pf  # a 64 MiB pool evicts nothing here (t_ledger_evict.sh does)
sl = rp["slack"]
assert sl["slack_bytes"] == sum(r["slack_bytes"] for r in done) and sl["kv_bytes_allocated"] == sum(r["kv"]["kv_bytes_allocated"] for r in done), sl
assert sl["ignorable"] == (sl["slack_bytes"] / sl["kv_bytes_allocated"] < 0.10), sl
[kt] = rp["kv_types"]
assert kt["kv_type"] == done[0]["model"]["kv_type"] and kt["requests"] == len(done), kt
assert kt["generated_tokens"] == sum(r["generated_tokens"] for r in done), kt
assert (rp["records"], rp["served"], rp["rejected"]) == (8, 7, 1), rp
assert rp["rejections"] == [{"code": -1002, "cause": "context window (prompt + max_tokens)", "count": 1,
                             "example": recs[-1]["reason"]}], rp["rejections"]
PYEOF
grep -q "^6. Rejections by cause" "$T/report.txt" && grep -q "1  context window (prompt + max_tokens) (code -1002)" "$T/report.txt" ||
	fail "the page does not show the rejection"
grep -q "tokens recomputed although an identical prefix had been cached and evicted: 0 " "$T/report.txt" ||
	fail "the page does not give the tokens recomputed after an eviction"
ok "records name the model and carry slack bytes and read per step; the report's figures match the records and counters"
future=$(( $(date +%s) + 3600 ))
K ledger --report --json --since "@$future" >"$T/none.json" || fail "--since"
$PY -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['records'] == 0, r" "$T/none.json" || fail "--since in the future selected records"
K ledger --report --json --since 1h >"$T/hour.json" || fail "--since 1h"
$PY -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['records'] == 8, r" "$T/hour.json" || fail "--since 1h lost records"
K ledger --report --since yesterday >/dev/null 2>&1
[ $? = 2 ] || fail "--since yesterday should be a usage error"
ok "--since selects records by time (none from an hour ahead, all from an hour ago; a bad TIME is a usage error)"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"

# ---- evictions: the tiny model in a 1 MiB pool, as uid 65534 ------------------------------------
S=$T/tiny.sock
L=$T/tiny.jsonl
printf '[server]\nsocket_mode = 0666\n[log]\nledger = %s\n' "$L" >"$T/tiny.conf"
start_kvd tiny "$S" --config "$T/tiny.conf" --model "$TINY" --pool-size 1M --threads 1
P=()
for i in 1 2 3 4 5; do
	"${NOBODY[@]}" "$KVCTL" --socket "$S" generate --raw --max-tokens 400 "request number $i goes here" >/dev/null & P+=($!)
done
wait "${P[@]}" || fail "a request in the small pool failed"
K generate --raw --max-tokens 120 --context-policy sliding-window --window 32 "a window of thirty-two" >/dev/null ||
	fail "the windowed request"
K ledger --report --json >"$T/tiny-report.json" || fail "report (tiny)"
$PY - "$L" "$T/tiny-report.json" <<'PYEOF' || fail "evictions do not match"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
rp = json.load(open(sys.argv[2]))
pre = [r for r in recs if r["preemptions"]]
assert pre, "no request was preempted in a pool of 1 MiB"
for r in recs[:5]:
    assert r["uid"] == 65534, r
    assert (r["evicted_tokens"]["preemption_recompute"] > 0) == (r["preemptions"] > 0), r
w = recs[5]
assert w["context_policy"] == "sliding-window" and w["context_window"] == 32 and w["context_sinks"] == 0, w
assert w["evicted_tokens"]["context_drop"] == w["context_dropped_tokens"] > 0, w
rows = {q["uid"]: q for q in rp["requesters"]}
want = sum(r["evicted_tokens"]["preemption_recompute"] for r in recs[:5])
assert rows[65534]["recompute_tokens"] == want and rows[65534]["preemptions"] == sum(r["preemptions"] for r in recs[:5]), rows
assert rows[0]["context_drop_tokens"] == w["context_dropped_tokens"] and rows[0]["recompute_tokens"] == 0, rows
print("preempted %d of 5, %d tokens recomputed; %d dropped by the window" % (len(pre), want, w["context_dropped_tokens"]))
PYEOF
ok "preempted requests record the tokens they recompute, a window its drops; the report sums them per requester"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"

# ---- a model with local layers: the windows per layer group --------------------------------------
PYV=$ROOT/.venv/bin/python
[ -x "$PYV" ] || PYV=$PY
"$PYV" "$ROOT/scripts/gen_tiny_models.py" --arch --only gemma3 "$T/models" >/dev/null 2>&1 || fail "cannot generate tiny-gemma3"
S=$T/gemma.sock
start_kvd gemma "$S" --model "$T/models/tiny-gemma3.gguf" --pool-size 4M --threads 1
"$RAW" -s "$S" generate --raw -n 4 "hello" >/dev/null || fail "gemma3 request"
K ledger --json -n 1 >"$T/gemma.json" || fail "kvctl ledger (gemma3)"
$PY - "$T/gemma.json" <<'PYEOF' || fail "gemma3 model: $(cat "$T/gemma.json")"
import json, sys
m = json.loads(open(sys.argv[1]).readline())["model"]
assert m["layer_windows"] == [{"window": 5, "layers": 5}, {"window": 0, "layers": 1}], m
assert (m["kv_heads"], m["query_heads"], m["head_dim"], m["layers"]) == (1, 2, 64, 6), m
PYEOF
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
ok "a model with local layers: its record lists the window of each group of layers and its heads"

# ---- waiting for compute: one sequence at a time ---------------------------------------------------
S=$T/one.sock
L=$T/one.jsonl
printf '[scheduler]\nmax_num_seqs = 1\n[log]\nledger = %s\n' "$L" >"$T/one.conf"
start_kvd one "$S" --config "$T/one.conf" --model "$TINY" --pool-size 4M --threads 1
# (greedy: this prompt runs its 300 tokens on the tiny model; sent twice at once)
P=()
for i in 1 2; do "$RAW" -s "$S" generate --raw -n 300 "queued 2" >/dev/null 2>&1 & P+=($!); done
wait "${P[@]}" || fail "a request with max_num_seqs 1 failed"
$PY - "$L" <<'PYEOF' || fail "compute wait: $(cat "$L")"
import json, sys
a, b = [json.loads(l) for l in open(sys.argv[1])]  # in the order they finished
assert a["generated_tokens"] == 300 and b["queue_ns"] >= 5_000_000, (a["generated_tokens"], b["queue_ns"])
assert a["compute_wait_ns"] <= a["kv"]["compute_ns"] // 10, a  # the first ran alone
assert b["compute_wait_ns"] >= b["queue_ns"] // 2, (b["compute_wait_ns"], b["queue_ns"])
assert b["kv"]["mem_wait_ns"] < b["compute_wait_ns"], (b["kv"]["mem_wait_ns"], b["compute_wait_ns"])
print("queued request: %.1f ms in the queue, %.1f ms of it waiting for compute, %.1f ms for memory" % (
    b["queue_ns"] / 1e6, b["compute_wait_ns"] / 1e6, b["kv"]["mem_wait_ns"] / 1e6))
PYEOF
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
ok "a request queued behind another for a sequence slot records its wait as waiting for compute, not for memory"
