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
# the same background load. Prints every round's lines, then the medians and
# the ratio of the median save rate to fio's. Needs fio (apt-get install
# fio); a directory on tmpfs has no O_DIRECT and measures memory, not a disk.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/var/tmp}
MIB=${2:-256}
ROUNDS=${3:-3}
make -s build/bench/bench_hibernate
have_fio=1
command -v fio >/dev/null || { echo "fio not installed: no peer figure"; have_fio=0; }
saves=() fios=()
for i in $(seq 1 "$ROUNDS"); do
	out=$(build/bench/bench_hibernate "$DIR" "$MIB")
	echo "$out" | sed "s/^/round $i: /"
	saves+=("$(echo "$out" | sed -n 's/^save: .*, \([0-9.]*\) MiB\/s.*/\1/p')")
	[ "$have_fio" = 1 ] || continue
	f=$DIR/bench-fio.$$
	fio_out=$(fio --name=peer --filename="$f" --ioengine=io_uring --direct=1 --rw=write --bs=256k --iodepth=16 \
		--size="${MIB}M" --end_fsync=1 --output-format=json 2>/dev/null)
	rm -f "$f"
	fio_mib=$(echo "$fio_out" | python3 -c "import json,sys; j=json.load(sys.stdin); print('%.0f' % (j['jobs'][0]['write']['bw_bytes'] / 1048576))")
	echo "round $i: fio: ${fio_mib} MiB/s (io_uring, O_DIRECT, 256k, iodepth 16, ${MIB} MiB)"
	fios+=("$fio_mib")
done
python3 - "${saves[*]}" "${fios[*]:-}" <<'PY'
import statistics, sys
s = [float(x) for x in sys.argv[1].split()]
f = [float(x) for x in sys.argv[2].split()] if sys.argv[2].strip() else []
print("median save: %.0f MiB/s over %d rounds" % (statistics.median(s), len(s)))
if f:
    print("median fio: %.0f MiB/s" % statistics.median(f))
    print("ratio save / fio: %.2f" % (statistics.median(s) / statistics.median(f)))
PY
