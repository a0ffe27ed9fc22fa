#!/usr/bin/env bash
# t_kvctl_ledger.sh — kvctl ledger: the daemon's last ledger records.
#
#   - --json prints exactly the lines of the ledger file ([log] ledger), in
#     order; -n N the last N of them;
#   - the table shows what each record says (client, request, uid, finish,
#     prompt, cached and generated tokens, time to first token, session),
#     rejected requests with their reason;
#   - a user who is not an administrator sees only that uid's records, root
#     every user's (as kvctl ps);
#   - -n beyond what the daemon keeps is a usage error.
source "$(dirname "$0")/lib.sh"
need_bins
[ -f "$REAL_MODEL" ] || skip "$REAL_MODEL missing (run scripts/setup)"
command -v setpriv >/dev/null || skip "setpriv missing (needed to run a client as a non-root uid)"
S=$T/kvd.sock
L=$T/ledger.jsonl
printf '[server]\nsocket_mode = 0666\n[log]\nledger = %s\n' "$L" >"$T/kvd.conf"
start_kvd ledger "$S" --config "$T/kvd.conf" --model "$REAL_MODEL" --pool-size 32M --threads 2
K=("$KVCTL" --socket "$S")
NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups)

"${K[@]}" generate --temperature 0 --max-tokens 5 "Say hello." >/dev/null || fail "generate 1"
sid=$("${K[@]}" session open) || fail "session open"
"${K[@]}" generate --temperature 0 --max-tokens 3 --session "$sid" "Name a fruit." >/dev/null || fail "session turn"
"${NOBODY[@]}" "${K[@]}" generate --temperature 0 --max-tokens 4 "Say goodbye." >/dev/null || fail "generate as 65534"
"$RAW" -s "$S" generate -n 100000 "too long" >/dev/null 2>&1 # rejected: beyond the context window
"${NOBODY[@]}" "${K[@]}" generate --temperature 0 --max-tokens 2 "One more." >/dev/null || fail "generate 2 as 65534"
[ "$(wc -l <"$L")" = 5 ] || fail "the ledger file has $(wc -l <"$L") records, expected 5"

# root: everything, exactly the file's lines; -n: the last ones
"${K[@]}" ledger --json -n 0 >"$T/all.json" || fail "kvctl ledger --json"
cmp -s "$T/all.json" "$L" || fail "kvctl ledger --json differs from the file: $(diff "$T/all.json" "$L" | head -5)"
"${K[@]}" ledger --json -n 2 >"$T/last2.json" || fail "kvctl ledger -n 2"
tail -n 2 "$L" | cmp -s - "$T/last2.json" || fail "-n 2 is not the file's last 2 lines"
ok "kvctl ledger --json prints the ledger file's records (all 5, and -n 2 the last 2)"

# another user: only its own
"${NOBODY[@]}" "${K[@]}" ledger --json >"$T/nobody.json" || fail "kvctl ledger as 65534"
grep '"uid":65534,' "$L" | cmp -s - "$T/nobody.json" ||
	fail "uid 65534 sees: $(cat "$T/nobody.json" | cut -c1-120)"
[ "$(wc -l <"$T/nobody.json")" = 2 ] || fail "uid 65534 should see its 2 records"
ok "a non-administrator sees only its own 2 records; root sees all 5"

# the table, against the file
"${K[@]}" ledger -n 0 >"$T/table.txt" || fail "kvctl ledger"
cat "$T/table.txt"
$PY - "$T/table.txt" "$L" <<'PYEOF' || fail "the table does not match the file"
import json, sys
rows = open(sys.argv[1]).read().splitlines()
recs = [json.loads(l) for l in open(sys.argv[2])]
head = rows[0].split()
assert head == ["TIME", "CLIENT", "REQ", "UID", "FINISH", "PROMPT", "CACHED", "ADOPTED", "GEN", "TTFT_MS",
                "ITL_MS", "PAGES", "SESSION"], head
assert len(rows) == 1 + len(recs), (len(rows), len(recs))
for row, r in zip(rows[1:], recs):
    c = row.split(None, 12)
    assert int(c[1]) == r["client_id"] and int(c[2]) == r["request_id"] and int(c[3]) == r["uid"], (row, r)
    assert c[4] == r["finish"], (row, r)
    if r["finish"] == "rejected":
        assert c[5:12] == ["-"] * 7, row
        sess, reason = c[12].split(None, 1)
        assert reason == r["reason"], (reason, r["reason"])
        continue
    assert int(c[5]) == r["prompt_tokens"] and int(c[6]) == r["cached_tokens"], (row, r)
    assert int(c[7]) == r["adopted_tokens"], (row, r)
    assert int(c[8]) == r["generated_tokens"], (row, r)
    assert c[9] == "%.1f" % (r["ttft_ns"] / 1e6), (c[9], r["ttft_ns"])
    if r["generated_tokens"] > 1:
        assert c[10] == "%.2f" % (r["itl_ns"] / 1e6), (c[10], r["itl_ns"])
    assert int(c[11]) == r["kv"]["pages_peak"], (row, r["kv"])
    assert c[12] == (str(r["session_id"]) if r["session_id"] else "-"), (row, r)
assert sum(r["finish"] == "rejected" for r in recs) == 1 and sum(r["session_id"] != 0 for r in recs) == 1
PYEOF
ok "the table shows each record's fields as the file has them (a session turn and a rejection included)"

"${K[@]}" ledger -n 2000 >/dev/null 2>&1
[ $? = 2 ] || fail "-n 2000 should be a usage error"
ok "-n beyond 1024 is a usage error"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
