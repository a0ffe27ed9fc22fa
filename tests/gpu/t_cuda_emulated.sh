#!/usr/bin/env bash
# tests/gpu/t_cuda_emulated.sh — the CUDA plug-in's conformance test on any
# machine: kernels/cuda/*.cu are rewritten to plain C++ (tests/gpu/emu/
# rewrite.py), built with g++ against a CPU emulation of the CUDA runtime,
# cuda_fp16 and cuBLAS (tests/gpu/emu/), and build/tests/test_cuda runs its
# GPU tests against that build (KVD_CUDA_EMULATED=1). This checks the
# plug-in's indexing, paging, attention tiling and GEMM arguments against
# the CPU backend; it says nothing about speed, races or the GPU memory
# model — tests/gpu/run.sh on a real GPU does.
#
# Exit 77 (skipped) without g++, python3 or the test binary, and when the
# engine check (tests/gpu/engine_check.sh) cannot run, e.g. without NumPy in
# .venv: the kernel conformance part then passed, but the test as a whole
# did not run, and the summary of tests/run.sh says why.
# test-run: long
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${KVD_BUILD:-build}
T=$BUILD/tests/test_cuda
command -v g++ >/dev/null 2>&1 || { echo "skipped: no g++"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "skipped: no python3"; exit 77; }
[ -x "$T" ] || { echo "skipped: $T not built"; exit 77; }
EMU=$BUILD/gpu-emu
tests/gpu/emu/build.sh "$EMU" || exit $?
# the default model's greedy test would take minutes on the emulated GEMM:
# KVD_TEST_MODEL=none turns it off (test_cuda says so as its skip reason)
export KVD_TEST_MODEL=none KVD_CUDA_EMULATED=1 KVD_CUDA_PLUGIN="$EMU/libkvd-cuda.so"
"$T" || exit 1
# The GEMV path differs from the GEMM path only in how each weight type's
# blocks are read: one conformance shape per weight type covers it here
# (q4_1, f32, bf16, q8_0, q4_0, q5_0, q5_1, q4_K, q5_K, q6_K; the shape
# table is in tests/unit/test_cuda.c); tests/gpu/run.sh on a real GPU runs
# every shape through it.
echo "=== again, projections of small steps through the dequantizing GEMV (one shape per weight type)"
for name in gqa-q4_1 type-f32 type-bf16 type-q8_0 type-q4_0 type-q5_0 type-q5_1 type-q4_K type-q5_K type-q6_K; do
	i=$(KVD_TEST_LIST_SHAPES=1 "$T" | awk -v n="$name" '$2 == n { print $1 }')
	[ -n "$i" ] || { echo "FAIL: conformance shape $name is not in test_cuda's table"; exit 1; }
	KVD_CUDA_GEMV_MAX_TOKENS=8 KVD_TEST_FILTER="test_conformance_$i" "$T" || exit 1
done
# the engine end to end on the emulated plug-in; a skip of it is this
# test's skip, with its reason, never a pass
tests/gpu/engine_check.sh "$EMU/libkvd-cuda.so" | tee "$EMU/engine_check.log"
rc=${PIPESTATUS[0]}
if [ $rc -eq 77 ]; then
	echo "skipped: the kernel conformance tests passed, but the engine check did not run:" \
		"$(grep -E '^skipped: ' "$EMU/engine_check.log" | tail -n 1 | sed 's/^skipped: //')"
	exit 77
fi
exit $rc
