#!/usr/bin/env bash
# tests/run.sh — run kvd's test suite: every cmocka unit test binary
# (build/tests/test_*), then every scripted test (tests/*/t_*.sh), each
# under a timeout. Exit status 77 from a script means "skipped" and is
# reported as such, never as passed. Prints a summary and fails if any
# test failed.
#
# Every skip is counted in the summary with its reason: a script's (exit 77)
# is its last line starting "skipped:" or "SKIP:" (else its last line); a
# cmocka case's is the "skipped: ..." line it printed between its [ RUN ] and
# [  SKIPPED ] lines (also inside scripts that run cmocka binaries); a line
# "skipped: ..." that a passing script prints outside any case is a part of
# it that did not run. A skip without a reason is listed as such.
#
#   tests/run.sh               everything
#   tests/run.sh --unit-only   cmocka binaries only (used by make asan)
#   tests/run.sh PATTERN       only tests whose name contains PATTERN
#
# Scripts run TEST_JOBS at a time (default 2), each one's output shown whole
# when it ends; a script whose first 30 lines hold "# test-run: alone" runs
# with nothing beside it (fairness, latency and timing-oracle tests, tests
# with a real systemd). Those marked "# test-run: long" start first, so the
# longest ones do not end the run alone. TEST_JOBS=1 runs everything in
# order, streaming. Unit binaries run one at a time.
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
n_cases_skipped=0

# skipped_cases FILE: one line per skipped cmocka case, "reason<TAB>case",
# and "reason<TAB>" for each "skipped:" line printed outside any case
SKIP_RE='^(<[0-9]>)?(skipped|SKIP|SKIPPED):[[:space:]]*'
skipped_cases() {
	awk -v re="$SKIP_RE" '
	/^\[ RUN      \] / { cur = $4; reason = ""; next }
	$0 ~ re { r = $0; sub(re, "", r); if (cur != "") reason = r; else print r "\t"; next }
	/^\[  SKIPPED \] / && cur != "" && $4 == cur {
		print (reason == "" ? "no reason printed" : reason) "\t" cur; cur = ""; next }
	/^\[ *(OK|FAILED|ERROR) *\] / { cur = "" }' "$1"
}

# skip_reason FILE: why a script exited 77
skip_reason() {
	local r
	r=$(grep -E "$SKIP_RE" "$1" | tail -n 1 | sed -E "s/$SKIP_RE//")
	[ -n "$r" ] || r=$(grep -v '^[[:space:]]*$' "$1" | tail -n 1)
	echo "${r:-no reason printed}"
}

# account NAME TIMEOUT OUTFILE RC MS: records and prints one test's result
account() {
	local name=$1 to=$2 out=$3 rc=$4 ms=$5
	local dt="$((ms / 1000)).$(( (ms % 1000) / 100 ))"
	case $rc in
	0) pass+=("$name"); echo "=== $name: PASS (${dt}s)" ;;
	77) skip+=("$name: $(skip_reason "$out")"); echo "=== $name: SKIPPED (${dt}s)" ;;
	124|137) fail+=("$name"); echo "=== $name: FAIL (timeout after ${to}s)" ;;
	*) fail+=("$name"); echo "=== $name: FAIL (exit $rc, ${dt}s)" ;;
	esac
	# skipped cases and parts of a test that ran, grouped by reason
	if [ $rc = 0 ] || [ $rc = 77 ]; then
		local line n only_cases=
		[ $rc = 77 ] && only_cases=1 # the script's own skip line is its reason, above
		while IFS= read -r line; do
			[ -n "$line" ] && partial+=("$name: $line")
		done < <(skipped_cases "$out" | awk -F'\t' -v oc="$only_cases" '!oc || $2 != ""' | sort | awk -F'\t' '
			{ n[$1]++; if ($2 != "") c[$1] = c[$1] (c[$1] == "" ? "" : ", ") $2 }
			END { for (r in n) print n[r] "\t" r "\t" c[r] }' |
			while IFS=$'\t' read -r n r c; do
				if [ -n "$c" ]; then echo "$n case(s) skipped: $r ($c)"; else echo "part skipped: $r"; fi
			done)
		n=$(skipped_cases "$out" | awk -F'\t' -v oc="$only_cases" '!oc || $2 != ""' | grep -c .)
		n_cases_skipped=$((n_cases_skipped + n))
	fi
}

