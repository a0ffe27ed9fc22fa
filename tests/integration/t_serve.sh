#!/usr/bin/env bash
# t_serve.sh — kvd serving real clients end to end.
#
# On a tiny random-weight model (fast):
#   - a shell-script generate (kvctl when built, else the protocol test client)
#   - 32 concurrent clients each get exactly the greedy tokens they get alone
#   - requests sharing a system prompt hit the prefix cache and share pages
#   - a pool too small for the load swaps, and every output is still identical
# On the default model (SmolLM2-135M):
#   - a client killed with SIGKILL mid-stream leaves no used pages behind
#   - malformed frames, an oversized prompt, an unknown message type, a wrong
#     protocol version and a disallowed uid each get an ERROR frame while
#     another client keeps streaming, and that client's output is unchanged
source "$(dirname "$0")/lib.sh"
need_bins
TINY=$(tiny_model gqa)
S=$T/kvd.sock

# ---- tiny model, big pool --------------------------------------------------------
printf '[server]\ntoken_ring_size = 16K\n[log]\nledger = %s\n' "$T/ledger.jsonl" >"$T/tiny.conf"
start_kvd tiny "$S" --config "$T/tiny.conf" --model "$TINY" --pool-size 32M --max-num-seqs 64 --threads 2
TINY_PID=$KVD_PID

# shell-script generate
if [ -x "$KVCTL" ]; then
	out=$(KVD_SOCKET=$S "$KVCTL" generate --raw --max-tokens 16 --temperature 0 "once upon a time") ||
		fail "kvctl generate exited $?"
	[ -n "$out" ] || fail "kvctl generate printed nothing"
	KVD_SOCKET=$S "$KVCTL" stats --json >"$T/stats.json" || fail "kvctl stats --json"
	$PY - "$T/stats.json" <<'PYEOF' || fail "kvctl stats --json lacks keys"
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("pages_total pages_free pages_used pages_shared pages_cached pages_swapped page_bytes "
          "kv_bytes_per_token prefix_query_tokens prefix_hit_tokens requests_running requests_waiting "
          "requests_swapped").split():
    assert isinstance(d[k], int), k
PYEOF
	ok "kvctl generate and kvctl stats --json from a shell script"
else
	out=$("$RAW" -s "$S" generate --raw -n 16 "once upon a time" 2>"$T/gen.err") || fail "generate exited $?"
	grep -q "^DONE finish=length" "$T/gen.err" || fail "no DONE: $(cat "$T/gen.err")"
	echo "note: $KVCTL not built; the shell-script generate used kvd_raw"
	ok "shell-script generate (kvd_raw)"
fi

# 32 concurrent clients == alone
N=32
for i in $(seq 1 $N); do echo "prompt number $i: the quick brown fox $((i * 7)) jumps over" >"$T/p$i"; done
for i in $(seq 1 $N); do
	"$RAW" -s "$S" generate --raw --ids -n 24 "$(cat "$T/p$i")" >"$T/alone$i.out" 2>"$T/alone$i.err" ||
		fail "alone run $i"
done
for i in $(seq 1 $N); do
	"$RAW" -s "$S" generate --raw --ids -n 24 "$(cat "$T/p$i")" >"$T/conc$i.out" 2>"$T/conc$i.err" &
	CP[$i]=$!
done
for i in $(seq 1 $N); do wait "${CP[$i]}" || fail "concurrent client $i exited $?"; done
for i in $(seq 1 $N); do
	cmp -s "$T/alone$i.out" "$T/conc$i.out" || fail "client $i: text differs under load"
	diff <(grep '^id ' "$T/alone$i.err") <(grep '^id ' "$T/conc$i.err") >/dev/null || fail "client $i: tokens differ under load"
done
ok "$N concurrent clients each got exactly their greedy output alone"

# shared system prompt: later requests find its pages in the prefix cache
SYS="You are a careful assistant. Always answer briefly and precisely, and never invent facts that you do not know for sure."
hits0=$(stat_of "$S" prefix_hit_tokens)
for q in "first question" "second question" "third question"; do
	"$RAW" -s "$S" generate --system "$SYS" -n 8 "$q" >/dev/null 2>"$T/sys.err" || fail "system prompt request: $(cat "$T/sys.err")"
