#!/usr/bin/env bash
# t_hibernate.sh — the prefix cache survives a full stop in a file
# (kv.persist_path), without systemd: a cold prompt, SIGTERM (the file is
# written, mode 0600), a new kvd adopts it in the background after READY,
# and the same prompt then finds its prefix cached with tokens identical to
# the cold run. Owner scopes survive: the same prompt from another user
# (setpriv) finds nothing. Each bad file is refused with one log line
# naming the reason and kvd serves cold: a truncated file, a flipped bit in
# a page, a file written for another model, a symbolic link (never
# followed, and never replaced at the next stop). Pages of a quantized K/V
# cache go through two stops and starts (the checksums kept since they were
# indexed, then those verified at adoption) with none refused.
source "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || fail "$KVCTL not built"
TINY=$(tiny_model gqa)
OTHER=$(tiny_model mha)
S=$T/kvd.sock
F=$T/state/prefix-cache
mkdir -p "$T/state"
chmod 755 "$T/state"
PROMPT="A prompt for the hibernation check, long enough to fill a few pages of sixteen tokens in the KV pool of the tiny model, and then some more words."
printf '[server]\nsocket_mode = 0666\n' >"$T/kvd.conf"
U1=""; U2=""
if command -v setpriv >/dev/null && [ "$(id -u)" = 0 ]; then
	U1="setpriv --reuid=65534 --regid=65534 --clear-groups"
	U2="setpriv --reuid=65533 --regid=65533 --clear-groups"
fi

run() { # NAME [MODEL]: start kvd with the cache file
	start_kvd "$1" "$S" --config "$T/kvd.conf" --model "${2:-$TINY}" --pool-size 64M --persist-path "$F"
}
gen() { # WHO NAME: the prompt, 8 tokens, greedy; JSON in $T/NAME.json
	$1 "$KVCTL" --socket "$S" generate --raw --max-tokens 8 --temperature 0 --json -- "$PROMPT" >"$T/$2.json" ||
		fail "$2: generate failed"
}
field() { $PY -c "import json,sys; print(json.dumps(json.load(open('$T/$1.json'))['$2']))"; }
adopted_done() { # NAME: wait for the adoption's outcome line
	local i
	for i in $(seq 1 100); do
		grep -q "cache file .*: adopted" "$T/$1.log" && return 0
		sleep 0.1
	done
	fail "$1: no adoption line: $(grep 'cache file' "$T/$1.log")"
}
one_refusal() { # NAME REASON
	local n
	n=$(grep -c "cache file .*refused" "$T/$1.log")
	[ "$n" = 1 ] || fail "$1: $n refusal lines: $(grep 'cache file' "$T/$1.log")"
	grep "cache file .*refused" "$T/$1.log" | grep -q -- "$2" ||
		fail "$1: the refusal does not say '$2': $(grep 'cache file .*refused' "$T/$1.log")"
}
restore() { rm -f "$F"; cp -p "$T/good" "$F"; }

# 1. cold run, stop: the file is written
run cold
gen "$U1" cold
[ "$(field cold cached_tokens)" = 0 ] || fail "cold run: $(field cold cached_tokens) cached tokens"
stop_kvd "$KVD_PID" || fail "cold: kvd exited $?"
grep -q "cache file $F: wrote [1-9]" "$T/cold.log" || fail "cold: not written: $(grep 'cache file' "$T/cold.log")"
[ -f "$F" ] && [ ! -L "$F" ] || fail "no cache file"
[ "$(stat -c %a "$F")" = 600 ] || fail "cache file mode $(stat -c %a "$F")"
[ "$(stat -c %u "$F")" = "$(id -u)" ] || fail "cache file owner $(stat -c %u "$F")"
[ ! -e "$F.tmp" ] || fail "temporary file left behind"
cp -p "$F" "$T/good"
ok "stop: $(grep "cache file" "$T/cold.log" | sed 's/^<[0-9]>//'); mode 0600"

# 2. warm start from the file
run warm
grep -q "cache file $F: adopting" "$T/warm.log" || fail "warm: $(grep 'cache file' "$T/warm.log")"
adopted_done warm
gen "$U1" warm
c=$(field warm cached_tokens); pl=$(field cold prompt_tokens)
[ "$c" -ge 16 ] || fail "warm: $c cached tokens of $pl"
[ "$(field warm token_ids)" = "$(field cold token_ids)" ] || fail "warm: tokens differ from the cold run"
a=$(stat_of "$S" pages_adopted)
[ "$a" -ge 1 ] || fail "stats: pages_adopted $a"
ok "start: $(grep "cache file .*: adopted" "$T/warm.log" | sed 's/^<[0-9]>//'); $c of $pl prompt tokens cached; tokens identical to the cold run; pages_adopted $a"
if [ -n "$U2" ]; then
	gen "$U2" other-user
	[ "$(field other-user cached_tokens)" = 0 ] || fail "another user hit the first user's adopted prefix ($(field other-user cached_tokens) tokens)"
	[ "$(field other-user token_ids)" = "$(field cold token_ids)" ] || fail "other user: tokens differ"
	ok "owner scopes kept: another user's same prompt found 0 cached tokens"