selected() { [ -z "$pattern" ] || [[ "$1" == *"$pattern"* ]]; }

run_one() { # name timeout cmd... : in the foreground, output streamed
	local name=$1 to=$2; shift 2
	selected "$name" || return 0
	echo "=== $name"
	local t0=$(date +%s%N) out
	out=$(mktemp)
	timeout -k 10 "$to" "$@" 2>&1 | tee "$out"
	local rc=${PIPESTATUS[0]}
	account "$name" "$to" "$out" "$rc" $(( ($(date +%s%N) - t0) / 1000000 ))
	rm -f "$out"
}

# background runs: name, output and start time by pid
declare -A bg_name=() bg_out=() bg_t0=()
run_bg() { # name timeout cmd...
	local name=$1 to=$2; shift 2
	local out
	out=$(mktemp)
	timeout -k 10 "$to" "$@" >"$out" 2>&1 </dev/null &
	bg_name[$!]=$name; bg_out[$!]=$out; bg_t0[$!]=$(date +%s%N)
	echo "=== $name: started"
}
reap_one() { # waits for any background run and reports it whole
	local pid rc
	wait -n -p pid "${!bg_name[@]}"
	rc=$?
	local name=${bg_name[$pid]} out=${bg_out[$pid]} t0=${bg_t0[$pid]}
	unset "bg_name[$pid]" "bg_out[$pid]" "bg_t0[$pid]"
	echo "=== $name"
	cat "$out"
	account "$name" "$SCRIPT_TIMEOUT" "$out" "$rc" $(( ($(date +%s%N) - t0) / 1000000 ))
	rm -f "$out"
}
tagged() { head -n 30 "$1" | grep -q "^# test-run:.*\b$2\b"; }

for t in "$BUILD"/tests/test_*; do
	[ -x "$t" ] || continue
	run_one "unit/$(basename "$t")" "$UNIT_TIMEOUT" "$t"
done
if [ $unit_only = 0 ]; then
	JOBS=${TEST_JOBS:-2}
	long=() rest=() alone=()
	for t in tests/*/t_*.sh; do
		[ -x "$t" ] || continue
		selected "${t#tests/}" || continue
		if tagged "$t" alone; then alone+=("$t")
		elif tagged "$t" long; then long+=("$t")
		else rest+=("$t"); fi
	done
	if [ "$JOBS" -le 1 ]; then
		for t in "${long[@]}" "${rest[@]}" "${alone[@]}"; do run_one "${t#tests/}" "$SCRIPT_TIMEOUT" "$t"; done
	else
		for t in "${long[@]}" "${rest[@]}"; do
			[ ${#bg_name[@]} -ge "$JOBS" ] && reap_one
			run_bg "${t#tests/}" "$SCRIPT_TIMEOUT" "$t"
		done
		while [ ${#bg_name[@]} -gt 0 ]; do reap_one; done
		for t in "${alone[@]}"; do run_one "${t#tests/}" "$SCRIPT_TIMEOUT" "$t"; done
	fi
fi

echo
echo "tests: ${#pass[@]} passed, ${#skip[@]} skipped, ${#fail[@]} failed;" \
	"$n_cases_skipped skipped case(s) or part(s) inside tests that ran"
for s in "${skip[@]}"; do echo "  skipped: $s"; done
for s in "${partial[@]}"; do echo "  ran with skips: $s"; done
for f in "${fail[@]}"; do echo "  FAILED: $f"; done
[ ${#fail[@]} -eq 0 ]