done
hits=$(stat_of "$S" prefix_hit_tokens)
[ "$hits" -ge $((hits0 + 64)) ] || fail "too few prefix hits for a shared system prompt ($hits0 -> $hits)"
ok "shared system prompt: prefix_hit_tokens $hits0 -> $hits"

# a slow reader: the 16K token ring fills, tokens queue in kvd and arrive
# batched, the output is unchanged
P="the quick brown fox"
"$RAW" -s "$S" generate --raw --ids -n 480 "$P" >"$T/fast.out" 2>"$T/fast.err" || fail "fast reader"
"$RAW" -s "$S" generate --raw --ids -n 480 --pause 2000 "$P" >"$T/slow.out" 2>"$T/slow.err" || fail "slow reader: $(tail -1 "$T/slow.err")"
cmp -s "$T/fast.out" "$T/slow.out" || fail "slow reader: text differs"
diff <(grep '^id ' "$T/fast.err") <(grep '^id ' "$T/slow.err") >/dev/null || fail "slow reader: tokens differ"
mb=$(sed -n 's/.*max_tokens_per_record=\([0-9]*\).*/\1/p' "$T/slow.err")
tm=$(sed -n 's/.*total_ms=\([0-9]*\).*/\1/p' "$T/slow.err")
n=$(grep -c '^id ' "$T/slow.err")
# 480 one-token records do not fit a 16K ring: when the generation ended
# during the pause, the rest must have been queued and batched
if [ "$n" -ge 400 ] && [ "${tm:-99999}" -lt 2000 ]; then
	[ "${mb:-0}" -gt 1 ] || fail "a slow reader's tokens were never batched ($(tail -1 "$T/slow.err"))"
fi
ok "slow reader: up to $mb tokens per record, identical output"

# sessions: the second turn continues the first one's KV
"$RAW" -s "$S" session -n 12 "My name is Ada." "What is my name?" >"$T/sess.out" 2>"$T/sess.err" || fail "session: $(cat "$T/sess.err")"
c2=$(grep '^DONE' "$T/sess.err" | sed -n '2s/.*cached=\([0-9]*\).*/\1/p')
p2=$(grep '^DONE' "$T/sess.err" | sed -n '2s/.*prompt=\([0-9]*\).*/\1/p')
[ "${c2:-0}" -gt 0 ] && [ "$c2" -lt "$p2" ] || fail "session turn 2: cached $c2 of $p2 tokens"
wait_stat "$S" sessions 0 2 || fail "session not closed"
wait_stat "$S" pages_used 0 2 || fail "a closed session kept its pages"
ok "session: turn 2 reused $c2 of its $p2 context tokens; closing it freed its pages"

# with kvctl: a session held by one-shot processes
if [ -x "$KVCTL" ]; then
	sid=$(KVD_SOCKET=$S "$KVCTL" session open) || fail "kvctl session open"
	KVD_SOCKET=$S "$KVCTL" generate --raw --max-tokens 6 --session "$sid" "first turn" >/dev/null || fail "kvctl turn 1"
	KVD_SOCKET=$S "$KVCTL" generate --json --raw --max-tokens 6 --session "$sid" "second turn" >"$T/kt2.json" || fail "kvctl turn 2"
	kc=$($PY -c "import json; print(json.load(open('$T/kt2.json'))['cached_tokens'])")
	[ "$kc" -gt 0 ] || fail "kvctl session turn 2 reused nothing"
	KVD_SOCKET=$S "$KVCTL" session close "$sid" || fail "kvctl session close"
	KVD_SOCKET=$S "$KVCTL" generate --raw --max-tokens 2 --session "$sid" "x" >/dev/null 2>&1 && fail "a closed session was usable"
	ok "kvctl session open / generate --session (x2, $kc tokens reused) / close"
fi

