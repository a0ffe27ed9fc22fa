#!/usr/bin/env bash
# tests/reference/t_reference.sh — kvd's engine against the NumPy reference
# model (tests/reference/ref.py) on tiny generated models and on
# SmolLM2-135M-Instruct, plus bit-exact invariance of the logits under page
# size, page placement, prompt chunking, thread count and batching.
# Details, tolerances and their justification: tests/reference/check.py.
#
# Needs the engine driver (build/tests/kvd_eval), the Python venv made by
# scripts/setup (.venv, with numpy and gguf) and models/. A missing build
# output, venv or model is a failure, not a skip: `make test` provides all.
# Extra arguments go to check.py (e.g. --part tiny,inv-tiny).
# test-run: long
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${KVD_BUILD:-build}
PY=${KVD_PYTHON:-.venv/bin/python}
if [ ! -x "$PY" ]; then
	echo "FAIL: $PY missing (run scripts/setup)"
	exit 1
fi
if [ ! -x "$BUILD/tests/kvd_eval" ]; then
	echo "FAIL: $BUILD/tests/kvd_eval missing (run make)"
	exit 1
fi
KVD_BUILD=$BUILD exec "$PY" tests/reference/check.py "$@"
