#!/usr/bin/env bash
# tests/reference/t_window.sh — the sliding-window and attention-sink
# context policies against a streaming NumPy reference
# (tests/reference/window_ref.py): streams of 3x a tiny model's context,
# logits after eviction and key re-rotation, which tokens survive, pages in
# use flat from 1x to 3x the context.
#
# Needs build/tests/kvd_stream and the Python venv of scripts/setup; a
# missing one is a failure, not a skip: `make test` provides both.
# test-run: long
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${KVD_BUILD:-build}
PY=${KVD_PYTHON:-.venv/bin/python}
if [ ! -x "$PY" ]; then
	echo "FAIL: $PY missing (run scripts/setup)"
	exit 1
fi
exec nice "$PY" tests/reference/window_ref.py --build "$BUILD" "$@"
