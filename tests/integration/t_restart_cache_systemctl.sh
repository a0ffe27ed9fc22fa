#!/usr/bin/env bash
# t_restart_cache_systemctl.sh — the prefix cache survives `systemctl
# restart kvd` through systemd's file-descriptor store (a real systemd, as
# in t_systemctl.sh: PID 1 of private namespaces, the shipped units plus a
# drop-in pointing at the built kvd and a test config).
#
# Checked:
#   - a prompt run cold (0 cached tokens), then `systemctl restart`: the old
#     kvd hands kv-pool and kv-index to the store, the new one takes them out
#     of it and adopts the cached prefix (log lines), and the same prompt
#     then finds its whole prefix cached (DONE cached=...) with token ids
#     identical to the cold run (same seed, CPU backend);
#   - the store is empty while the new kvd runs (it removed both names);
#   - a fingerprint mismatch discards the pool with one log line and the
#     prompt finds 0 cached tokens: another kv.block_size, then another
#     model file (a copy: another inode);
#   - `systemctl stop` + `start` keeps nothing (systemd drops the store when
#     the unit fully stops);
#   - the pool and index are memfds: nothing new under /var/lib/kvd.
# Skips (77) where namespaces or cgroups are refused.
# test-run: alone (a real systemd as PID 1 of private namespaces)
source "$(dirname "$0")/lib.sh"
need_bins
source "$(dirname "$0")/lib_systemd.sh"
sysd_require kvd-restart
TINY=$(tiny_model gqa)

sysd_stage kvd.service kvd.socket
cp "$KVD" "$RAW" "$ST/bin/"
cp "$TINY" "$ST/model.gguf"
cp "$TINY" "$ST/model-copy.gguf"
chmod 644 "$ST/model.gguf" "$ST/model-copy.gguf"
sysd_dropin kvd.service "/run/stage/bin/kvd --config /run/stage/kvd.conf" kvd.log "[Unit]" StartLimitIntervalSec=0
conf() { # model block_size [kv lines]: the config inside (the host's /tmp is not visible there)
	printf '[model]\npath = %s\n[kv]\npool_size = 2M\nblock_size = %s\n%s\n[engine]\nthreads = 2\n' "$1" "$2" "${3:-}" |
		IN tee /run/stage/kvd.conf >/dev/null
	IN chmod 644 /run/stage/kvd.conf
}
sysd_boot 150

inner_fail() { IN cat /run/stage/kvd.log >"$T/kvd.log" 2>/dev/null; IN systemctl status kvd.service --no-pager >"$T/status.log" 2>&1; fail "$@"; }
PROMPT="The restart cache test prompt: a paragraph long enough to fill several KV pages of sixteen tokens each, so that the prefix index has a chain to hand over."
gen() { # name: generate PROMPT; text to $T/NAME.out, token ids and the DONE line to $T/NAME.err
	IN /run/stage/bin/kvd_raw -s /run/kvd/kvd.sock generate --raw --ids -n 24 --seed 7 --temperature 0.8 "$PROMPT" \
		>"$T/$1.out" 2>"$T/$1.err" || inner_fail "generate $1: $(cat "$T/$1.err")"
	grep -q "^DONE" "$T/$1.err" || inner_fail "generate $1: no DONE"
	grep '^id ' "$T/$1.err" >"$T/$1.ids"
	[ "$(wc -l <"$T/$1.ids")" = 24 ] || inner_fail "generate $1: $(wc -l <"$T/$1.ids") token ids, expected 24"
}
cached() { sed -n 's/^DONE.* cached=\([0-9]*\).*/\1/p' "$T/$1.err"; }
prompt_len() { sed -n 's/^DONE.* prompt=\([0-9]*\).*/\1/p' "$T/$1.err"; }
log_lines() { IN grep -c "$1" /run/stage/kvd.log; }
restart() {
	local mp
	mp=$(IN systemctl show -p MainPID --value kvd.service)
	IN systemctl restart kvd.service || inner_fail "systemctl restart"
	MP=$(IN systemctl show -p MainPID --value kvd.service)
	[ "${MP:-0}" -gt 0 ] && [ "$MP" != "$mp" ] || inner_fail "no new kvd after restart ($mp -> $MP)"
}

conf /run/stage/model.gguf 16
IN systemctl start kvd.socket kvd.service || inner_fail "systemctl start"
gen cold
[ "$(cached cold)" = 0 ] || inner_fail "the first run found $(cached cold) cached tokens"
PL=$(prompt_len cold)
[ "${PL:-0}" -ge 48 ] || inner_fail "prompt of $PL tokens: too short for three pages"
ok "cold run: $PL prompt tokens, 0 cached"

