#!/usr/bin/env bash
# bench/hibernate.sh — the hibernation file's write rate at a stop against
# fio's io_uring O_DIRECT sequential write on the same directory, in the
# same run:
#
#   bench/hibernate.sh [DIR] [MIB] [ROUNDS]     (default: /var/tmp, 256, 3)
#
# Each round runs bench_hibernate (save, open, adopt) and then fio
# (--ioengine=io_uring --direct=1 --rw=write --bs=256k --iodepth=16, MIB of
# data, end_fsync) on DIR; the rounds alternate so both see the same disk and
# the same background load. Prints every round's lines, then the medians,
# the ratio of the median save rate to fio's with the spread of the
# per-round ratios, the save's median CPU time per MiB (all its threads) and
# the load before and after. Needs fio (apt-get install fio); a directory on
# tmpfs has no O_DIRECT and measures memory, not a disk.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/var/tmp}
MIB=${2:-256}
ROUNDS=${3:-3}
BENCH=${BENCH:-build/bench/bench_hibernate} # another build of it, to compare two versions
[ "$BENCH" != build/bench/bench_hibernate ] || make -s build/bench/bench_hibernate
have_fio=1
command -v fio >/dev/null || { echo "fio not installed: no peer figure"; have_fio=0; }
saves=() fios=() cpus=()
echo "load before: $(uptime)"
for i in $(seq 1 "$ROUNDS"); do
	out=$("$BENCH" "$DIR" "$MIB")
	echo "$out" | sed "s/^/round $i: /"
	saves+=("$(echo "$out" | sed -n 's/^save: .*, \([0-9.]*\) MiB\/s.*/\1/p')")
	cpus+=("$(echo "$out" | sed -n 's/^save cpu: .*, \([0-9.]*\) ms per MiB.*/\1/p')")
	[ "$have_fio" = 1 ] || continue
	f=$DIR/bench-fio.$$
	fio_out=$(fio --name=peer --filename="$f" --ioengine=io_uring --direct=1 --rw=write --bs=256k --iodepth=16 \
		--size="${MIB}M" --end_fsync=1 --output-format=json 2>/dev/null)
	rm -f "$f"
	read -r fio_mib fio_cpu < <(echo "$fio_out" | python3 -c "
import json, sys
j = json.load(sys.stdin)['jobs'][0]
mib = j['write']['io_bytes'] / 1048576
print('%.0f %.3f' % (j['write']['bw_bytes'] / 1048576, (j['usr_cpu'] + j['sys_cpu']) / 100 * j['job_runtime'] / mib))")
	echo "round $i: fio: ${fio_mib} MiB/s, ${fio_cpu} ms CPU per MiB (io_uring, O_DIRECT, 256k, iodepth 16, ${MIB} MiB)"
	fios+=("$fio_mib")
done
echo "load after: $(uptime)"
python3 - "${saves[*]}" "${fios[*]:-}" "${cpus[*]}" <<'PY'
import statistics, sys
s = [float(x) for x in sys.argv[1].split()]
f = [float(x) for x in sys.argv[2].split()] if sys.argv[2].strip() else []
c = [float(x) for x in sys.argv[3].split()]
print("median save: %.0f MiB/s over %d rounds (%.0f .. %.0f)" % (statistics.median(s), len(s), min(s), max(s)))
if c:
    print("median save CPU: %.3f ms per MiB (%.3f .. %.3f)" % (statistics.median(c), min(c), max(c)))
if f:
    r = [a / b for a, b in zip(s, f)]
    print("median fio: %.0f MiB/s (%.0f .. %.0f)" % (statistics.median(f), min(f), max(f)))
    print("ratio save / fio: %.2f (per-round ratios %.2f .. %.2f)" % (statistics.median(s) / statistics.median(f),
                                                                      min(r), max(r)))
PY