# prompts uploaded through the shared-memory ring: same output as inline;
# a big upload past the context is consumed, then refused, and the
# connection goes on
"$RAW" -s "$S" generate --raw --ids --ring -n 24 "$(cat "$T/p1")" >"$T/ring1.out" 2>"$T/ring1.err" || fail "ring upload: $(tail -1 "$T/ring1.err")"
cmp -s "$T/alone1.out" "$T/ring1.out" || fail "ring-uploaded prompt gave another output"
head -c 100000 /dev/zero | tr '\0' 'x' >"$T/big.txt"
"$RAW" -s "$S" generate --raw --ring -n 4 "$(cat "$T/big.txt")" >/dev/null 2>"$T/bigring.err"; rc=$?
[ $rc = 2 ] && grep -q "code=-1002" "$T/bigring.err" || fail "100 KB ring upload: $(tail -1 "$T/bigring.err")"
ok "ring upload: same output as inline; 100 KB past the context consumed and refused with IPC_ERR_CONTEXT"

# cancel, context overflow, requests-in-flight limit
"$RAW" -s "$S" generate --raw -n 400 --slow 5 --cancel-after 3 "cancel me" >/dev/null 2>"$T/cancel.err" || fail "cancel: $(tail -1 "$T/cancel.err")"
grep -q "^DONE finish=cancelled" "$T/cancel.err" || fail "CANCEL: $(tail -1 "$T/cancel.err")"
"$RAW" -s "$S" generate --raw -n 600 "too long" >/dev/null 2>"$T/ctx.err"; rc=$?
[ $rc = 2 ] && grep -q "code=-1002 .*exceeds the context window of 512 tokens" "$T/ctx.err" || fail "context overflow: $(cat "$T/ctx.err")"
"$RAW" -s "$S" attack flood >"$T/flood.out" 2>&1 || fail "flood: $(cat "$T/flood.out")"
grep -q "code=-1004 .*too many requests in flight" "$T/flood.out" || fail "flood: $(cat "$T/flood.out")"
wait_stat "$S" requests_running 0 5 || fail "flood requests not cancelled when the client left"
ok "CANCEL -> DONE cancelled; prompt + max_tokens > context -> IPC_ERR_CONTEXT; 64 in flight -> IPC_ERR_LIMIT"

# tokenize, ps, and the per-request ledger
ids=$("$RAW" -s "$S" tokenize "<|im_start|>hello") || fail "tokenize"
[ -n "$ids" ] || fail "tokenize returned nothing"
"$RAW" -s "$S" generate --raw -n 400 --hang "ps me" >/dev/null 2>"$T/ps.err" &
PSP=$!
for k in $(seq 1 100); do grep -q STREAMING "$T/ps.err" && break; sleep 0.02; done
"$RAW" -s "$S" ps >"$T/ps.out" || fail "ps"
kill -KILL "$PSP" 2>/dev/null; wait "$PSP" 2>/dev/null
$PY - "$T/ledger.jsonl" <<'PYEOF' || fail "ledger file"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) >= 40, len(recs)
r = recs[-1]
for k in ("request_id", "finish", "prompt_tokens", "generated_tokens", "ttft_ns", "kv"):
    assert k in r, k
assert r["kv"] is None or "kv_bytes_allocated" in r["kv"]
PYEOF
ok "tokenize ($ids), ps ($(wc -l <"$T/ps.out") live), ledger ($(wc -l <"$T/ledger.jsonl") records)"

# ---- tiny model, tiny pool + swap: same outputs -------------------------------------
S2=$T/kvd-swap.sock
M=16
start_kvd swap "$S2" --model "$TINY" --pool-size 480K --swap-file "$T/swap" --swap-size 32M \
	--max-num-seqs 64 --threads 2
SWAP_PID=$KVD_PID
for i in $(seq 1 $M); do
	"$RAW" -s "$S" generate --raw --ids -n 120 "$(cat "$T/p$i")" >"$T/big$i.out" 2>"$T/big$i.err" || fail "big-pool run $i"
done
for i in $(seq 1 $M); do
	"$RAW" -s "$S2" generate --raw --ids -n 120 "$(cat "$T/p$i")" >"$T/small$i.out" 2>"$T/small$i.err" &
	CP[$i]=$!
done
for i in $(seq 1 $M); do wait "${CP[$i]}" || fail "swap client $i exited $? ($(tail -1 "$T/small$i.err"))"; done
for i in $(seq 1 $M); do
	cmp -s "$T/big$i.out" "$T/small$i.out" || fail "client $i: output differs after swapping"
	diff <(grep '^id ' "$T/big$i.err") <(grep '^id ' "$T/small$i.err") >/dev/null || fail "client $i: tokens differ after swapping"
