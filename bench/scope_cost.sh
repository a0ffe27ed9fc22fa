#!/usr/bin/env bash
# bench/scope_cost.sh — what owner-scoped prefix caching costs: N users
# (uids 65534, 65533, ...) each send the same long system prompt with Q
# questions, under [kv] prefix_sharing = user and then = all, on the same
# daemon binary and model. Prints per mode the pages the cache holds, the
# hit ratio, and the mean TTFT, and the user/all ratios.
#   bench/scope_cost.sh [USERS [QUESTIONS]]     (run as root; default 4 users, 3 questions)
set -euo pipefail
cd "$(dirname "$0")/.."
USERS=${1:-4}; Q=${2:-3}
KVD=build/bin/kvd; KVCTL=build/bin/kvctl; RAW=build/tests/kvd_raw
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
T=$(mktemp -d); chmod 755 "$T"; trap 'rm -rf "$T"' EXIT
S=$T/kvd.sock
SYS=$(printf 'You are a careful assistant for the support desk of a software company. %.0s' $(seq 20))
for mode in user all; do
	printf '[server]\nsocket_mode = 0666\n[kv]\nprefix_sharing = %s\n' "$mode" >"$T/kvd.conf"
	"$KVD" --config "$T/kvd.conf" --socket "$S" --model "$MODEL" --pool-size 256M 2>"$T/kvd.log" &
	P=$!
	for i in $(seq 100); do "$RAW" -s "$S" hello >/dev/null 2>&1 && break; sleep 0.1; done
	: >"$T/res"
	for q in $(seq "$Q"); do
		for u in $(seq 0 $((USERS - 1))); do
			setpriv --reuid=$((65534 - u)) --regid=$((65534 - u)) --clear-groups \
				"$KVCTL" --socket "$S" generate --system "$SYS" --max-tokens 1 --temperature 0 --json \
				"Question $q from user $u: how do I reset my password?" >>"$T/res"
			echo >>"$T/res"
		done
	done
	"$RAW" -s "$S" stats >"$T/stats"
	kill "$P"; wait "$P" || true
	python3 - "$mode" "$T/res" "$T/stats" <<'PY' | tee -a "$T/summary"
import json, sys
mode, res, stats = sys.argv[1:]
rs = [json.loads(l) for l in open(res) if l.strip()]
st = json.load(open(stats))
p = sum(r["prompt_tokens"] for r in rs); c = sum(r["cached_tokens"] for r in rs)
ttft = sum(r["ttft_ms"] for r in rs) / len(rs)
print(f"{mode} pages_cached={st['pages_cached']} hit_ratio={c / p:.3f} ttft_ms={ttft:.1f} requests={len(rs)} prompt_tokens={p} cached_tokens={c}")
PY
done
python3 - "$T/summary" <<'PY'
import sys
d = {}
for l in open(sys.argv[1]):
    f = l.split(); d[f[0]] = {k: float(v) for k, v in (x.split("=") for x in f[1:])}
u, a = d["user"], d["all"]
print(f"user/all: pages held {u['pages_cached'] / a['pages_cached']:.2f}x, hit ratio {u['hit_ratio']:.3f} vs {a['hit_ratio']:.3f}, mean TTFT {u['ttft_ms'] / a['ttft_ms']:.2f}x")
PY
