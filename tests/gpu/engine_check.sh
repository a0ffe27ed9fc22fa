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
# and local windows with released pages, Llama 3.x rope_freqs and linear
# scaling, Mistral's sliding window), weight type (the K-quant mix,
# Q5_0/Q5_1), KV element type (f16, bf16, q8_0, q4_0; f32 is test_cuda's)
# and window context policy (sliding window and sinks through
# build/tests/kvd_stream: kv_shift) must be served on the plug-in, never
# "on the CPU". Used by t_cuda_emulated.sh (emulated plug-in) and run.sh
# (the real one).
#
# Exit 0 passed, 1 failed, 77 when kvd_eval, kvd_stream, the tiny models or
# NumPy are missing. NumPy comes from .venv (scripts/setup installs it there), else
# from /usr/bin/python3; $KVD_PYTHON names another interpreter.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${KVD_BUILD:-build}
export KVD_CUDA_PLUGIN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
TINY=$BUILD/tests/tiny-models
EVAL=$BUILD/tests/kvd_eval
STREAM=$BUILD/tests/kvd_stream
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
[ -x "$STREAM" ] || { echo "skipped: engine check needs $STREAM (make all)"; exit 77; }
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
# check_case MODEL MODES CACHE_TYPE TOL: MODEL greedy-decoded on the CPU and on
# the plug-in with a KV cache of CACHE_TYPE, in each of MODES ("0" whole
# prompt, "13" chunks of 13, "13+swap" chunks with every sequence swapped out
# and back in after every step: kvd_eval --swap-each-step, through the
# plug-in's device pool and batched page moves; the CPU reference does not
# swap, and the CPU with the same swapping must give the very same bytes);
# served on the plug-in ("backend cuda") with logits within TOL of the CPU's
# (tiny-gemma3 with pages released: its local layers' old pages packed)
check_case() {
	local m=$1 modes=$2 kv=$3 tol=$4 chunk swap args
	[ -f "$TINY/$m.gguf" ] || { echo "engine check: $TINY/$m.gguf missing (scripts/gen_tiny_models.py --arch)"; exit 1; }
	for chunk in $modes; do
		swap=()
		[ "${chunk%+swap}" != "$chunk" ] && swap=(--swap-each-step)
		args=(--model "$TINY/$m.gguf" --tokens "$toks" --n-predict 10 --shuffle-seed 7 --cache-type "$kv")
		[ "${chunk%+swap}" -gt 0 ] && args+=(--chunk "${chunk%+swap}")
		env -u KVD_CUDA_PLUGIN "$EVAL" "${args[@]}" --logits-out "$TMP/cpu.bin" > "$TMP/cpu.json" || exit 1
		"$EVAL" "${args[@]}" "${swap[@]}" --timing --logits-out "$TMP/cuda.bin" > "$TMP/cuda.json" 2> "$TMP/cuda.err" || {
			cat "$TMP/cuda.err"; exit 1; }
		if [ ${#swap[@]} -gt 0 ]; then
			env -u KVD_CUDA_PLUGIN "$EVAL" "${args[@]}" "${swap[@]}" --logits-out "$TMP/cpuswap.bin" > /dev/null || exit 1
			cmp -s "$TMP/cpu.bin" "$TMP/cpuswap.bin" || { echo "engine $m $kv: the CPU's logits change when swapping"; exit 1; }
		fi
		grep -q "backend cuda" "$TMP/cuda.err" || { echo "engine $m $kv: not served on the plug-in:"; cat "$TMP/cuda.err"; exit 1; }
		! grep -q "on the CPU" "$TMP/cuda.err" || { echo "engine $m $kv: a note of a CPU fallback:"; cat "$TMP/cuda.err"; exit 1; }
		# Gemma 3's local layers release the pages they are done with
		# (KVD_CAP_PACKED_KV), on the plug-in as on the CPU
		if [ "$m" = tiny-gemma3 ] && ! grep -q '"kv_pages_released":[1-9]' "$TMP/cuda.json"; then
			echo "engine $m $kv: no page released on the plug-in:"; cat "$TMP/cuda.json"; exit 1
		fi
		"$PY" - "$TMP/cpu.bin" "$TMP/cuda.bin" "$TMP/cpu.json" "$TMP/cuda.json" "$m $kv K/V chunk=$chunk" "$tol" <<'PYEOF' || exit 1
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
sys.exit(0 if err < float(sys.argv[6]) else 1)
PYEOF
	done
}
# the Llama shapes, the other architectures and the other weight types
# (scripts/gen_tiny_models.py --arch writes them all; a missing one is an
# error, not a skip): the Llama shapes take every mode, the others whole
# prompts and chunks with swapping (which covers chunking), to keep the
# check short
for m in tiny-gqa tiny-odd tiny-mqa tiny-qwen2 tiny-qwen3 tiny-gemma3 tiny-llama3 tiny-mistral tiny-kquant tiny-q5; do
	modes="0 13+swap"
	case $m in tiny-gqa|tiny-odd|tiny-mqa) modes="0 13+swap 13" ;; esac
	check_case "$m" "$modes" f16 0.12
done
# the other KV element types on the plug-in, one model each, against the
# CPU with the same type: q8_0 with head size 32 (34-byte heads) in chunks
# and swapped every step (its pages through the host tier and back), q4_0
# with 64 under Qwen 3's norms, bf16 under Gemma 3's windows (f32 is
# test_cuda's test_kvtype_f32 and t_matrix's)
check_case tiny-gqa "13+swap" q8_0 0.12
check_case tiny-qwen3 "0" q4_0 0.12
check_case tiny-gemma3 "0" bf16 0.12
# the window context policies re-rotate cached keys (kv_shift) on the
# plug-in: a stream of 64 teacher-forced tokens through a 16-token window
# (with 4 sinks, and without) drops pages and shifts the rest; the plug-in
# must serve it, drop what the CPU drops, and give the CPU's logits within
# the tolerance at positions after the drops
seq -s, 1 64 >"$TMP/toks"
for policy in sliding-window sinks; do
	sargs=(--model "$TINY/tiny-gqa.gguf" --tokens-file "$TMP/toks" --policy "$policy" --window 16 --sinks 4
		--block-size 16 --chunk 8 --logits-at 20,40,63)
	env -u KVD_CUDA_PLUGIN "$STREAM" "${sargs[@]}" --logits-out "$TMP/scpu.bin" >"$TMP/scpu.json" 2>"$TMP/s.err" || {
		echo "engine: $policy through kvd_stream failed on the CPU:"; cat "$TMP/s.err"; exit 1; }
	"$STREAM" "${sargs[@]}" --logits-out "$TMP/scuda.bin" >"$TMP/scuda.json" 2>"$TMP/s.err" || {
		echo "engine: $policy through kvd_stream failed on the plug-in:"; cat "$TMP/s.err"; exit 1; }
	grep -q "backend cuda" "$TMP/s.err" || { echo "engine: $policy not served on the plug-in:"; cat "$TMP/s.err"; exit 1; }
	"$PY" - "$TMP/scpu.bin" "$TMP/scuda.bin" "$TMP/scpu.json" "$TMP/scuda.json" "$policy" <<'PYEOF' || exit 1
import json
import sys
import numpy as np
a = np.fromfile(sys.argv[1], dtype=np.float32).reshape(3, -1)
b = np.fromfile(sys.argv[2], dtype=np.float32).reshape(3, -1)
ja, jb = json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
if ja["dropped_tokens"] <= 0 or ja["dropped_tokens"] != jb["dropped_tokens"]:
    sys.exit("engine %s: dropped tokens cpu %d, plug-in %d" % (sys.argv[5], ja["dropped_tokens"], jb["dropped_tokens"]))
err = max(float(np.linalg.norm(x - y) / np.linalg.norm(x)) for x, y in zip(a, b))
print("engine tiny-gqa %s (window 16): %d tokens dropped on both, worst logits error plug-in vs cpu %.4f"
      % (sys.argv[5], ja["dropped_tokens"], err))
sys.exit(0 if err < 0.12 else 1)
PYEOF
done
echo "engine check passed"
