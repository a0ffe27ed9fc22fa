#!/usr/bin/env bash
# t_swap_file.sh — kvd never destroys a file it finds at kv.swap_file.
#
#   - an existing regular file at the path: kvd refuses to start, says the
#     path exists, and the file is untouched (same bytes, still there)
#   - a symbolic link there (to someone's file, or dangling): refused the
#     same way, the link is not followed, its target unchanged / not created
#   - a fresh path: kvd starts, and the swap file is anonymous (unlinked)
source "$(dirname "$0")/lib.sh"
need_bins
TINY=$(tiny_model gqa)

# start_refused NAME SWAP_PATH: kvd must exit 1 during start-up
start_refused() {
	local rc
	timeout -k 5 60 "$KVD" --config /dev/null --socket "$T/$1.sock" --model "$TINY" --pool-size 2M \
		--swap-file "$2" --swap-size 8M --threads 1 2>"$T/$1.log"
	rc=$?
	[ $rc = 1 ] || fail "$1: kvd exit status $rc, expected 1 (refused at start-up)"
	[ ! -e "$T/$1.sock" ] || fail "$1: kvd listened although its swap file was refused"
}

# an existing file
head -c 100000 /dev/urandom >"$T/precious"
sum=$(sha256sum <"$T/precious")
start_refused existing "$T/precious"
grep -q "swap file $T/precious: the path already exists (a regular file)" "$T/existing.log" ||
	fail "no clear message for an existing file: $(cat "$T/existing.log")"
[ "$(sha256sum <"$T/precious")" = "$sum" ] || fail "the existing file was changed"
ok "an existing file at kv.swap_file is refused and left untouched"

# a symbolic link to someone's file
head -c 5000 /dev/urandom >"$T/target"
sum=$(sha256sum <"$T/target")
ln -s "$T/target" "$T/link"
start_refused symlink "$T/link"
grep -q "swap file $T/link: the path already exists (a symbolic link)" "$T/symlink.log" ||
	fail "no clear message for a symbolic link: $(cat "$T/symlink.log")"
[ "$(sha256sum <"$T/target")" = "$sum" ] || fail "the symbolic link's target was changed"
[ -L "$T/link" ] || fail "the symbolic link was removed"
ok "a symbolic link at kv.swap_file is refused; its target is untouched"

# a dangling link: following it would create the target
ln -s "$T/nothing-here" "$T/dangling"
start_refused dangling "$T/dangling"
[ ! -e "$T/nothing-here" ] || fail "the dangling link was followed (its target now exists)"
grep -q "already exists (a symbolic link)" "$T/dangling.log" || fail "dangling link: $(cat "$T/dangling.log")"
ok "a dangling symbolic link is refused and not followed"

# a fresh path works, and is anonymous once open
start_kvd fresh "$T/fresh.sock" --model "$TINY" --pool-size 2M --swap-file "$T/swap" --swap-size 8M --threads 1
[ ! -e "$T/swap" ] || fail "the swap file is still linked at $T/swap"
ls -l /proc/"$KVD_PID"/fd | grep -q "$T/swap (deleted)" || fail "kvd holds no (deleted) swap file"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
ok "a fresh path: the swap file is created, unlinked, and kept open"
