#!/usr/bin/env bash
# tests/gpu/emu/build.sh OUTDIR — the emulated CUDA plug-in,
# OUTDIR/libkvd-cuda.so: kernels/cuda/*.cu rewritten to plain C++
# (rewrite.py) and built with g++ against the CPU emulation of the CUDA
# runtime, cuda_fp16 and cuBLAS in this folder. Rebuilt only when a source
# is newer than the library. Exit 0 built (or up to date), 1 failed, 77
# without g++ or python3.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:?usage: build.sh OUTDIR}
command -v g++ >/dev/null 2>&1 || { echo "skipped: no g++"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "skipped: no python3"; exit 77; }
LIB=$OUT/libkvd-cuda.so
if [ -f "$LIB" ] && [ -z "$(find kernels/cuda kernels/backend.h kernels/program.h kernels/program.c tests/gpu/emu -newer "$LIB" -type f 2>/dev/null | head -1)" ]; then
	exit 0
fi
mkdir -p "$OUT/src" || exit 1
for f in kernels/cuda/*.cu; do
	python3 tests/gpu/emu/rewrite.py "$f" "$OUT/src/$(basename "$f" .cu).cc" || exit 1
done
# the forward program's builder is C, linked in as the real plug-in links it
gcc -std=c11 -D_GNU_SOURCE -O2 -g -fPIC -Wall -Wextra -Werror -Ikernels -c kernels/program.c \
	-o "$OUT/program.o" || exit 1
# built beside and renamed, so a reader never loads half a library
g++ -std=c++17 -O2 -g -fPIC -shared -Wall -Werror -Itests/gpu/emu/include -I. -Ikernels -Ikernels/cuda \
	"$OUT"/src/*.cc "$OUT/program.o" tests/gpu/emu/emu.cc -o "$LIB.tmp.$$" || { rm -f "$LIB.tmp.$$"; exit 1; }
mv -f "$LIB.tmp.$$" "$LIB"
