#!/usr/bin/env bash
# t_cache_cmd.sh — seeing and steering the hibernated prefix cache, with
# the real daemon (kv.persist_path, no systemd):
#   1. after a stop and a start that adopts the cache file, the re-sent
#      prompt's hit lands on adopted pages: kvctl stats' adopted_hit_tokens
#      grows and its ledger record says adopted_tokens > 0; a fresh prompt
#      after it shows 0 in both;
#   2. kvctl cache save while kvd serves writes the file (pages, bytes and
#      time reported); after a kill -9 (no stop, no writer) the next start
#      adopts the saved pages and a prompt cached before the save hits them;
#   3. kvctl cache drop empties the cache (a re-sent prompt has
#      cached_tokens 0) and removes the file;
#   4. a user who is not an administrator is refused both (exit status 3,
#      the daemon's reason), and save without a persist_path says so.
source "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || fail "$KVCTL not built"
TINY=$(tiny_model gqa)
S=$T/kvd.sock
F=$T/state/prefix-cache
mkdir -p "$T/state"
P1="A first prompt for the cache command check, long enough to fill a few pages of sixteen tokens in the pool of the tiny model."
P2="A second prompt, saved while serving: it too covers several pages of sixteen tokens each, so that the adopted hit is plain."
P3="Something else entirely, never seen before by this daemon or the previous one, with enough words to span pages."
printf '[server]\nsocket_mode = 0666\n' >"$T/kvd.conf"
NOBODY=""
if command -v setpriv >/dev/null && [ "$(id -u)" = 0 ]; then
	NOBODY="setpriv --reuid=65534 --regid=65534 --clear-groups"
fi
K=("$KVCTL" --socket "$S")

