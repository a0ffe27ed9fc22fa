#!/usr/bin/env bash
# tests/fuzz/t_fuzz.sh — every libFuzzer target briefly (FUZZ_TEST_SECONDS,
# default 1 s each), after replaying its committed corpus; part of
# `make test`. Skipped (exit 77) when clang with libFuzzer is not installed.
# `make fuzz` is the longer run.
# test-run: long
set -uo pipefail
cd "$(dirname "$0")/../.."
FUZZ_CC=${FUZZ_CC:-clang}
FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
command -v "$FUZZ_CC" >/dev/null || { echo "skipped: $FUZZ_CC not installed (apt-get install clang libclang-rt-14-dev)"; exit 77; }
probe=$(mktemp -d /tmp/kvd-fuzz-probe.XXXXXX)
trap 'rm -rf "$probe"' EXIT
printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }\n' >"$probe/p.c"
"$FUZZ_CC" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" >"$probe/log" 2>&1 ||
	{ echo "skipped: $FUZZ_CC cannot link libFuzzer with ASan/UBSan ($(head -c 200 "$probe/log"))"; exit 77; }
echo "building the fuzz targets in $FUZZ_BUILD"
make -s -j2 fuzz-build FUZZ_CC="$FUZZ_CC" FUZZ_BUILD="$FUZZ_BUILD" >"$probe/build" 2>&1 ||
	{ tail -30 "$probe/build"; echo "FAIL: make fuzz-build"; exit 1; }
FUZZ_BUILD=$FUZZ_BUILD tests/fuzz/run.sh "${FUZZ_TEST_SECONDS:-1}"
