#!/usr/bin/env bash
# t_kv_quality.sh — the quality of each KV element type, measured: a short
# run of tests/tools/kvd_perplexity (the engine itself, every type; 512
# tokens of tests/data/text/lighthouse.txt in two windows of 256, the
# second half of each scored; about 10 s) against the f32 cache:
#
#   - the mean KL divergence of the next-token distributions from f32's is
#     at most 0.02 nats for f16, q8_0 and bf16 (measured 0.0032, 0.0038 and
#     0.0033: the noise floor of this model's int8 activations; bf16 with its
#     bfloat16 attention products where the CPU has them), at most 0.5 for q4_0
#     (measured 0.13), and q4_0's is at least 5 times q8_0's (a coarser
#     cache must cost something: a q4_0 path that kept more precision fails);
#   - perplexities of f16, q8_0 and bf16 within 3% of f32's, and f32's below 60
#     (measured 33.9: the model reads the text);
#   - bytes per token as the block formats give them.
source "$(dirname "$0")/lib.sh"
[ -f "$REAL_MODEL" ] || skip "the default model is missing (scripts/setup)"
PPL=$ROOT/$BUILD/tests/kvd_perplexity
[ -x "$PPL" ] || skip "$PPL not built"
GPY=$ROOT/.venv/bin/python
"$GPY" -c 'import gguf' 2>/dev/null || skip "the gguf package (.venv, scripts/setup) is missing"

# the model's KV shape, from the file (not from kvd)
read -r L H D < <("$GPY" - "$REAL_MODEL" <<'EOF'
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
f = lambda k: int(r.fields[k].parts[-1][0])
print(f("llama.block_count"), f("llama.attention.head_count_kv"),
      f("llama.embedding_length") // f("llama.attention.head_count"))
EOF
)
[ -n "${D:-}" ] || fail "cannot read the model's shape from $REAL_MODEL"

# ---- quality against f32 ------------------------------------------------------------------
t0=$(date +%s%N)
nice "$PPL" --model "$REAL_MODEL" --text tests/data/text/lighthouse.txt --ctx 256 --max-tokens 512 \
	--types f16,q8_0,q4_0,bf16 --json >"$T/ppl.json" 2>"$T/ppl.err" || fail "kvd_perplexity: $(cat "$T/ppl.err")"
"$PY" - "$T/ppl.json" "$L" "$H" "$D" <<'EOF' || fail "quality bounds (above)"
import json, sys
r = {j["type"]: j for j in map(json.loads, open(sys.argv[1]))}
L, H, D = map(int, sys.argv[2:5])
per32 = {"f32": 128, "f16": 64, "q8_0": 34, "q4_0": 18, "bf16": 64}
for t, j in r.items():
    print("  %-5s %6d B/token  ppl %8.4f  KL mean %.5f max %.4f  top-1 same as f32 %.3f"
          % (t, j["bytes_per_token"], j["ppl"], j["kl_mean"], j["kl_max"], j["top1"]))
    assert j["bytes_per_token"] == 2 * L * H * D * per32[t] // 32, t
    assert j["scored"] == 256, j["scored"]
f32 = r["f32"]["ppl"]
assert f32 < 60, "f32 perplexity %.2f: the model does not read the text" % f32
for t in ("f16", "q8_0", "bf16"):
    assert r[t]["kl_mean"] <= 0.02, "%s mean KL %.4f > 0.02" % (t, r[t]["kl_mean"])
    assert abs(r[t]["ppl"] / f32 - 1) <= 0.03, "%s perplexity %.3f vs f32 %.3f" % (t, r[t]["ppl"], f32)
assert r["q4_0"]["kl_mean"] <= 0.5, "q4_0 mean KL %.4f > 0.5" % r["q4_0"]["kl_mean"]
assert r["q4_0"]["kl_mean"] >= 5 * r["q8_0"]["kl_mean"], "q4_0 is not measurably coarser than q8_0"
EOF
echo "  kvd_perplexity took $(( ($(date +%s%N) - t0) / 1000000 )) ms"
ok "quality: f16, q8_0 and bf16 within 0.02 nats of f32, q4_0 within 0.5 and coarser than q8_0"