done
"$RAW" -s "$S2" stats >"$T/swapstats.json"
so=$($PY -c "import json; print(json.load(open('$T/swapstats.json'))['swap_out_pages'])")
si=$($PY -c "import json; print(json.load(open('$T/swapstats.json'))['swap_in_pages'])")
pt=$($PY -c "import json; print(json.load(open('$T/swapstats.json'))['pages_total'])")
[ "$so" -gt 0 ] || fail "the small pool ($pt pages) never swapped"
wait_stat "$S2" pages_used 0 5 || fail "pages still used after the swap run"
ok "pool of $pt pages under $M clients: $so pages swapped out, $si in; every output identical"
stop_kvd "$SWAP_PID" || fail "swap kvd exit status $?"

# the same pool without a swap file: preempted sequences are recomputed
S4=$T/kvd-recompute.sock
start_kvd recompute "$S4" --model "$TINY" --pool-size 480K --max-num-seqs 64 --threads 2
RC_PID=$KVD_PID
for i in $(seq 1 $M); do
	"$RAW" -s "$S4" generate --raw --ids -n 120 "$(cat "$T/p$i")" >"$T/rc$i.out" 2>"$T/rc$i.err" &
	CP[$i]=$!
done
for i in $(seq 1 $M); do wait "${CP[$i]}" || fail "recompute client $i exited $? ($(tail -1 "$T/rc$i.err"))"; done
for i in $(seq 1 $M); do
	cmp -s "$T/big$i.out" "$T/rc$i.out" || fail "client $i: output differs after recompute"
	diff <(grep '^id ' "$T/big$i.err") <(grep '^id ' "$T/rc$i.err") >/dev/null || fail "client $i: tokens differ after recompute"
done
wait_stat "$S4" pages_used 0 5 || fail "pages still used after the recompute run"
ok "the same pool without swap: preempted sequences recomputed, every output identical"
stop_kvd "$RC_PID" || fail "recompute kvd exit status $?"
stop_kvd "$TINY_PID" || fail "tiny kvd exit status $?"

# ---- the default model: kill mid-stream, and errors while another streams ------------
if [ ! -f "$REAL_MODEL" ]; then
	echo "note: $REAL_MODEL missing; skipping the default-model checks"
	exit 0
fi
S3=$T/kvd-real.sock
cat >"$T/real.conf" <<CONF
[server]
socket_mode = 0666
allowed_users = root
allowed_groups = 4242
max_prompt_bytes = 4K
CONF
"$KVD" --config "$T/real.conf" --socket "$S3" --model "$REAL_MODEL" --pool-size 64M --threads 2 2>"$T/real.log" &
REAL_PID=$!
PIDS+=("$REAL_PID")
for i in $(seq 1 600); do "$RAW" -s "$S3" hello >/dev/null 2>&1 && break; sleep 0.1; done

# four clients sharing a system prompt, killed with SIGKILL mid-stream
SYS="You are a helpful assistant who writes long, detailed stories about the sea, lighthouses and their keepers."
for i in 1 2 3 4; do
	"$RAW" -s "$S3" generate --system "$SYS" -n 2000 --hang "Write a very long story, part $i." >/dev/null 2>"$T/kill$i.err" &
	KP[$i]=$!
done
for i in 1 2 3 4; do
	for k in $(seq 1 300); do grep -q STREAMING "$T/kill$i.err" && break; sleep 0.05; done
	grep -q STREAMING "$T/kill$i.err" || fail "client $i never streamed: $(cat "$T/kill$i.err")"
done
"$RAW" -s "$S3" stats >"$T/killstats.json"
used=$($PY -c "import json; print(json.load(open('$T/killstats.json'))['pages_used'])")
shared=$($PY -c "import json; print(json.load(open('$T/killstats.json'))['pages_shared'])")
[ "$used" -gt 0 ] || fail "no pages used while streaming"
[ "$shared" -gt 0 ] || fail "four requests with one system prompt share no pages"
{ for i in 1 2 3 4; do kill -KILL "${KP[$i]}"; wait "${KP[$i]}"; done; } 2>/dev/null
wait_stat "$S3" pages_used 0 3 || fail "killed clients' pages were not freed"
wait_stat "$S3" requests_running 0 1 || fail "killed clients' requests still run"
ok "4 clients with a shared system prompt: pages_shared $shared, pages_used $used; killed mid-stream -> pages_used 0"

