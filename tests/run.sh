#!/usr/bin/env bash
# tests/run.sh — run kvd's test suite: every cmocka unit test binary
# (build/tests/test_*), then every scripted test (tests/*/t_*.sh), each
# under a timeout. Exit status 77 from a script means "skipped" and is
# reported as such, never as passed. Prints a summary and fails if any
# test failed.
#
#   tests/run.sh               everything
#   tests/run.sh --unit-only   cmocka binaries only (used by make asan)
#   tests/run.sh PATTERN       only tests whose name contains PATTERN
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export KVD_BUILD=$BUILD
UNIT_TIMEOUT=${UNIT_TIMEOUT:-300}
SCRIPT_TIMEOUT=${SCRIPT_TIMEOUT:-600}
unit_only=0; pattern=
for a in "$@"; do
	case "$a" in
	--unit-only) unit_only=1 ;;
	*) pattern=$a ;;
	esac
done

pass=(); fail=(); skip=(); partial=()
run_one() { # name timeout cmd...
	local name=$1 to=$2; shift 2
	[ -n "$pattern" ] && [[ "$name" != *"$pattern"* ]] && return
	echo "=== $name"
	local t0=$(date +%s%N) out
	out=$(mktemp)
	timeout -k 10 "$to" "$@" 2>&1 | tee "$out"
	local rc=${PIPESTATUS[0]}
	# cmocka reports skipped cases inside a passing binary: say so
	local inner
	inner=$(grep -oE '^ *[0-9]+ SKIPPED TEST\(S\)' "$out" | grep -oE '[0-9]+' | head -1)
	rm -f "$out"
	if [ $rc = 0 ] && [ -n "$inner" ]; then
		partial+=("$name: $inner case(s) skipped")
	fi
	local ms=$(( ($(date +%s%N) - t0) / 1000000 )); local dt="$((ms / 1000)).$(( (ms % 1000) / 100 ))"
	case $rc in
	0) pass+=("$name"); echo "=== $name: PASS (${dt}s)" ;;
	77) skip+=("$name"); echo "=== $name: SKIPPED (${dt}s)" ;;
	124|137) fail+=("$name"); echo "=== $name: FAIL (timeout after ${to}s)" ;;
	*) fail+=("$name"); echo "=== $name: FAIL (exit $rc, ${dt}s)" ;;
	esac
}

for t in "$BUILD"/tests/test_*; do
	[ -x "$t" ] || continue
	run_one "unit/$(basename "$t")" "$UNIT_TIMEOUT" "$t"
done
if [ $unit_only = 0 ]; then
	for t in tests/*/t_*.sh; do
		[ -x "$t" ] || continue
		run_one "${t#tests/}" "$SCRIPT_TIMEOUT" "$t"
	done
fi

echo
echo "tests: ${#pass[@]} passed, ${#skip[@]} skipped, ${#fail[@]} failed"
for s in "${skip[@]}"; do echo "  skipped: $s"; done
for s in "${partial[@]}"; do echo "  passed with cases skipped: $s"; done
for f in "${fail[@]}"; do echo "  FAILED: $f"; done
[ ${#fail[@]} -eq 0 ]
