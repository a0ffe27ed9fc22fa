#!/usr/bin/env bash
# t_restart_cache.sh — the restart cache's hand-over without systemd:
# fdstore_check.py plays the service manager (notification socket, fd store,
# LISTEN_FDS/LISTEN_FDNAMES) so every bad thing a store could pass back can
# be tried. For each case kvd must start and serve, log exactly one
# "restart cache: discarded ..." line naming the reason, and compute the
# prompt from scratch (0 cached tokens); the genuine fds are adopted, the
# prompt finds its prefix cached, and its tokens equal the cold run's.
# At each clean stop kvd stores exactly kv-pool and kv-index.
source "$(dirname "$0")/lib.sh"
need_bins
TINY=$(tiny_model gqa)
PROMPT="A prompt for the hand-over check, long enough to fill a few pages of sixteen tokens in the KV pool of the tiny model."

# The CUDA plug-in's emulated build, when tests/gpu/t_cuda_emulated.sh made one.
EMU_PLUGIN=$ROOT/$BUILD/gpu-emu/libkvd-cuda.so
if [ -f "$EMU_PLUGIN" ]; then export KVD_TEST_CUDA_PLUGIN=$EMU_PLUGIN; else unset KVD_TEST_CUDA_PLUGIN; fi
$PY tests/integration/fdstore_check.py "$KVD" "$RAW" "$TINY" "$T" "$PROMPT" >"$T/harness.log" 2>&1 ||
	fail "harness: $(tail -5 "$T/harness.log")"

cached() { sed -n 's/^DONE.* cached=\([0-9]*\).*/\1/p' "$T/$1.done"; }
prompt_len() { sed -n 's/^DONE.* prompt=\([0-9]*\).*/\1/p' "$T/$1.done"; }

for f in "$T"/stored-*.txt; do
	[ "$f" = "$T/stored-cuda.txt" ] && continue # a device pool: nothing to store
	[ "$(sort "$f" | tr '\n' ' ')" = "kv-index kv-pool " ] || fail "$(basename "$f"): kvd stored '$(tr '\n' ' ' <"$f")'"
done
ok "every clean stop on the CPU stored exactly kv-pool and kv-index ($(ls "$T"/stored-*.txt | grep -vc stored-cuda) stops)"

[ "$(cached cold)" = 0 ] || fail "cold run: $(cached cold) cached tokens"
grep -Eq "restart cache: (adopted|discarded)" "$T/cold.log" && fail "cold run: $(grep 'restart cache' "$T/cold.log")"
PL=$(prompt_len cold)
[ "${PL:-0}" -ge 32 ] || fail "prompt of $PL tokens: too short"

check_discard() { # case reason-substring [cpu]: cpu compares tokens with the cold run
	local n
	n=$(grep -c "restart cache: discarded" "$T/$1.log")
	[ "$n" = 1 ] || fail "$1: $n discard lines: $(grep 'restart cache' "$T/$1.log")"
	grep "restart cache: discarded" "$T/$1.log" | grep -q -- "$2" ||
		fail "$1: discard line does not say '$2': $(grep 'restart cache: discarded' "$T/$1.log")"
	grep -q "restart cache: adopted" "$T/$1.log" && fail "$1: adopted"
	[ "$(cached "$1")" = 0 ] || fail "$1: $(cached "$1") cached tokens"
	[ "${3:-cpu}" != cpu ] || cmp -s "$T/cold.ids" "$T/$1.ids" || fail "$1: tokens differ from the cold run"
	ok "$1: $(grep 'restart cache: discarded' "$T/$1.log" | sed 's/^<[0-9]>restart cache: discarded the previous run.s KV pool: //'); served cold"
}
check_discard corrupt-index "corrupt"
check_discard unsealed-index "not a memfd sealed against writing and resizing"
check_discard hostile-index "refused: invalid entries"
check_discard pipe-pool "wrong size or kind of file"
check_discard unsealed-pool "not sealed against shrinking"
check_discard short-pool "wrong size or kind of file"
check_discard index-only "without its pool"
if [ -f "$T/cuda.log" ]; then
	check_discard cuda "the cuda backend keeps its KV pool in device memory" device
	grep -q "restart cache: not kept: the cuda backend's KV pool is in device memory" "$T/cuda.log" ||
		fail "cuda: no 'not kept' line at the stop"
	[ ! -s "$T/stored-cuda.txt" ] || fail "cuda: stored $(tr '\n' ' ' <"$T/stored-cuda.txt")"
	ok "cuda: nothing stored at its stop"
else
	echo "skipped: the CUDA case (needs $EMU_PLUGIN, built by tests/gpu/t_cuda_emulated.sh)"
fi

grep -q "restart cache: adopted" "$T/valid.log" || fail "valid: not adopted: $(grep 'restart cache' "$T/valid.log")"
grep -q "restart cache: discarded" "$T/valid.log" && fail "valid: discarded"
c=$(cached valid)
want=$(( PL / 16 * 16 )); [ "$want" -lt "$PL" ] || want=$(( PL - 1 ))
[ "$c" = "$want" ] || fail "valid: $c cached tokens, expected $want of $PL"
cmp -s "$T/cold.ids" "$T/valid.ids" && cmp -s "$T/cold.out" "$T/valid.out" || fail "valid: tokens differ from the cold run"
[ -s "$T/cold.ids" ] || fail "no token ids recorded"
ok "genuine fds: $(grep 'restart cache: adopted' "$T/valid.log" | sed 's/^<[0-9]>//'); $c of $PL prompt tokens cached; tokens identical to the cold run"
