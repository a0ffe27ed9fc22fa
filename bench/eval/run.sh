#!/usr/bin/env bash
# bench/eval/run.sh — the recorded evaluation reports: bench/eval/report.py on
# SmolLM2-135M (the default model) and Gemma 3 270M, into docs/eval/<model>/
# (report.md, CSV, PNG). Needs `make`, `scripts/setup --bench` (matplotlib)
# and `scripts/setup --model gemma3-270m`. Runs `nice`d; on two busy cores
# about 15 minutes for SmolLM2 and longer for Gemma 3 (its vocabulary of
# 262k makes every scored position's comparison 5x dearer).
#
#   bench/eval/run.sh [smollm2|gemma3]...     (default: both)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
"$PY" -c 'import matplotlib' 2>/dev/null || { echo "run.sh: matplotlib missing: scripts/setup --bench" >&2; exit 1; }
[ -x build/tests/kvd_policy_eval ] || { echo "run.sh: build/tests/kvd_policy_eval missing: make" >&2; exit 1; }
for m in "${@:-smollm2 gemma3}"; do
	for one in $m; do
		case "$one" in
		smollm2) "$PY" bench/eval/report.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
			--label SmolLM2-135M-Instruct-Q4_1 --out docs/eval/smollm2-135m --tokens 1024 ;;
		gemma3) [ -f models/gemma-3-270m-q4_k_m.gguf ] ||
				{ echo "run.sh: models/gemma-3-270m-q4_k_m.gguf missing: scripts/setup --model gemma3-270m" >&2; exit 1; }
			"$PY" bench/eval/report.py --model models/gemma-3-270m-q4_k_m.gguf \
			--label gemma-3-270m-Q4_K_M --out docs/eval/gemma3-270m --tokens 768 ;;
		*) echo "usage: bench/eval/run.sh [smollm2|gemma3]..." >&2; exit 2 ;;
		esac
	done
done
