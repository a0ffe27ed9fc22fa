#!/usr/bin/env bash
# tests/gpu/run.sh — every GPU test and GPU benchmark of kvd in one go, for
# a machine with an NVIDIA GPU (under 8 minutes on an H200):
#
#   tests/gpu/run.sh OUTDIR
#
#  1. builds the CUDA plug-in, the conformance test and the GPU benchmark
#     (make; binaries already in build/ are used where make cannot run,
#     e.g. a machine without the build dependencies);
#  2. build/tests/test_cuda with KVD_REQUIRE_GPU=1: the plug-in's ABI, every
#     kernel against the CPU backend and a float64 reference on tiny random
#     models, page copy / swap moves, and greedy decoding of the default
#     model against the CPU backend where models/ has it; then the
#     conformance checks again with the dequantizing GEMV path; the KV
#     element types (f32, bf16, q8_0, q4_0: test_kvtype_*) and kv_shift
#     (byte for byte the CPU's) run in the first pass; then the engine end
#     to end (tests/gpu/engine_check.sh: build/tests/kvd_eval on the tiny
#     models with every KV type, and build/tests/kvd_stream through the
#     sliding-window and sinks policies, CUDA against CPU), where kvd_eval,
#     kvd_stream and the tiny models are here;
#  3. build/bench/gpu_bench on the default model (or, where the file is not
#     here, a random-weight model of its shape: SmolLM2-135M, Q4_1) with the
#     CPU backend as the same-run peer, then on a random-weight 8B Llama
#     shape (32 layers, 4096 wide, 8 KV heads, n_ff 14336, Q4_0): decode
#     tokens/s at batch 1, 8, 32, 128, HBM bandwidth against peak, prefill
#     tokens/s, swap bandwidth device -> host -> file; then batch 1 and 8
#     again with decode projections through the dequantizing GEMV
#     (KVD_CUDA_GEMV_MAX_TOKENS=8), to choose the faster default; and the
#     8B shape as Q4_K_M (K-quant blocks read in place by the GEMV at batch
#     1 and 8, cuBLAS on fp16 copies at 1 and 32).
#
# OUTDIR gets run.log (everything), test_cuda.log, bench-*.json (one JSON
# object per figure), bench-*.txt (the readable lines), nvidia-smi.txt and
# summary.txt (prebuilt/ holds copies of the binaries found before the
# build). Exit status: 0 all passed, 1 a test or benchmark failed,
# 77 no GPU here (nothing run).
#
# Shared libraries a prebuilt test needs and the machine lacks (libcmocka)
# may be put in build/gpu-libs/; they are added to LD_LIBRARY_PATH.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/run.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/run.log") 2>&1

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
	echo "skipped: no GPU (nvidia-smi finds none)"
	exit 77
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
nvidia-smi -L
[ -d build/gpu-libs ] && export LD_LIBRARY_PATH="$PWD/build/gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

t_start=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t_start ))s] $*"; }
status=0
summary=()

stamp "build"
ARTIFACTS="build/lib/libkvd-cuda.so build/tests/test_cuda build/bench/gpu_bench"
# keep prebuilt binaries (carried to a machine that may lack the build
# dependencies): a failed relink must not leave us with none
mkdir -p "$OUT/prebuilt"
for f in $ARTIFACTS; do [ -e "$f" ] && cp -p "$f" "$OUT/prebuilt/"; done
if ! timeout -k 5 300 make -k -j"$(nproc)" $ARTIFACTS build/tests/kvd_eval build/tests/kvd_stream; then
	echo "make failed; using the binaries already in build/ where present"
fi
for f in $ARTIFACTS; do
	if [ ! -e "$f" ] && [ -e "$OUT/prebuilt/$(basename "$f")" ]; then
		echo "restoring prebuilt $f"
		mkdir -p "$(dirname "$f")" && cp -p "$OUT/prebuilt/$(basename "$f")" "$f"
	fi
	if [ ! -e "$f" ]; then
		echo "missing $f"
		summary+=("FAIL build: $f missing")
		status=1
	fi
done
export KVD_CUDA_PLUGIN=$PWD/build/lib/libkvd-cuda.so

