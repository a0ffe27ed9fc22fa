#!/usr/bin/env bash
# t_eval_quick.sh — the evaluation report's quick variant (bench/eval/report.py
# --quick) on the tiny model: 160 tokens of tests/data/text/lighthouse.txt,
# the f32 reference, f16, an f16 sliding window of 32 and truncate-oldest at 64
# tokens, and the prefix check.
#   - policies.csv and prefix.csv have the documented columns;
#   - the reference run's mean loss is the NumPy reference's
#     (tests/reference/ref.py, f32 cache, the engine's int8 activations) over
#     the same tokens, within 0.02 nats a token (the random tiny model's
#     logits are large: its perplexity is huge, its loss about 27 nats);
#     its KL to itself is 0;
#   - f16 costs 2 * layers * KV heads * head size * 2 bytes a token (read
#     from the GGUF file); the window holds fewer bytes than full attention
#     and changes the distributions (KL > 0); truncate-oldest restarts (160
#     tokens through 64: at least 3 times) and attends 64 tokens at most;
#   - prefix sharing: every logits row after the shared prefix is bit-identical
#     to the same request computed alone, for f32 and f16, and rows were compared.
source "$(dirname "$0")/lib.sh"
[ -x "$ROOT/$BUILD/tests/kvd_policy_eval" ] || skip "kvd_policy_eval not built"
GPY=$ROOT/.venv/bin/python
"$GPY" -c 'import numpy, gguf' 2>/dev/null || skip "numpy/gguf (.venv, scripts/setup) missing"
TINY=$(tiny_model gqa)
PLOTS=--no-plots
"$GPY" -c 'import matplotlib' 2>/dev/null && PLOTS=
t0=$(date +%s%N)
nice "$GPY" bench/eval/report.py --quick $PLOTS --model "$TINY" --label tiny --threads 1 --out "$T/q" >"$T/report.log" 2>&1 ||
	fail "report.py --quick: $(tail -5 "$T/report.log")"
echo "  report.py --quick took $(( ($(date +%s%N) - t0) / 1000000 )) ms"
"$ROOT/$BUILD/tests/kvd_policy_eval" --model "$TINY" --tokenize tests/data/text/lighthouse.txt >"$T/ids" || fail "tokenize"
"$GPY" - "$T/q" "$TINY" "$T/ids" "$PLOTS" <<'EOF' || fail "the quick report (above)"
import csv, os, sys
import numpy as np
import gguf
sys.path.insert(0, "tests/reference")
import ref
out, path, ids_path, plots = sys.argv[1:5]
pol = list(csv.DictReader(open(os.path.join(out, "policies.csv"))))
pre = list(csv.DictReader(open(os.path.join(out, "prefix.csv"))))
assert list(pol[0].keys()) == ["model", "run", "kv_type", "policy", "window", "sinks", "kv_bytes_peak",
    "kv_bytes_per_token", "read_bytes_per_token", "kv_slots_mean", "ppl", "ppl_ref", "kl_mean", "kl_max", "top1",
    "scored", "restarts", "kv_bytes_by_group"], list(pol[0].keys())
assert list(pre[0].keys()) == ["model", "kv_type", "prefix_tokens", "hit_tokens", "request_tokens", "compared_rows",
    "identical_rows", "max_abs_diff", "bit_identical"], list(pre[0].keys())
p = {r["run"]: r for r in pol}
assert set(p) == {"f32/full", "f16/full", "f16/window/32", "f16/truncate/64"}, set(p)
r32, r16, win, tr = p["f32/full"], p["f16/full"], p["f16/window/32"], p["f16/truncate/64"]
assert int(tr["restarts"]) >= 3 and float(tr["kv_slots_mean"]) <= 64 and float(tr["kl_mean"]) > 0, tr
assert float(r32["kl_mean"]) == 0 and r32["ppl"] == r32["ppl_ref"], r32
# the reference forward pass over the same tokens
toks = [int(x) for x in open(ids_path).readline().split(",")][:160]
assert int(r32["scored"]) == len(toks) - 1, r32["scored"]
m = ref.Model(path)
logits = m.forward(toks, m.new_cache(kv_f16=False))
lp = logits - logits.max(axis=1, keepdims=True)
lp = lp - np.log(np.exp(lp).sum(axis=1, keepdims=True))
nll = -float(np.mean([lp[i, toks[i + 1]] for i in range(len(toks) - 1)]))
print("  mean loss: kvd (f32 cache) %.4f, NumPy reference %.4f; f16 %.4f; window 32: %.4f (KL %.4f) nats" % (
    np.log(float(r32["ppl"])), nll, np.log(float(r16["ppl"])), np.log(float(win["ppl"])), float(win["kl_mean"])))
assert abs(np.log(float(r32["ppl"])) - nll) < 0.02, (np.log(float(r32["ppl"])), nll)
r = gguf.GGUFReader(path)
f = lambda k: int(r.fields[k].parts[-1][0])
L, H, D = f("llama.block_count"), f("llama.attention.head_count_kv"), f("llama.embedding_length") // f("llama.attention.head_count")
assert int(r16["kv_bytes_per_token"]) == 2 * L * H * D * 2 and int(r32["kv_bytes_per_token"]) == 2 * L * H * D * 4, r16
assert int(win["kv_bytes_peak"]) < int(r16["kv_bytes_peak"]) and float(win["kl_mean"]) > 0, win
assert float(win["kv_slots_mean"]) < float(r16["kv_slots_mean"]), win
assert {x["kv_type"] for x in pre} == {"f32", "f16"}, pre
for x in pre:
    assert int(x["hit_tokens"]) == int(x["prefix_tokens"]) > 0, x
    assert int(x["compared_rows"]) == int(x["request_tokens"]) - int(x["prefix_tokens"]) > 0, x
    assert x["bit_identical"] == "1" and x["identical_rows"] == x["compared_rows"] and float(x["max_abs_diff"]) == 0, x
page = open(os.path.join(out, "report.md")).read()
assert "## Prefix sharing" in page and "| f16 | 32 | 32 |" in page, page[:400]
if not plots:
    for png in ("quality_vs_kv_bytes.png", "pareto_read_bytes.png"):
        assert open(os.path.join(out, png), "rb").read(8) == b"\x89PNG\r\n\x1a\n", png
EOF
ok "quick evaluation report: documented columns, the f32 loss equals the NumPy reference's, a window holds less, shared-prefix logits bit-identical"
