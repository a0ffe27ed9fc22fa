#!/usr/bin/env bash
# t_swap_file_full.sh — a swap file that does not fit says so at start-up.
#
# A 1 MiB tmpfs in a private mount namespace (unshare -m; needs root or user
# namespaces, else the test is skipped) plays a full file system: kvd asked
# for an 8 MiB swap file there must exit 1 with "cannot preallocate", the
# errno text, and the free space, and leave no file behind.
# test-run: alone (a private mount namespace and a full tmpfs)
source "$(dirname "$0")/lib.sh"
need_bins
TINY=$(tiny_model gqa)
mkdir -p "$T/small"

if ! unshare -m --propagation private sh -c "mount -t tmpfs -o size=1M kvd-test '$T/small'" 2>"$T/unshare.err"; then
	skip "cannot mount a tmpfs in a private mount namespace: $(head -1 "$T/unshare.err")"
fi
timeout -k 5 60 unshare -m --propagation private sh -c '
	mount -t tmpfs -o size=1M kvd-test "$1" || exit 99
	"$2" --config /dev/null --socket "$3" --model "$4" --pool-size 2M --swap-file "$1/swap" --swap-size 8M \
		--threads 1
	rc=$?
	ls -A "$1" >"$5"
	exit $rc' sh "$T/small" "$KVD" "$T/full.sock" "$TINY" "$T/left" 2>"$T/full.log"
rc=$?
[ $rc != 99 ] || skip "mounting the tmpfs failed"
[ $rc = 1 ] || fail "kvd exit status $rc, expected 1"
grep -q "swap file $T/small/swap: cannot preallocate 8.0 MiB (kv.swap_size): No space left on device; $T/small has" \
	"$T/full.log" || fail "no clear message: $(cat "$T/full.log")"
grep -q "KV pool: cannot create" "$T/full.log" && fail "the old, misleading message is still there"
[ ! -s "$T/left" ] || fail "files left on the full file system: $(cat "$T/left")"
ok "a swap file too large for its file system: \"$(grep -o 'cannot preallocate.*' "$T/full.log" | head -1)\""