run_test() { # name env...
	local name=$1; shift
	stamp "$name"
	env KVD_REQUIRE_GPU=1 "$@" timeout -k 5 180 build/tests/test_cuda > "$OUT/$name.log" 2>&1
	local rc=$?
	cat "$OUT/$name.log"
	if [ $rc -eq 0 ]; then
		summary+=("PASS $name ($(grep -c '^\[       OK \]' "$OUT/$name.log") ok, $(grep -c '^\[  SKIPPED \] test_' "$OUT/$name.log") skipped)")
	else
		summary+=("FAIL $name (exit $rc)")
		status=1
	fi
}
if [ -x build/tests/test_cuda ]; then
	run_test test_cuda
	# the same conformance checks with decode projections through the
	# dequantizing GEMV (KVD_CUDA_GEMV_MAX_TOKENS)
	run_test test_cuda_gemv KVD_CUDA_GEMV_MAX_TOKENS=8 KVD_TEST_FILTER='test_conformance_*'
fi

if [ -x build/tests/kvd_eval ]; then
	stamp "engine_check"
	tests/gpu/engine_check.sh build/lib/libkvd-cuda.so > "$OUT/engine_check.log" 2>&1
	rc=$?
	cat "$OUT/engine_check.log"
	case $rc in
	0) summary+=("PASS engine_check") ;;
	77) summary+=("SKIP engine_check ($(tail -1 "$OUT/engine_check.log"))") ;;
	*) summary+=("FAIL engine_check (exit $rc)"); status=1 ;;
	esac
fi

run_bench() { # name timeout args... (GEMV=N in the environment: KVD_CUDA_GEMV_MAX_TOKENS)
	local name=$1 to=$2; shift 2
	stamp "gpu_bench $name: $*"
	KVD_CUDA_GEMV_MAX_TOKENS=${GEMV:-0} timeout -k 5 "$to" build/bench/gpu_bench "$@" --swap-file "$OUT/swap-$name.tmp" \
		> "$OUT/bench-$name.json" 2> "$OUT/bench-$name.txt"
	local rc=$?
	rm -f "$OUT/swap-$name.tmp"
	cat "$OUT/bench-$name.txt"
	if [ $rc -eq 0 ]; then
		summary+=("PASS gpu_bench $name")
	else
		summary+=("FAIL gpu_bench $name (exit $rc)")
		status=1
	fi
}

if [ -x build/bench/gpu_bench ]; then
	model=models/SmolLM2-135M-Instruct.Q4_1.gguf
	if [ -r "$model" ]; then
		run_bench default 150 --model "$model" --batches 1,8,32,128 --prompt 128 --steps 32 \
			--prefill 2048 --swap-mib 256 --cpu-peer
	else
		echo "default model not here: using a random-weight model of its shape"
		run_bench default 150 --shape smollm2-135m --wtype q4_1 --batches 1,8,32,128 --prompt 128 \
			--steps 32 --prefill 2048 --swap-mib 256 --cpu-peer
	fi
	run_bench llama8b 200 --shape llama-8b --wtype q4_0 --batches 1,8,32,128 --prompt 128 --steps 32 \
		--prefill 2048 --swap-mib 512
	# the format most GGUF files ship in: an 8B-shaped Q4_K_M model (Q4_K,
	# Q6_K for V, FFN down and the embedding), batch-1 decode through the
	# GEMV that reads the K-quant blocks in place against the HBM peak,
	# and through cuBLAS on the fp16 copies
	GEMV=8 run_bench llama8b-q4km-gemv 120 --shape llama-8b --wtype q4_k_m --batches 1,8 --prompt 128 --steps 32 \
		--prefill 512 --swap-mib 64
	run_bench llama8b-q4km 120 --shape llama-8b --wtype q4_k_m --batches 1,32 --prompt 128 --steps 32 \
		--prefill 2048 --swap-mib 64
	# decode projections through the dequantizing GEMV instead of cuBLAS
	# (batch <= 8): the figures to choose the default by
	GEMV=8 run_bench llama8b-gemv 120 --shape llama-8b --wtype q4_0 --batches 1,8 --prompt 128 --steps 32 \
		--prefill 512 --swap-mib 64
	if [ -r "$model" ]; then
		GEMV=8 run_bench default-gemv 90 --model "$model" --batches 1,8 --prompt 128 --steps 32 \
			--prefill 512 --swap-mib 64
	else
		GEMV=8 run_bench default-gemv 90 --shape smollm2-135m --wtype q4_1 --batches 1,8 --prompt 128 \
			--steps 32 --prefill 512 --swap-mib 64
	fi
fi

stamp "done"
{
	echo "kvd GPU run, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nvidia-smi -L | head -1)"
	for s in "${summary[@]}"; do echo "  $s"; done
	echo
	grep -h '"figure"' "$OUT"/bench-*.json 2>/dev/null
} > "$OUT/summary.txt"
cat "$OUT/summary.txt"
exit $status