# reference output alone, then the same request while others misbehave
Q="List five colours of the rainbow."
"$RAW" -s "$S3" generate -n 48 "$Q" >"$T/ref.out" 2>/dev/null || fail "reference run"
"$RAW" -s "$S3" generate -n 48 "$Q" >"$T/victim.out" 2>"$T/victim.err" &
VP=$!
for k in $(seq 1 200); do [ -s "$T/victim.out" ] && break; sleep 0.02; done
for a in badmagic short badlen unknown-type version reserved garbage-ring no-hello; do
	"$RAW" -s "$S3" attack "$a" >"$T/attack-$a.out" 2>&1 || fail "attack $a: $(cat "$T/attack-$a.out")"
	grep -q '^ERROR code=' "$T/attack-$a.out" || fail "attack $a: no ERROR frame"
done
grep -q 'code=-1001' "$T/attack-version.out" || fail "wrong version: expected IPC_ERR_VERSION"
head -c 8000 /dev/zero | tr '\0' 'y' >"$T/big8k.txt"
"$RAW" -s "$S3" generate --ring -n 4 "$(cat "$T/big8k.txt")" >/dev/null 2>"$T/big8k.err"
grep -q "code=-1004 .*exceeds this server's limit of 4096 bytes" "$T/big8k.err" || fail "oversized ring upload: $(cat "$T/big8k.err")"
"$RAW" -s "$S3" attack --bytes 8000 oversized-prompt >"$T/attack-big.out" 2>&1 || fail "oversized prompt: $(cat "$T/attack-big.out")"
grep -q 'code=-1004' "$T/attack-big.out" || fail "oversized prompt: expected IPC_ERR_LIMIT: $(cat "$T/attack-big.out")"
if command -v setpriv >/dev/null; then
	setpriv --reuid=65534 --regid=65534 --clear-groups "$RAW" -s "$S3" hello >"$T/denied.out" 2>&1
	grep -q 'code=-1007' "$T/denied.out" || fail "disallowed uid: expected IPC_ERR_DENIED: $(cat "$T/denied.out")"
	setpriv --reuid=65534 --regid=65534 --groups=4242 "$RAW" -s "$S3" hello >"$T/grp.out" 2>&1 ||
		fail "a member of an allowed supplementary group was refused: $(cat "$T/grp.out")"
	setpriv --reuid=65534 --regid=4242 --clear-groups "$RAW" -s "$S3" hello >"$T/pgrp.out" 2>&1 ||
		fail "a user whose primary group is allowed was refused: $(cat "$T/pgrp.out")"
else
	echo "note: setpriv missing; disallowed-uid check skipped"
fi
kill -0 "$VP" 2>/dev/null || echo "note: the streaming client finished before the attacks ended"
wait "$VP" || fail "the streaming client failed: $(cat "$T/victim.err")"
cmp -s "$T/ref.out" "$T/victim.out" || fail "the streaming client's output changed"
kill -0 "$REAL_PID" || fail "kvd died"
ok "bad magic, short, bad length, unknown type, wrong version, reserved field, ring garbage, no HELLO, oversized prompt, disallowed uid: each an ERROR frame (allowed groups, primary or supplementary, admitted); the streaming client was unaffected"
# SIGTERM drains: a running request still finishes normally (drain_timeout 10 s)
"$RAW" -s "$S3" generate -n 24 "Name three rivers." >"$T/drain.out" 2>"$T/drain.err" &
DP=$!
for k in $(seq 1 200); do [ -s "$T/drain.out" ] && break; sleep 0.02; done
kill -TERM "$REAL_PID"
wait "$DP" || fail "request during drain: $(cat "$T/drain.err")"
grep -q "^DONE finish=length" "$T/drain.err" || fail "request during drain: $(cat "$T/drain.err")"
wait "$REAL_PID" || fail "kvd exit status $? after the drain"
grep -q "SIGTERM: draining" "$T/real.log" || fail "no drain in the log"
ok "SIGTERM: the running request finished (DONE), then kvd exited 0"
exit 0
