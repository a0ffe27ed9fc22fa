#!/usr/bin/env bash
# tests/gpu/engine_check.sh PLUGIN — kvd's engine end to end on a CUDA
# plug-in against the CPU backend: build/tests/kvd_eval greedy-decodes the
# tiny models (scripts/gen_tiny_models.py, in build/tests/tiny-models) with
# the "auto" backend loading PLUGIN (KVD_CUDA_PLUGIN), whole-prompt and
# chunked prefill, pages handed out in shuffled order, and every sequence
# swapped out and back in after every step; the logits rows must
# match the CPU backend's within the conformance tolerance for quantized
# models (0.12 relative L2). Every tiny architecture (Qwen 2 biases, Qwen 3
# and Gemma 3 per-head norms, Gemma 3's GeGLU, post-norms, embedding scale
# and local windows, Llama 3.x rope_freqs and linear scaling, Mistral's
# sliding window) and weight type (the K-quant mix, Q5_0/Q5_1) must be
# served on the plug-in, never "on the CPU"; a q8_0 KV cache (the plug-in
# serves f16 K/V only) must fall back to the CPU under "auto". Used by
# t_cuda_emulated.sh (emulated plug-in) and run.sh (the real one).
#
# Exit 0 passed, 1 failed, 77 when kvd_eval, the tiny models or NumPy are
# missing. NumPy comes from .venv (scripts/setup installs it there), else
# from /usr/bin/python3; $KVD_PYTHON names another interpreter.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${KVD_BUILD:-build}
export KVD_CUDA_PLUGIN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
TINY=$BUILD/tests/tiny-models
EVAL=$BUILD/tests/kvd_eval
PY=${KVD_PYTHON:-}
if [ -z "$PY" ]; then
	for c in .venv/bin/python /usr/bin/python3; do
		if [ -x "$c" ] && "$c" -c 'import numpy' 2>/dev/null; then PY=$c; break; fi
	done
