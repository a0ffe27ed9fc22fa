#!/usr/bin/env bash
# t_ps_privacy.sh — PS (kvctl ps) shows a user only their own requests;
# root and members of server.admin_groups see everyone's.
source "$(dirname "$0")/lib.sh"
need_bins
HOSTILE=$ROOT/$BUILD/tests/kvd_hostile
[ -x "$HOSTILE" ] || skip "$HOSTILE not built"
command -v setpriv >/dev/null || skip "setpriv missing"
TINY=$(tiny_model gqa)
S=$T/kvd.sock
U1="setpriv --reuid=65534 --regid=65534 --clear-groups"
U2="setpriv --reuid=65533 --regid=65533 --clear-groups"
ADM="setpriv --reuid=65532 --regid=65532 --groups=4243"

printf '[server]\nsocket_mode = 0666\nadmin_groups = 4243\n' >"$T/kvd.conf"
start_kvd ps "$S" --config "$T/kvd.conf" --model "$TINY" --pool-size 8M --threads 1
$U1 "$HOSTILE" -s "$S" --seconds 6 upload-hang >"$T/up1.out" 2>&1 &
P1=$!
$U2 "$HOSTILE" -s "$S" --seconds 6 upload-hang >"$T/up2.out" 2>&1 &
P2=$!
for i in $(seq 1 100); do grep -q UPLOADING "$T/up1.out" && grep -q UPLOADING "$T/up2.out" && break; sleep 0.1; done
grep -q UPLOADING "$T/up1.out" && grep -q UPLOADING "$T/up2.out" || fail "the uploading clients did not start"

$U1 "$RAW" -s "$S" ps >"$T/ps1.out" 2>&1 || fail "ps as uid 65534: $(cat "$T/ps1.out")"
grep -q "uid=65534 state=uploading" "$T/ps1.out" || fail "uid 65534 does not see its own request: $(cat "$T/ps1.out")"
grep -q "uid=65533" "$T/ps1.out" && fail "uid 65534 sees uid 65533's request: $(cat "$T/ps1.out")"
$U2 "$RAW" -s "$S" ps >"$T/ps2.out" 2>&1 || fail "ps as uid 65533"
grep -q "uid=65533 state=uploading" "$T/ps2.out" || fail "uid 65533 does not see its own request: $(cat "$T/ps2.out")"
grep -q "uid=65534" "$T/ps2.out" && fail "uid 65533 sees uid 65534's request: $(cat "$T/ps2.out")"
ok "a user sees only their own requests in PS"
"$RAW" -s "$S" ps >"$T/ps0.out" 2>&1 || fail "ps as root"
grep -q "uid=65534" "$T/ps0.out" && grep -q "uid=65533" "$T/ps0.out" || fail "root does not see every request: $(cat "$T/ps0.out")"
$ADM "$RAW" -s "$S" ps >"$T/psa.out" 2>&1 || fail "ps as an admin_groups member"
grep -q "uid=65534" "$T/psa.out" && grep -q "uid=65533" "$T/psa.out" ||
	fail "a member of server.admin_groups does not see every request: $(cat "$T/psa.out")"
ok "root and server.admin_groups members see every request"
wait "$P1"; wait "$P2"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
