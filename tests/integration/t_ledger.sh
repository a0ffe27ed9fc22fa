#!/usr/bin/env bash
# t_ledger.sh — the per-request ledger file ([log] ledger).
#
#   - a request whose (non-root) client is SIGKILLed mid-stream is recorded
#     with that client's real uid and pid, never as uid 0
#   - rejected requests are recorded, with the reason the client was told
#   - SIGHUP after a rename (logrotate) reopens the ledger at its path: new
#     records go to the new file, the rotated one stays whole
#   - a symbolic link at the ledger path is not followed
#   - every line of every ledger file is one whole JSON object
source "$(dirname "$0")/lib.sh"
need_bins
[ -f "$REAL_MODEL" ] || skip "$REAL_MODEL missing (the SIGKILL check needs a model slow enough to kill mid-stream)"
command -v setpriv >/dev/null || skip "setpriv missing (needed to run a client as a non-root uid)"
S=$T/kvd.sock
L=$T/ledger.jsonl
printf '[server]\nsocket_mode = 0666\n[log]\nledger = %s\n' "$L" >"$T/kvd.conf"
start_kvd main "$S" --config "$T/kvd.conf" --model "$REAL_MODEL" --pool-size 64M --threads 2

# a client running as uid 65534, SIGKILLed while its request streams
setpriv --reuid=65534 --regid=65534 --clear-groups "$RAW" -s "$S" generate -n 2000 --hang \
	"Write a very long story about the sea." >/dev/null 2>"$T/kill.err" &
KP=$!
for k in $(seq 1 300); do grep -qs STREAMING "$T/kill.err" && break; sleep 0.05; done
grep -q STREAMING "$T/kill.err" || fail "the client never streamed: $(cat "$T/kill.err")"
kill -KILL "$KP"; wait "$KP" 2>/dev/null
wait_stat "$S" requests_running 0 5 || fail "the killed client's request still runs"
$PY - "$L" "$KP" <<'PYEOF' || fail "the killed client's record: $(tail -1 "$L")"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
r = [x for x in recs if x["finish"] == "cancelled"]
assert len(r) == 1, recs
r = r[0]
assert r["uid"] == 65534, r
assert r["pid"] == int(sys.argv[2]), (r["pid"], sys.argv[2])
assert r["client_id"] > 0, r
assert r["generated_tokens"] > 0, r
PYEOF
ok "a SIGKILLed uid-65534 client's request is recorded with uid 65534 and its pid"

# rejections: a context overflow and an unknown session
"$RAW" -s "$S" generate -n 100000 "hello" >/dev/null 2>"$T/rej1.err"
grep -q "^ERROR" "$T/rej1.err" || fail "expected an ERROR for max_tokens 100000: $(cat "$T/rej1.err")"
setpriv --reuid=65534 --regid=65534 --clear-groups "$RAW" -s "$S" generate -n 100000 "hello" >/dev/null 2>"$T/rej2.err"
grep -q "^ERROR" "$T/rej2.err" || fail "expected an ERROR (as uid 65534): $(cat "$T/rej2.err")"
$PY - "$L" <<'PYEOF' || fail "rejections in the ledger: $(tail -3 "$L")"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
rej = [x for x in recs if x["finish"] == "rejected"]
assert len(rej) == 2, rej
for r in rej:
    assert r["error"] != 0 and "context window" in r["reason"], r
assert rej[0]["uid"] == 0 and rej[1]["uid"] == 65534, rej
assert rej[1]["pid"] > 0, rej
PYEOF
ok "rejected requests are recorded with their reason and requester"

# logrotate: rename, SIGHUP, and the path is written afresh
"$RAW" -s "$S" generate -n 4 "before the rotation" >/dev/null 2>&1 || fail "generate before rotation"
n_before=$(wc -l <"$L")
mv "$L" "$L.1"
kill -HUP "$KVD_PID"
for k in $(seq 1 100); do grep -q "configuration reloaded" "$T/main.log" && break; sleep 0.05; done
grep -q "configuration reloaded" "$T/main.log" || fail "no reload after SIGHUP"
"$RAW" -s "$S" generate -n 4 "after the rotation" >/dev/null 2>&1 || fail "generate after rotation"
[ -f "$L" ] || fail "SIGHUP did not reopen the ledger at $L"
[ "$(wc -l <"$L")" = 1 ] || fail "the new ledger has $(wc -l <"$L") records, expected 1"
[ "$(wc -l <"$L.1")" = "$n_before" ] || fail "the rotated ledger changed after the rotation"
ok "SIGHUP after a rename reopens the ledger (rotated file: $n_before records, new file: 1)"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"

# a symbolic link at the ledger path
: >"$T/victim"
ln -s "$T/victim" "$T/link.jsonl"
start_kvd link "$T/link.sock" --model "$REAL_MODEL" --pool-size 16M --threads 2 --ledger "$T/link.jsonl"
"$RAW" -s "$T/link.sock" generate -n 4 "hello" >/dev/null 2>&1 || fail "generate (symlinked ledger)"
[ ! -s "$T/victim" ] || fail "the ledger was written through a symbolic link"
grep -q "ledger file $T/link.jsonl: is a symbolic link" "$T/link.log" || fail "no warning: $(cat "$T/link.log")"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
ok "a symbolic link at the ledger path is not followed (and kvd says so)"

$PY - "$L" "$L.1" <<'PYEOF' || fail "a ledger line is not one JSON object"
import json, sys
for f in sys.argv[1:]:
    for l in open(f):
        assert l.endswith("\n") and isinstance(json.loads(l), dict), l
PYEOF
ok "every ledger line is one whole JSON object"
