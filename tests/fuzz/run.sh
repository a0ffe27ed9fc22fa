#!/usr/bin/env bash
# tests/fuzz/run.sh — run kvd's libFuzzer targets for a bounded time each and
# print one line per target: seconds, executions, coverage (libFuzzer's cov
# = edges, ft = features) and crashes. Fails when any target found a crash,
# a leak or a timeout (the input is kept in $FUZZ_BUILD/crashes/).
#
#   tests/fuzz/run.sh SECONDS [TARGET...]     (default: every built target)
#
# Seeds come from tests/fuzz/corpus/<target>/ (committed, read-only here, and
# replayed first: a committed crash input is a regression test); inputs the
# fuzzer finds go to $FUZZ_BUILD/corpus/<target>/ and are reused next time.
# Build the targets first: make fuzz-build (make fuzz does both).
set -uo pipefail
cd "$(dirname "$0")/../.."
FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
	for b in "$FUZZ_BUILD"/fuzz/fuzz_*; do [ -x "$b" ] && targets+=("$(basename "$b")"); done
fi
[ ${#targets[@]} -gt 0 ] || { echo "no fuzz targets in $FUZZ_BUILD/fuzz (make fuzz-build)"; exit 1; }

mkdir -p "$FUZZ_BUILD/crashes" "$FUZZ_BUILD/logs"
bad=0
printf '%-16s %7s %12s %7s %8s %8s\n' target seconds execs cov ft crashes
for t in "${targets[@]}"; do
	bin=$FUZZ_BUILD/fuzz/$t
	[ -x "$bin" ] || { echo "$t: $bin not built"; bad=1; continue; }
	mkdir -p "$FUZZ_BUILD/corpus/$t"
	seeds=tests/fuzz/corpus/$t
	[ -d "$seeds" ] || seeds=
	log=$FUZZ_BUILD/logs/$t.log
	# fuzz_server waits up to 5 s for the daemon to answer a fresh client
	# (its hang check); a slower input than -timeout is reported.
	t0=$(date +%s)
	ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1} \
	UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
	timeout -k 10 $((secs + 120)) "$bin" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2560 \
		-print_final_stats=1 -artifact_prefix="$FUZZ_BUILD/crashes/$t-" \
		"$FUZZ_BUILD/corpus/$t" $seeds >"$log" 2>&1
	rc=$?
	dt=$(( $(date +%s) - t0 ))
	execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
	last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1)
	cov=$(sed -nE 's/.*cov: ([0-9]+).*/\1/p' <<<"$last")
	ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
	crashes=0
	if [ $rc -ne 0 ]; then
		crashes=1
		bad=1
	fi
	printf '%-16s %7s %12s %7s %8s %8s\n' "$t" "$dt" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$crashes"
	if [ $rc -ne 0 ]; then
		echo "--- $t failed (exit $rc); log $log:"
		grep -E 'ERROR|SUMMARY|Test unit written|#[0-9]+ 0x.* in ' "$log" | head -30
	fi
done
exit $bad
