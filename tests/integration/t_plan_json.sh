#!/usr/bin/env bash
# t_plan_json.sh — kvctl plan --json's figures are consistent for every
# cache type: kv_bytes_per_token = 2 x layers x kv_heads x head_dim x
# dtype_bytes, so a block type reports its bytes per element as the share
# of its block (q8_0 1.0625, q4_0 0.5625), not a rounded whole byte.
# No daemon is needed (the model's figures are given).
source "$(dirname "$0")/lib.sh"
[ -x "$KVCTL" ] || skip "$KVCTL not built"
for t in f16 bf16 f32 q8_0 q4_0; do
	"$KVCTL" plan --layers 30 --kv-heads 3 --head-dim 64 --cache-type "$t" --context 2048 --memory 256M --json \
		>"$T/$t.json" || fail "kvctl plan --cache-type $t --json"
	$PY - "$T/$t.json" "$t" <<'PYEOF' || fail "kvctl plan --cache-type $t --json: $(cat "$T/$t.json")"
import json, sys
p = json.load(open(sys.argv[1]))
want = {"f16": 2, "bf16": 2, "f32": 4, "q8_0": 34 / 32, "q4_0": 18 / 32}[sys.argv[2]]
assert p["cache_type"] == sys.argv[2], p["cache_type"]
assert abs(p["dtype_bytes"] - want) < 1e-9, ("dtype_bytes", p["dtype_bytes"], want)
per_token = 2 * p["layers"] * p["kv_heads"] * p["head_dim"] * p["dtype_bytes"]
assert abs(per_token - p["kv_bytes_per_token"]) < 1e-6, (per_token, p["kv_bytes_per_token"])
PYEOF
done
ok "kvctl plan --json: dtype_bytes x elements = kv_bytes_per_token for f16, bf16, f32, q8_0 and q4_0"