run() { # NAME [ARGS...]: kvd with the cache file
	local name=$1; shift
	start_kvd "$name" "$S" --config "$T/kvd.conf" --model "$TINY" --pool-size 64M --persist-path "$F" "$@"
}
gen() { # NAME PROMPT: 4 tokens, greedy; JSON in $T/NAME.json
	"${K[@]}" generate --raw --max-tokens 4 --temperature 0 --json -- "$2" >"$T/$1.json" || fail "$1: generate failed"
}
field() { $PY -c "import json,sys; print(json.load(open('$T/$1.json'))['$2'])"; }
kstat() { "${K[@]}" stats --json | $PY -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
last_ledger() { # FIELD of the newest ledger record
	"${K[@]}" ledger --json -n 1 | $PY -c "import json,sys; print(json.loads(sys.stdin.readline())['$1'])"
}
adopted_done() { # NAME
	local i
	for i in $(seq 1 100); do
		grep -q "cache file .*: adopted" "$T/$1.log" && return 0
		sleep 0.1
	done
	fail "$1: no adoption line: $(grep 'cache file' "$T/$1.log")"
}

# 1. a stop, a start from the file, the re-sent prompt
run cold
gen cold "$P1"
stop_kvd "$KVD_PID" || fail "cold: kvd exited $?"
[ -f "$F" ] || fail "cold: no cache file: $(grep 'cache file' "$T/cold.log")"
run warm
adopted_done warm
[ "$(kstat adopted_hit_tokens)" = 0 ] || fail "warm: adopted_hit_tokens $(kstat adopted_hit_tokens) before any request"
gen warm1 "$P1"
c=$(field warm1 cached_tokens); h=$(kstat adopted_hit_tokens); a=$(last_ledger adopted_tokens)
[ "$c" -ge 16 ] || fail "warm: $c cached tokens"
[ "$h" -ge 16 ] && [ "$h" -le "$(kstat prefix_hit_tokens)" ] || fail "warm: adopted_hit_tokens $h"
[ "$a" = "$c" ] || fail "warm: the ledger says adopted_tokens $a, cached_tokens $c"
# (to a file first: grep -q stops reading at its match, and kvctl, still
# writing, would then die of SIGPIPE and fail the pipeline)
"${K[@]}" stats --prometheus >"$T/prom.txt" || fail "kvctl stats --prometheus"
grep -q "^kvd_adopted_hit_tokens_total $h\$" "$T/prom.txt" || fail "prometheus: no kvd_adopted_hit_tokens_total $h"
gen fresh "$P3"
[ "$(last_ledger adopted_tokens)" = 0 ] || fail "a fresh prompt: adopted_tokens $(last_ledger adopted_tokens)"
[ "$(kstat adopted_hit_tokens)" = "$h" ] || fail "a fresh prompt moved adopted_hit_tokens to $(kstat adopted_hit_tokens)"
ok "after stop + start: the re-sent prompt found $c cached tokens, all in adopted pages (ledger adopted_tokens $a, stats adopted_hit_tokens $h); a fresh prompt 0"
if [ -n "$NOBODY" ]; then
	[ "$($NOBODY "${K[@]}" stats --json | $PY -c "import json,sys; print(json.load(sys.stdin)['adopted_hit_tokens'])")" = 0 ] ||
		fail "another uid sees root's adopted hits"
	ok "adopted_hit_tokens are per user for a non-administrator (65534 sees 0)"
fi

# 2. save while serving, kill -9, start: the saved pages come back
gen save1 "$P2"
rm -f "$F"
"${K[@]}" cache save --json >"$T/save.json" || fail "cache save failed"
cat "$T/save.json"
sp=$($PY -c "import json; print(json.load(open('$T/save.json'))['pages'])")
sb=$($PY -c "import json; print(json.load(open('$T/save.json'))['bytes'])")
[ "$sp" -ge 4 ] && [ "$sb" -gt 0 ] || fail "cache save: $sp pages, $sb bytes"
[ -f "$F" ] && [ "$(stat -c %s "$F")" = "$sb" ] && [ "$(stat -c %a "$F")" = 600 ] || fail "cache save: file $(ls -l "$F" 2>&1)"
grep -q "cache file $F: on request, wrote $sp of" "$T/warm.log" || fail "cache save: not logged: $(grep 'cache file' "$T/warm.log")"
kill -KILL "$KVD_PID"; wait "$KVD_PID" 2>/dev/null
run after-kill
adopted_done after-kill
gen kill1 "$P2"
c=$(field kill1 cached_tokens); a=$(last_ledger adopted_tokens)
[ "$c" -ge 16 ] && [ "$a" = "$c" ] || fail "after kill -9: cached_tokens $c, adopted_tokens $a"
ok "cache save while serving wrote $sp pages ($sb bytes); after kill -9 the next start adopted them: $c cached tokens, adopted_tokens $a"

# 3. drop: nothing cached, no file
"${K[@]}" cache drop --json >"$T/drop.json" || fail "cache drop failed"
cat "$T/drop.json"
dp=$($PY -c "import json; print(json.load(open('$T/drop.json'))['pages'])")
dr=$($PY -c "import json; print(json.load(open('$T/drop.json'))['file_removed'])")
[ "$dp" -ge 4 ] && [ "$dr" = True ] || fail "cache drop: $dp pages, file_removed $dr"
[ ! -e "$F" ] || fail "cache drop: the file is still there"
[ "$(kstat pages_cached)" = 0 ] || fail "cache drop: $(kstat pages_cached) pages still cached"
gen drop1 "$P2"
[ "$(field drop1 cached_tokens)" = 0 ] || fail "after drop: $(field drop1 cached_tokens) cached tokens"
[ "$(field drop1 token_ids)" = "$(field kill1 token_ids)" ] || fail "after drop: tokens differ"
ok "cache drop dropped $dp pages and removed the file; the re-sent prompt found 0 cached tokens, same tokens"

# 4. refusals
if [ -n "$NOBODY" ]; then
	for op in save drop; do
		$NOBODY "${K[@]}" cache $op >/dev/null 2>"$T/denied-$op.txt"
		st=$?
		[ "$st" = 3 ] || fail "non-admin cache $op: exit $st: $(cat "$T/denied-$op.txt")"
		grep -q "admin_groups" "$T/denied-$op.txt" || fail "non-admin cache $op: $(cat "$T/denied-$op.txt")"
	done
	[ ! -e "$F" ] || fail "a refused save wrote the file"
	ok "a non-administrator is refused: $(sed 's/^<[0-9]>//' "$T/denied-save.txt")"
else
	echo "skipped: the non-administrator check (needs root and setpriv)"
fi
stop_kvd "$KVD_PID" || fail "after-kill: kvd exited $?"
rm -f "$F"
start_kvd nopath "$S" --config "$T/kvd.conf" --model "$TINY" --pool-size 64M --persist-path ""
"${K[@]}" cache save >/dev/null 2>"$T/nopath.txt" && fail "cache save without a persist_path succeeded"
grep -q "persist_path" "$T/nopath.txt" || fail "cache save without a persist_path: $(cat "$T/nopath.txt")"
stop_kvd "$KVD_PID" || fail "nopath: kvd exited $?"
ok "without a persist_path: $(sed 's/^<[0-9]>//' "$T/nopath.txt")"
