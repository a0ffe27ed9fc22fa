#!/usr/bin/env bash
# t_ledger_full.sh — the ledger on a full file system loses whole records,
# never half of one, and says so.
#
# The ledger lives on a 64 KiB tmpfs in a private mount namespace (unshare
# -m; skipped where that is not permitted). Requests run while the file
# system has room, then while it is full — the record that crosses into a
# page the tmpfs cannot give is a short write —, then with room again:
#   - every request is served; records that do not fit are dropped, counted
#     (stats ledger_records_dropped) and logged once, not once each
#   - every line of the ledger is one whole JSON object (a short write is cut
#     back, so no record is glued to the half of another)
#   - written + dropped = requests, and writing resumes (and is logged)
# test-run: alone (a private mount namespace and a full tmpfs)
if [ -z "${KVD_LEDGER_FULL_NS:-}" ]; then
	if ! unshare -m --propagation private true 2>/dev/null; then
		echo "SKIP: cannot create a private mount namespace (unshare -m needs root or user namespaces)"
		exit 77
	fi
	KVD_LEDGER_FULL_NS=1 exec unshare -m --propagation private "$0" "$@"
fi
source "$(dirname "$0")/lib.sh"
need_bins
TINY=$(tiny_model gqa)
mkdir -p "$T/small"
mount -t tmpfs -o size=64k kvd-test-ledger "$T/small" 2>"$T/mount.err" || skip "cannot mount a tmpfs: $(cat "$T/mount.err")"
trap 'for p in "${PIDS[@]}"; do kill -KILL "$p"; wait "$p"; done 2>/dev/null; umount "$T/small" 2>/dev/null; cleanup' EXIT
S=$T/kvd.sock
L=$T/small/ledger.jsonl
start_kvd full "$S" --model "$TINY" --pool-size 4M --threads 1 --ledger "$L"

gen() { "$RAW" -s "$S" generate --raw -n 4 "request $1" >/dev/null 2>"$T/gen.err" || fail "request $1: $(cat "$T/gen.err")"; }
N=0
for i in $(seq 1 5); do gen $((++N)); done
dd if=/dev/zero of="$T/small/fill" bs=4096 2>/dev/null # until ENOSPC
for i in $(seq 1 40); do gen $((++N)); done
rm -f "$T/small/fill"
for i in $(seq 1 5); do gen $((++N)); done
$PY - "$L" <<'PYEOF' || fail "the ledger holds a broken line"
import json, sys
data = open(sys.argv[1]).read()
assert data.endswith("\n")
for l in data.splitlines():
    assert isinstance(json.loads(l), dict), l
PYEOF
dropped=$(stat_of "$S" ledger_records_dropped)
[ "$dropped" -gt 0 ] || fail "no record was dropped on a full file system"
lines=$(wc -l <"$L")
[ $((lines + dropped)) = $N ] || fail "$lines records written + $dropped dropped != $N requests"
warned=$(grep -c "cannot append a record: No space left on device" "$T/full.log")
[ "$warned" = 1 ] || fail "the full file system was logged $warned times, expected once"
grep -q "appending again; $dropped record(s) were dropped meanwhile" "$T/full.log" || fail "no notice when writing resumed"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
ok "$N requests on a full, then freed file system: $lines whole records, $dropped dropped (counted, logged once)"