fi
# the tiny models, written here when missing (or stale: only changed files
# are rewritten); .venv (scripts/setup) has the gguf package
GEN_PY=.venv/bin/python
[ -x "$GEN_PY" ] || GEN_PY=${PY:-/usr/bin/python3}
mkdir -p "$TINY" && "$GEN_PY" scripts/gen_tiny_models.py "$TINY" --arch > /dev/null 2>&1
[ -x "$EVAL" ] || { echo "skipped: engine check needs $EVAL (make all)"; exit 77; }
[ -f "$TINY/tiny-gqa.gguf" ] || { echo "skipped: engine check needs $TINY (scripts/gen_tiny_models.py with .venv)"; exit 77; }
if [ -z "$PY" ] || ! "$PY" -c 'import numpy' 2>/dev/null; then
	if [ -n "${KVD_PYTHON:-}" ]; then
		echo "skipped: engine check needs NumPy, which $KVD_PYTHON (\$KVD_PYTHON) does not have"
	else
		echo "skipped: engine check needs NumPy: neither .venv/bin/python (scripts/setup) nor /usr/bin/python3 has it"
	fi
	exit 77
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
toks=$(seq -s, 1 37)
# the Llama shapes, the other architectures and the other weight types
# (scripts/gen_tiny_models.py --arch writes them all; a missing one is an
# error, not a skip)
for m in tiny-gqa tiny-odd tiny-mqa tiny-qwen2 tiny-qwen3 tiny-gemma3 tiny-llama3 tiny-mistral tiny-kquant tiny-q5; do
	[ -f "$TINY/$m.gguf" ] || { echo "engine check: $TINY/$m.gguf missing (scripts/gen_tiny_models.py --arch)"; exit 1; }
	# "13+swap": every sequence swapped out and back in after every step
	# (kvd_eval --swap-each-step), through the plug-in's device pool and
	# batched page moves; the CPU reference does not swap, and the CPU
	# with the same swapping must give the very same bytes
	# the Llama shapes take every mode; the others whole prompts and
	# chunks with swapping (which covers chunking), to keep the check short
	modes="0 13+swap"
	case $m in tiny-gqa|tiny-odd|tiny-mqa) modes="0 13 13+swap" ;; esac
	for chunk in $modes; do
		swap=()
		[ "${chunk%+swap}" != "$chunk" ] && swap=(--swap-each-step)
		args=(--model "$TINY/$m.gguf" --tokens "$toks" --n-predict 10 --shuffle-seed 7)
		[ "${chunk%+swap}" -gt 0 ] && args+=(--chunk "${chunk%+swap}")
		env -u KVD_CUDA_PLUGIN "$EVAL" "${args[@]}" --logits-out "$TMP/cpu.bin" > "$TMP/cpu.json" || exit 1
		"$EVAL" "${args[@]}" "${swap[@]}" --timing --logits-out "$TMP/cuda.bin" > "$TMP/cuda.json" 2> "$TMP/cuda.err" || {
			cat "$TMP/cuda.err"; exit 1; }
		if [ ${#swap[@]} -gt 0 ]; then
			env -u KVD_CUDA_PLUGIN "$EVAL" "${args[@]}" "${swap[@]}" --logits-out "$TMP/cpuswap.bin" > /dev/null || exit 1
			cmp -s "$TMP/cpu.bin" "$TMP/cpuswap.bin" || { echo "engine $m: the CPU's logits change when swapping"; exit 1; }
		fi
		grep -q "backend cuda" "$TMP/cuda.err" || { echo "engine $m: not served on the plug-in:"; cat "$TMP/cuda.err"; exit 1; }
		"$PY" - "$TMP/cpu.bin" "$TMP/cuda.bin" "$TMP/cpu.json" "$TMP/cuda.json" "$m chunk=$chunk" <<'PYEOF' || exit 1
# Rows up to the first differing generated token were computed from the
# same tokens on both backends; after it the sequences legitimately part
# (a near-tie decided differently), so they are not compared.
import json
import sys
import numpy as np
a = np.fromfile(sys.argv[1], dtype=np.float32).reshape(10, -1)
b = np.fromfile(sys.argv[2], dtype=np.float32).reshape(10, -1)
ga = json.load(open(sys.argv[3]))["generated"]
gb = json.load(open(sys.argv[4]))["generated"]
n = next((i for i, (x, y) in enumerate(zip(ga, gb)) if x != y), len(ga) - 1) + 1
err = max(float(np.linalg.norm(x - y) / np.linalg.norm(x)) for x, y in zip(a[:n], b[:n]))
print("engine %s: %d steps compared, worst logits error plug-in vs cpu %.4f" % (sys.argv[5], n, err))
sys.exit(0 if err < 0.12 else 1)
PYEOF
	done
done
# a quantized KV cache: the plug-in answers no to a non-f16 KV type, and
# "auto" serves it on the CPU (same bytes as the CPU backend), saying why
m=tiny-gqa
if [ -f "$TINY/$m.gguf" ]; then
	args=(--model "$TINY/$m.gguf" --tokens "$toks" --n-predict 10 --cache-type q8_0)
	env -u KVD_CUDA_PLUGIN "$EVAL" "${args[@]}" --logits-out "$TMP/cpu.bin" > /dev/null || exit 1
	"$EVAL" "${args[@]}" --timing --logits-out "$TMP/auto.bin" > /dev/null 2> "$TMP/auto.err" || {
		cat "$TMP/auto.err"; exit 1; }
	if ! grep -q "backend cpu" "$TMP/auto.err" || ! grep -q "KV cache type q8_0 is not implemented on the GPU" "$TMP/auto.err"; then
		echo "engine $m q8_0: expected the CPU with a note on the GPU's KV types:"; cat "$TMP/auto.err"; exit 1
	fi
	cmp -s "$TMP/cpu.bin" "$TMP/auto.bin" || { echo "engine $m q8_0: CPU fallback logits differ from the CPU backend's"; exit 1; }
	echo "engine $m: the plug-in refused a q8_0 KV cache; auto served on the CPU, logits identical"
	# asked for explicitly, the GPU's refusal is the error
	if "$EVAL" "${args[@]}" --backend cuda > /dev/null 2> "$TMP/cuda.err"; then
		echo "engine $m q8_0: --backend cuda served a KV type the plug-in does not implement"; exit 1
	fi
	grep -q "KV cache type q8_0 is not implemented on the GPU" "$TMP/cuda.err" || {
		echo "engine $m q8_0, --backend cuda: unclear error:"; cat "$TMP/cuda.err"; exit 1; }
	echo "engine $m: with backend cuda, a q8_0 KV cache is refused: $(cat "$TMP/cuda.err")"
fi
# the window context policies need kv_shift, which the plug-in does not
# implement: the engine refuses them (kvd then answers such a request with
# an error naming the backend), while full attention still runs
STREAM=$BUILD/tests/kvd_stream
if [ -x "$STREAM" ]; then
	echo "$toks" >"$TMP/toks"
	"$STREAM" --model "$TINY/tiny-gqa.gguf" --tokens-file "$TMP/toks" --policy none >/dev/null 2>"$TMP/w.err" || {
		echo "engine: full attention through kvd_stream failed on the plug-in:"; cat "$TMP/w.err"; exit 1; }
	if "$STREAM" --model "$TINY/tiny-gqa.gguf" --tokens-file "$TMP/toks" --policy sinks --window 16 \
		>/dev/null 2>"$TMP/w.err" || ! grep -q "kv_shift" "$TMP/w.err"; then
		echo "engine: a sinks window on the plug-in was not refused:"; cat "$TMP/w.err"; exit 1
	fi
	echo "engine: the plug-in refuses the window context policies (no kv_shift)"
fi
echo "engine check passed"
