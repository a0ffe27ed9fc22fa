#!/usr/bin/env bash
# t_firsthour.sh — the README's "Using it" block works as pasted after
# `make run`.
#
# The daemon is started by scripts/run, as `make run` starts it (in a
# private run directory, KVD_RUN_DIR, so that a developer's own `make run`
# is left alone). The block is extracted from README.md, so this test fails
# when the README drifts from what works: its first line must be the setup
# line scripts/run prints, and every line must succeed, in a shell that has
# neither kvctl on PATH nor KVD_SOCKET set, from a directory laid out like
# the checkout after `make run` (run/env, README.md). Also checked: without
# the setup line the block fails, and kvctl's error when it cannot connect
# names the socket it tried and how to choose another (--socket,
# $KVD_SOCKET).
source "$(dirname "$0")/lib.sh"
[ -x "$KVD" ] || skip "$KVD not built"
[ -x "$KVCTL" ] || skip "$KVCTL not built"
[ -f "$REAL_MODEL" ] || skip "the default model $REAL_MODEL is missing (scripts/setup fetches it)"

# ---- the block, from README.md ---------------------------------------------------
awk '/^## Using it/ { sec = 1; next }
     sec && /^## / { exit }
     sec && /^```sh/ { inb = 1; next }
     inb && /^```/ { exit }
     inb { print }' README.md >"$T/block.sh"
[ -s "$T/block.sh" ] || fail "README.md has no sh block under '## Using it'"
setup=$(head -n 1 "$T/block.sh" | sed 's/[[:space:]]*#.*//')
case "$setup" in
kvctl*) fail "the README's block starts with kvctl: it needs the setup line make run prints first" ;;
esac
ok "README block: $(wc -l <"$T/block.sh") lines, setup line '$setup'"

# ---- the daemon, as make run starts it ----------------------------------------------
RUN=$T/home/run
mkdir -p "$T/home"
cp README.md "$T/home/"
stop_run() { KVD_RUN_DIR=$RUN scripts/stop >>"$T/stop.log" 2>&1; }
trap 'stop_run; cleanup' EXIT
env -u KVD_SOCKET BUILD="$BUILD" KVD_RUN_DIR="$RUN" PROMPT="Say hello." scripts/run >"$T/run.log" 2>&1 ||
	fail "scripts/run failed: $(tail -n 20 "$T/run.log")"
[ -f "$RUN/kvd.pid" ] && PIDS+=("$(cat "$RUN/kvd.pid")")
[ -S "$RUN/kvd.sock" ] || fail "scripts/run did not create $RUN/kvd.sock"
# scripts/run prints the README's setup line (its run directory spelled out)
expect_line=${setup//run\//$RUN/}
grep -qF -- "$expect_line" "$T/run.log" ||
	fail "scripts/run does not print the README's setup line ('$expect_line'): $(tail -n 5 "$T/run.log")"
ok "scripts/run started kvd and printed '$expect_line'"

# ---- the block, pasted into a fresh shell -------------------------------------------------
# a PATH without build/bin (nor /usr/local/bin, where make install puts kvctl)
CLEAN_PATH=/usr/bin:/bin
env PATH=$CLEAN_PATH bash -c 'command -v kvctl' >/dev/null 2>&1 &&
	skip "a kvctl is installed in $CLEAN_PATH: cannot tell whether the setup line is needed"
paste_block() { # FILE -> exit status; output in $T/block.out/.err
	(cd "$T/home" && env -u KVD_SOCKET PATH=$CLEAN_PATH bash -e -o pipefail -x "$1" \
		>"$T/block.out" 2>"$T/block.err")
}
tail -n +2 "$T/block.sh" >"$T/nosetup.sh"
paste_block "$T/nosetup.sh" && fail "the block works without its setup line: the test cannot tell a broken README"
ok "without the setup line the block fails ($(grep -v '^+' "$T/block.err" | head -n 1))"

paste_block "$T/block.sh" ||
	fail "the README block failed when pasted: $(tail -n 8 "$T/block.err")"
# what the commands printed: a generation, JSON stats, a plan
grep -q '"pages_total":' "$T/block.out" || fail "no 'kvctl stats --json' output"
grep -q 'sequences of 4096 tokens' "$T/block.out" || fail "no 'kvctl plan' output"
grep -q 'CLIENT' "$T/block.out" || fail "no 'kvctl ps' header"
[ "$(grep -c '^+ kvctl' "$T/block.err")" -ge 8 ] || fail "fewer kvctl commands ran than the block has"
ok "the README block works as pasted ($(wc -l <"$T/block.out") lines of output)"

# ---- client/examples/kvc_parallel: its shared system prompt is shared ----------------------
# The prompts share a system prompt of several pages: while they run, the
# pages are shared, or (when one request's prefill came first) the others
# find them in the prefix cache. Either way more than one page's worth.
EXP=$ROOT/$BUILD/examples/kvc_parallel
if [ -x "$EXP" ]; then
	block=$(KVD_SOCKET=$RUN/kvd.sock "$KVCTL" version --json | sed -E 's/.*"block_size":([0-9]+).*/\1/')
	KVD_SOCKET=$RUN/kvd.sock "$EXP" "Name a color." "Name a fruit." "Name a planet." >"$T/par.out" 2>&1 ||
		fail "kvc_parallel: $(tail -n 5 "$T/par.out")"
	shared=$(sed -nE 's/.* ([0-9]+) of them shared.*/\1/p' "$T/par.out" | head -n 1)
	cached=$(sed -nE 's/.*; ([0-9]+) of [0-9]+ prompt tokens were cached.*/\1/p' "$T/par.out" | sort -n | tail -n 1)
	[ "${shared:-0}" -ge 2 ] || [ "${cached:-0}" -ge $((2 * block)) ] ||
		fail "kvc_parallel shows no sharing beyond one page (shared pages ${shared:-?}, most cached tokens ${cached:-?}, $block tokens a page): $(cat "$T/par.out")"
	ok "kvc_parallel: ${shared:-0} pages shared while running, up to ${cached:-0} prompt tokens from the cache"
else
	echo "skipped: kvc_parallel check: $EXP not built"
fi

# ---- the hint when kvctl cannot connect -------------------------------------------------------
env -u KVD_SOCKET "$KVCTL" --socket "$T/nowhere.sock" stats >/dev/null 2>"$T/hint1"
rc=$?
[ $rc = 3 ] || fail "kvctl --socket to a missing socket: exit $rc, expected 3"
grep -qF "$T/nowhere.sock" "$T/hint1" || fail "the error does not name the socket tried: $(cat "$T/hint1")"
grep -qF -- "--socket" "$T/hint1" || fail "the error does not mention --socket: $(cat "$T/hint1")"
grep -qF 'KVD_SOCKET' "$T/hint1" || fail "the error does not mention KVD_SOCKET: $(cat "$T/hint1")"
KVD_SOCKET=$T/elsewhere.sock "$KVCTL" stats >/dev/null 2>"$T/hint2"
grep -qF "$T/elsewhere.sock (from \$KVD_SOCKET)" "$T/hint2" ||
	fail "the error does not say the socket came from \$KVD_SOCKET: $(cat "$T/hint2")"
ok "connect error: $(head -n 1 "$T/hint1" | sed 's/^<[0-9]>//')"

stop_run
grep -q "stopped" "$T/stop.log" || fail "scripts/stop: $(cat "$T/stop.log")"
ok "scripts/stop stopped it"