else
	echo "skipped: the second-user check (needs root and setpriv)"
fi
stop_kvd "$KVD_PID" || fail "warm: kvd exited $?"

# 3. refusals: each logs one line naming the reason and serves cold
cold_again() { # NAME
	gen "$U1" "$1"
	[ "$(field "$1" cached_tokens)" = 0 ] || fail "$1: $(field "$1" cached_tokens) cached tokens"
	[ "$(field "$1" token_ids)" = "$(field cold token_ids)" ] || fail "$1: tokens differ from the cold run"
}
restore; truncate -s -4096 "$F"
run truncated
one_refusal truncated "truncated"
cold_again truncated
stop_kvd "$KVD_PID" || fail "truncated: kvd exited $?"
ok "truncated: $(grep 'cache file .*refused' "$T/truncated.log" | sed 's/^<[0-9]>//')"

restore
# data_offset is the header's 64-bit field at byte 64; flip a bit in the first page
$PY - "$F" <<'PY' || fail "cannot flip a bit"
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
off = struct.unpack_from("<Q", b, 64)[0]
b[off + 100] ^= 0x04
open(p, "r+b").write(b)
PY
run flipped
adopted_done flipped
grep -q "cache file .*refused 1 page(s): content does not match the index checksum" "$T/flipped.log" ||
	fail "flipped: $(grep 'cache file' "$T/flipped.log")"
[ "$(grep -c 'cache file .*refused' "$T/flipped.log")" = 1 ] || fail "flipped: more than one refusal line"
cold_again flipped
stop_kvd "$KVD_PID" || fail "flipped: kvd exited $?"
ok "flipped bit: $(grep 'cache file .*refused' "$T/flipped.log" | sed 's/^<[0-9]>//'); served cold, tokens identical"

restore
run other-model "$OTHER"
one_refusal other-model "the model file is another file"
stop_kvd "$KVD_PID" || fail "other-model: kvd exited $?"
ok "another model: $(grep 'cache file .*refused' "$T/other-model.log" | sed 's/^<[0-9]>//')"

rm -f "$F"; cp -p "$T/good" "$T/state/elsewhere"; ln -s "$T/state/elsewhere" "$F"
run symlink
one_refusal symlink "symbolic link"
cold_again symlink
stop_kvd "$KVD_PID" || fail "symlink: kvd exited $?"
[ -L "$F" ] || fail "symlink: the link was replaced"
cmp -s "$T/good" "$T/state/elsewhere" || fail "symlink: the link's target was written"
grep -q "cache file $F: not written: the path is a symbolic link" "$T/symlink.log" ||
	fail "symlink: at the stop: $(grep 'cache file' "$T/symlink.log")"
ok "symbolic link: refused at start, neither followed nor replaced at the stop"

# 4. kept page checksums: pages of a quantized K/V cache (q8_0) are written at
# a stop with the checksums taken when they entered the index, adopted, written
# again at the next stop with the checksums verified at adoption, and adopted
# again: no page is ever refused, the tokens stay those of the cold run
rm -f "$F"
runq() { start_kvd "$1" "$S" --config "$T/kvd.conf" --model "$TINY" --pool-size 64M --persist-path "$F" --cache-type q8_0; }
runq q-cold
gen "$U1" q-cold
stop_kvd "$KVD_PID" || fail "q-cold: kvd exited $?"
for k in 1 2; do
	runq q-warm$k
	adopted_done q-warm$k
	! grep -q "cache file .*refused" "$T/q-warm$k.log" || fail "q-warm$k: $(grep 'cache file .*refused' "$T/q-warm$k.log")"
	gen "$U1" q-warm$k
	[ "$(field q-warm$k cached_tokens)" -ge 16 ] || fail "q-warm$k: $(field q-warm$k cached_tokens) cached tokens"
	[ "$(field q-warm$k token_ids)" = "$(field q-cold token_ids)" ] || fail "q-warm$k: tokens differ from the cold run"
	stop_kvd "$KVD_PID" || fail "q-warm$k: kvd exited $?"
	grep -q "cache file $F: wrote [1-9]" "$T/q-warm$k.log" || fail "q-warm$k: not written: $(grep 'cache file' "$T/q-warm$k.log")"
done
ok "q8_0 cache, stop + start twice: $(grep "cache file .*: adopted" "$T/q-warm2.log" | sed 's/^<[0-9]>//'); nothing refused, tokens identical"