# ---- restart: handed over and adopted ---------------------------------------------
restart
[ "$(log_lines 'restart cache: handed the KV pool')" = 1 ] || inner_fail "no hand-over logged at the stop"
[ "$(log_lines 'restart cache: adopted')" = 1 ] || inner_fail "no adoption logged at the start"
IN grep 'restart cache:' /run/stage/kvd.log | sed 's/^/    /'
n=$(IN systemctl show -p NFileDescriptorStore --value kvd.service 2>/dev/null)
[ "$n" = 0 ] || inner_fail "the store holds '$n' fds while the new kvd runs (it should have taken both out)"
gen warm
c=$(cached warm)
# every full page of the prompt: floor(PL/16) pages, at most PL - 1 tokens
want=$(( PL / 16 * 16 )); [ "$want" -lt "$PL" ] || want=$(( PL - 1 ))
[ "$c" = "$want" ] || inner_fail "after the restart the prompt found $c cached tokens, expected $want"
cmp -s "$T/cold.ids" "$T/warm.ids" && cmp -s "$T/cold.out" "$T/warm.out" ||
	inner_fail "tokens after adoption differ from the cold run: $(tr '\n' ' ' <"$T/cold.ids") / $(tr '\n' ' ' <"$T/warm.ids")"
ok "systemctl restart: the same prompt found $c of $PL tokens cached in the adopted pool; tokens identical to the cold run (seed 7)"
adopted=$(IN /run/stage/bin/kvd_raw -s /run/kvd/kvd.sock stats | sed -n 's/.*"pages_adopted": *\([0-9]*\).*/\1/p')
logged=$(IN grep -o 'restart cache: adopted [0-9]*' /run/stage/kvd.log | tail -1 | grep -o '[0-9]*$')
[ -n "$adopted" ] && [ "$adopted" = "$logged" ] && [ "$adopted" -ge "$(( want / 16 ))" ] ||
	inner_fail "stats: pages_adopted '$adopted', the log said $logged, the prompt alone has $(( want / 16 )) full pages"
ok "stats: pages_adopted $adopted, as logged"

# ---- fingerprint mismatch: another block size ----------------------------------------
conf /run/stage/model.gguf 8
restart
IN grep -q 'restart cache: discarded .*block size 16, now 8' /run/stage/kvd.log || inner_fail "no discard line for the block size"
[ "$(log_lines 'restart cache: adopted')" = 1 ] || inner_fail "adopted despite another block size"
gen bs8
[ "$(cached bs8)" = 0 ] || inner_fail "block size 8: $(cached bs8) cached tokens"
ok "another block size: discarded ($(IN grep 'discarded' /run/stage/kvd.log | tail -1 | sed 's/^<[0-9]>//')), 0 cached tokens"

# ---- fingerprint mismatch: another model file ----------------------------------------
conf /run/stage/model-copy.gguf 8
restart
IN grep -q 'restart cache: discarded .*model file is another file' /run/stage/kvd.log || inner_fail "no discard line for the model file"
gen copy
[ "$(cached copy)" = 0 ] || inner_fail "another model file: $(cached copy) cached tokens"
ok "another model file (same bytes, another inode): discarded, 0 cached tokens"

# ---- a full stop drops the store; the cache file (hibernation) brings it back ---------
restart
gen again
[ "$(cached again)" -gt 0 ] || inner_fail "unchanged config after a restart: nothing cached"
cmp -s "$T/copy.ids" "$T/again.ids" || inner_fail "block size 8: tokens after adoption differ from the cold run"
IN systemctl stop kvd.service 2>/dev/null || inner_fail "systemctl stop"
IN systemctl start kvd.service || inner_fail "systemctl start"
gen afterstop
[ "$(cached afterstop)" -gt 0 ] || inner_fail "after stop + start: nothing came back from the cache file"
IN grep -q 'cache file .*adopt' /run/stage/kvd.log || inner_fail "no cache-file adoption line after stop + start"
cmp -s "$T/copy.ids" "$T/afterstop.ids" || inner_fail "tokens after a stop + start differ from the cold run"
ok "systemctl stop + start: the fd store was dropped; the cache file gave $(cached afterstop) cached tokens back"

# ---- on disk: only the cache file, private to kvd's user; none with persist_path empty ----
files=$(IN find /var/lib/kvd -type f)
[ "$files" = /var/lib/kvd/prefix-cache ] || inner_fail "files under /var/lib/kvd: $files"
mode=$(IN stat -c %a /var/lib/kvd/prefix-cache)
[ "$mode" = 600 ] || inner_fail "the cache file has mode $mode"
IN ls -l /proc/"$(IN systemctl show -p MainPID --value kvd.service)"/fd | grep -q 'memfd:kvd-kv-pool' ||
	inner_fail "the KV pool is not a memfd"
conf /run/stage/model-copy.gguf 8 'persist_path ='
IN systemctl stop kvd.service 2>/dev/null || inner_fail "systemctl stop"
IN rm -f /var/lib/kvd/prefix-cache
IN systemctl start kvd.service || inner_fail "systemctl start"
gen nopersist
IN systemctl stop kvd.service 2>/dev/null || inner_fail "systemctl stop"
IN systemctl start kvd.service || inner_fail "systemctl start"
gen nopersist2
[ "$(cached nopersist2)" = 0 ] || inner_fail "persist_path empty: $(cached nopersist2) cached tokens after stop + start"
IN find /var/lib/kvd -type f | grep -q . && inner_fail "persist_path empty, yet files under /var/lib/kvd: $(IN find /var/lib/kvd -type f)"
ok "the pool is a memfd; on disk only the cache file (mode 600); with persist_path empty a stop + start keeps nothing"
IN systemctl stop kvd.service kvd.socket
exit 0
