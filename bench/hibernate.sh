#!/usr/bin/env bash
# bench/hibernate.sh — the hibernation file's write rate at a stop against
# fio's io_uring O_DIRECT sequential write on the same directory, in the
# same run:
#
#   bench/hibernate.sh [DIR] [MIB]     (default: /var/tmp, 256)
#
# Prints bench_hibernate's lines (save, open, adopt), fio's rate
# (--ioengine=io_uring --direct=1 --rw=write --bs=256k --iodepth=16, MIB of
# data), and the ratio save / fio. Needs fio (apt-get install fio); a
# directory on tmpfs has no O_DIRECT and measures memory, not a disk.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/var/tmp}
MIB=${2:-256}
make -s build/bench/bench_hibernate
out=$(build/bench/bench_hibernate "$DIR" "$MIB")
echo "$out"
save=$(echo "$out" | sed -n 's/^save: .*, \([0-9.]*\) MiB\/s.*/\1/p')
command -v fio >/dev/null || { echo "fio not installed: no peer figure"; exit 0; }
f=$DIR/bench-fio.$$
fio_out=$(fio --name=peer --filename="$f" --ioengine=io_uring --direct=1 --rw=write --bs=256k --iodepth=16 \
	--size="${MIB}M" --end_fsync=1 --output-format=json 2>/dev/null)
rm -f "$f"
fio_mib=$(echo "$fio_out" | python3 -c "import json,sys; j=json.load(sys.stdin); print('%.0f' % (j['jobs'][0]['write']['bw_bytes'] / 1048576))")
echo "fio: ${fio_mib} MiB/s (io_uring, O_DIRECT, 256k, iodepth 16, ${MIB} MiB)"
python3 -c "print('ratio save / fio: %.2f' % ($save / $fio_mib))"
