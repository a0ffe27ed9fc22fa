#!/usr/bin/env bash
# t_prefix_scope.sh — the prefix cache is divided by owner. Two local users
# (uids 65534 and 65533) and a third in the first one's group (65532, gid
# 65534), on the default model:
#  * the cross-user oracle: user B guessing user A's secret gets no cached
#    tokens and no faster first token on a right guess (prefix_oracle.py,
#    200 trials), while the control run with prefix_sharing = all shows the
#    leak is real;
#  * STATS' prefix counters are the caller's own for users, machine-wide for root;
#  * a tenant narrows a user's scope (same tenant shares, another does not);
#  * prefix_sharing = group shares within a primary group only (SIGHUP reload).
# test-run: alone (a timing oracle: first-token times are compared)
source "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || fail "$KVCTL not built"
[ -f "$REAL_MODEL" ] || fail "$REAL_MODEL missing (scripts/setup installs it)"
command -v setpriv >/dev/null || skip "setpriv missing"
S=$T/kvd.sock
A="setpriv --reuid=65534 --regid=65534 --clear-groups"
B="setpriv --reuid=65533 --regid=65533 --clear-groups"
C="setpriv --reuid=65532 --regid=65534 --clear-groups"
ORACLE=$ROOT/tests/integration/prefix_oracle.py
TRIALS=${KVD_ORACLE_TRIALS:-120}

printf '[server]\nsocket_mode = 0666\n[kv]\nprefix_sharing = user\n' >"$T/kvd.conf"
start_kvd scope "$S" --config "$T/kvd.conf" --model "$REAL_MODEL" --pool-size 256M
grep -q 'prefix_sharing\|prefix cache' "$T/scope.log" || true

gen() { # WHO TENANT TEXT -> cached_tokens
	local who=$1 tenant=$2 text=$3 t=()
	[ -n "$tenant" ] && t=(--tenant "$tenant")
	$who "$KVCTL" --socket "$S" generate --raw --max-tokens 1 --temperature 0 --json "${t[@]}" -- "$text" |
		$PY -c "import json,sys; print(json.load(sys.stdin)['cached_tokens'])"
}
ustat() { # WHO KEY
	$1 "$RAW" -s "$S" stats | $PY -c "import json,sys; print(json.load(sys.stdin)['$2'])"
}

# 1. the oracle, closed
$PY "$ORACLE" --kvctl "$KVCTL" --socket "$S" --victim "$A" --attacker "$B" --trials "$TRIALS" \
	--expect scoped --tag s >"$T/oracle.out" 2>&1 || fail "cross-user oracle: $(cat "$T/oracle.out")"
ok "oracle closed: $(cat "$T/oracle.out")"

# 2. counters: B's STATS show B's own hits only; root's the machine's
TXT="Counting sheep is an old remedy for sleeplessness. One sheep, two sheep, three sheep, four sheep, five sheep, six sheep, seven sheep, eight sheep, nine sheep, ten sheep."
b0=$(ustat "$B" prefix_hit_tokens)
r0=$(ustat "" prefix_hit_tokens)
[ "$(gen "$A" "" "$TXT")" = 0 ] || fail "a fresh prompt hit the cache"
h=$(gen "$A" "" "$TXT")
[ "$h" -gt 16 ] || fail "A's resend hit only $h tokens"
[ "$(ustat "$B" prefix_hit_tokens)" = "$b0" ] || fail "B's prefix_hit_tokens moved when A's prompt hit: $b0 -> $(ustat "$B" prefix_hit_tokens)"
r1=$(ustat "" prefix_hit_tokens)
[ "$r1" -ge $((r0 + h)) ] || fail "root's machine-wide prefix_hit_tokens $r0 -> $r1, A hit $h"
[ "$(gen "$B" "" "$TXT")" = 0 ] || fail "B hit A's cached prompt"
hb=$(gen "$B" "" "$TXT")
[ "$(ustat "$B" prefix_hit_tokens)" = $((b0 + hb)) ] || fail "B's prefix_hit_tokens is not its own hits ($b0 + $hb): $(ustat "$B" prefix_hit_tokens)"
ok "STATS: a user's prefix counters count its own hits ($hb), root's count everyone's ($r0 -> $r1)"

# 3. tenants narrow a user's scope
TXT2="Tenants of one gateway must not share a cache unless they say so: alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau."
[ "$(gen "$A" t1 "$TXT2")" = 0 ] || fail "tenant t1's first request hit"
[ "$(gen "$A" t2 "$TXT2")" = 0 ] || fail "tenant t2 hit tenant t1's pages"
[ "$(gen "$A" "" "$TXT2")" = 0 ] || fail "no tenant hit tenant t1's pages"
h=$(gen "$A" t1 "$TXT2")
[ "$h" -gt 16 ] || fail "tenant t1's resend hit only $h tokens"
[ "$(gen "$B" t1 "$TXT2")" = 0 ] || fail "another uid naming tenant t1 hit its pages"
ok "tenants: the same tenant shares ($h tokens), another tenant, none, or another uid with the same name do not"

# 4. prefix_sharing = group, then all (reload)
printf '[server]\nsocket_mode = 0666\n[kv]\nprefix_sharing = group\n' >"$T/kvd.conf"
kill -HUP "$KVD_PID"; sleep 0.5
TXT3="Members of one group may share cached prompts when the administrator allows it, and nobody else may: one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty."
[ "$(gen "$A" "" "$TXT3")" = 0 ] || fail "group: first request hit"
h=$(gen "$C" "" "$TXT3")
[ "$h" -ge 32 ] || fail "group: uid 65532 (gid 65534) did not share uid 65534's pages ($h)"
[ "$(gen "$B" "" "$TXT3")" = 0 ] || fail "group: gid 65533 hit gid 65534's pages"
ok "prefix_sharing = group: a primary group shares ($h tokens), another group does not"

printf '[server]\nsocket_mode = 0666\n[kv]\nprefix_sharing = all\n' >"$T/kvd.conf"
kill -HUP "$KVD_PID"; sleep 0.5
$PY "$ORACLE" --kvctl "$KVCTL" --socket "$S" --victim "$A" --attacker "$B" --trials 20 \
	--expect leaky --tag l >"$T/leak.out" 2>&1 || fail "leaky control: $(cat "$T/leak.out")"
ok "control, prefix_sharing = all (documented as leaking): $(cat "$T/leak.out")"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
