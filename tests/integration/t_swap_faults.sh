#!/usr/bin/env bash
# t_swap_faults.sh — swap I/O errors fall back to recomputing, visibly.
#
# kvd-faulty (kvd built with -DKVD_FAULT_INJECTION) puts kvmm's fault layer
# under the swap file as KVD_TEST_SWAP_FAULT says. A tiny pool under 16
# concurrent clients swaps all the time; with every swap-in failing (EIO),
# every swap-out failing (ENOSPC), and a few short reads:
#   - every output is byte- and token-identical to a run without swap
#   - stats count the failed page transfers (swap_errors) and the requests
#     recomputed after them (swap_fallback_recomputes); without faults both
#     stay 0
#   - the ledger's records carry the same counts, per request (failed
#     demotions of cached prefix pages, which cost no request anything, are
#     counted in swap_errors only)
#   - the log says each incident once (one line per failed swap-out, swap-in
#     or prefix read-back; one per run of failed demotions)
source "$(dirname "$0")/lib.sh"
need_bins
FAULTY=$ROOT/$BUILD/tests/kvd-faulty
[ -x "$FAULTY" ] || skip "$FAULTY not built"
TINY=$(tiny_model gqa)
M=16
for i in $(seq 1 $M); do echo "prompt number $i: the quick brown fox $((i * 7)) jumps over" >"$T/p$i"; done

# reference: a pool big enough that nothing is preempted, no swap file
start_kvd ref "$T/ref.sock" --model "$TINY" --pool-size 32M --max-num-seqs 64 --threads 2
REF_PID=$KVD_PID
for i in $(seq 1 $M); do
	"$RAW" -s "$T/ref.sock" generate --raw --ids -n 120 "$(cat "$T/p$i")" >"$T/ref$i.out" 2>"$T/ref$i.err" &
	CP[$i]=$!
done
for i in $(seq 1 $M); do wait "${CP[$i]}" || fail "reference client $i exited $?"; done
stop_kvd "$REF_PID" || fail "reference kvd exit status $?"

# run NAME FAULT: the tiny pool with swap under kvd-faulty, outputs compared
run() {
	local name=$1 fault=$2 i
	KVD=$FAULTY KVD_TEST_SWAP_FAULT=$fault start_kvd "$name" "$T/$name.sock" --model "$TINY" --pool-size 480K \
		--swap-file "$T/$name.swap" --swap-size 32M --max-num-seqs 64 --threads 2 --ledger "$T/$name.jsonl"
	for i in $(seq 1 $M); do
		"$RAW" -s "$T/$name.sock" generate --raw --ids -n 120 "$(cat "$T/p$i")" >"$T/$name$i.out" 2>"$T/$name$i.err" &
		CP[$i]=$!
	done
	for i in $(seq 1 $M); do wait "${CP[$i]}" || fail "$name: client $i exited $? ($(tail -1 "$T/$name$i.err"))"; done
	for i in $(seq 1 $M); do
		cmp -s "$T/ref$i.out" "$T/$name$i.out" || fail "$name: client $i: output differs from the run without swap"
		diff <(grep '^id ' "$T/ref$i.err") <(grep '^id ' "$T/$name$i.err") >/dev/null ||
			fail "$name: client $i: tokens differ from the run without swap"
	done
	wait_stat "$T/$name.sock" pages_used 0 5 || fail "$name: pages still used"
	"$RAW" -s "$T/$name.sock" stats >"$T/$name.stats" || fail "$name: stats"
	stop_kvd "$KVD_PID" || fail "$name: kvd exit status $?"
	$PY - "$T/$name.stats" "$T/$name.jsonl" "$T/$name.log" "$fault" <<'PYEOF' || fail "$name: counters, ledger or log"
import json, sys
st = json.load(open(sys.argv[1]))
recs = [json.loads(l) for l in open(sys.argv[2])]
log = [l for l in open(sys.argv[3]) if "swap I/O error:" in l]
fault = sys.argv[4]
errs, recomp = st["swap_errors"], st["swap_fallback_recomputes"]
if not fault.startswith("write"):
    assert st["swap_out_pages"] > 0, "the pool never swapped"
if not fault:
    assert errs == 0 and recomp == 0 and not log, (errs, recomp, log[:2])
    assert all(r["swap_errors"] == 0 and r["swap_fallback_recomputes"] == 0 for r in recs)
    sys.exit(0)
assert errs > 0 and recomp > 0, (errs, recomp)
def pages(l):
    return int(l.split(" failed for ")[1].split(" of ")[0])
# a request's swap-out or swap-in, or a prefix read back for it: one
# incident, one log line, one recompute, its pages in its ledger record
seq = [l for l in log if "preempted request" in l or "cached prefix pages back" in l]
demote = [l for l in log if "writing cached prefix pages" in l]
assert len(seq) + len(demote) == len(log), log
assert len(seq) == recomp, (len(seq), recomp, log[:3])
assert sum(r["swap_fallback_recomputes"] for r in recs) == recomp, (recs, recomp)
per_req = sum(r["swap_errors"] for r in recs)
assert per_req == sum(pages(l) for l in seq), (per_req, sum(pages(l) for l in seq))
# the rest of the failed transfers are demotions (cached pages stay in
# memory), logged once per run of failures
assert errs >= per_req, (errs, per_req)
assert (errs > per_req) == (len(demote) > 0), (errs, per_req, demote[:2])
assert len(demote) <= 3, f"{len(demote)} demotion failure lines: not once per run of failures"
if fault.startswith("read:short"):
    assert all("(short read)" in l for l in log), log[:3]
    n_short = int(fault.split(":")[3])
    assert errs == n_short, (errs, n_short)
print(f"    {errs} failed page transfers ({per_req} charged to requests), {recomp} requests recomputed, "
      f"{len(seq)} + {len(demote)} log lines; e.g. {log[0].strip()}")
PYEOF
	ok "$name (${fault:-no faults}): $M outputs identical to the run without swap; counters, ledger and log agree"
}

run clean ""
run readeio "read:EIO"
run writenospc "write:ENOSPC"
run readshort "read:short:3:2"
