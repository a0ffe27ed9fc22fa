#!/usr/bin/env bash
# bench/hibernate_start.sh — what the cache file costs and gives at a start,
# with the real daemon and the default model:
#
#   bench/hibernate_start.sh [ready|ttft|all] [ROUNDS]   (default: all, 3)
#
# ready: start-up to READY=1 (sd_notify, received by a stand-in socket) with
#   a cache file of about 256 MiB to adopt and with none, ROUNDS starts each,
#   alternating; prints each start's time and the medians' difference
#   (adoption runs after READY=1 and must not delay it).
# ttft: under a real systemd (as tests/integration/t_restart_cache_systemctl.sh:
#   PID 1 of private namespaces, needs root), time to first token of a
#   ~1,650-token prompt cold, after `systemctl restart` (the fd store's warm
#   pool) and after `systemctl stop` + `start` (the cache file), ROUNDS each;
#   prints the medians and the ratio hibernated / warm (target <= 2).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
ROUNDS=${2:-3}
source tests/integration/lib.sh
[ -f "$REAL_MODEL" ] || skip "$REAL_MODEL missing (run scripts/setup)"
make -s all || exit 1
# ~1,650 tokens of text that no other prompt here shares (arg: a seed word)
long_prompt() {
	$PY -c "
import sys
w = sys.argv[1]
s = ' '.join('Sentence %d about %s: the quick brown fox number %d jumps over the lazy dog near the river bank.' % (i, w, i * 7) for i in range(60))
print(s)" "$1"
}
median() { $PY -c "import statistics,sys; print('%.1f' % statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }

ready_part() {
	local F=$T/cache/prefix-cache S=$T/kvd.sock with=() without=()
	mkdir -p "$T/cache"
	start_kvd fill "$S" --model "$REAL_MODEL" --pool-size 320M --threads 2 --persist-path "$F" --persist-size 256M
	for k in 1 2 3 4 5 6; do
		"$KVCTL" --socket "$S" generate --raw --max-tokens 1 --temperature 0 -- "$(long_prompt "fill$k") $(long_prompt "more$k")" \
			>/dev/null || fail "fill $k"
	done
	stop_kvd "$KVD_PID"
	grep 'cache file' "$T/fill.log" | sed 's/^<[0-9]>/  /'
	cat >"$T/ready.py" <<'PY'
import os, socket, subprocess, sys, time
path, log, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    os.unlink(path)
except FileNotFoundError:
    pass
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(120)
env = dict(os.environ, NOTIFY_SOCKET=path)
t0 = time.monotonic()
p = subprocess.Popen(argv, env=env, stderr=open(log, "w"))
while True:
    data = s.recv(65536).decode()
    if "READY=1" in data.splitlines():
        break
print("%.1f" % ((time.monotonic() - t0) * 1e3))
time.sleep(0.5)  # let adoption run a little, then kill: the file stays as it is
p.kill()
p.wait()
PY
	for r in $(seq 1 "$ROUNDS"); do
		a=$($PY "$T/ready.py" "$T/notify.sock" "$T/ready-with.log" "$KVD" --config /dev/null --socket "$S" \
			--model "$REAL_MODEL" --pool-size 320M --threads 2 --persist-path "$F" --persist-size 300M) || fail "ready (file)"
		b=$($PY "$T/ready.py" "$T/notify.sock" "$T/ready-without.log" "$KVD" --config /dev/null --socket "$S" \
			--model "$REAL_MODEL" --pool-size 320M --threads 2 --persist-path "$T/cache/none" --persist-size 300M) || fail "ready (none)"
		echo "round $r: READY=1 after $a ms with the file to adopt, $b ms without"
		with+=("$a"); without+=("$b")
	done
	grep 'cache file' "$T/ready-with.log" | sed 's/^<[0-9]>/  /'
	echo "ready: median $(median "${with[@]}") ms with a $(( $(stat -c %s "$F") >> 20 )) MiB file, $(median "${without[@]}") ms without; difference $($PY -c "print('%.1f' % ($(median "${with[@]}") - $(median "${without[@]}")))") ms"
}

ttft_part() {
	source tests/integration/lib_systemd.sh
	sysd_require kvd-hib-bench
	sysd_stage kvd.service kvd.socket
	cp "$KVD" "$RAW" "$ST/bin/"
	cp "$REAL_MODEL" "$ST/model.gguf"
	chmod 644 "$ST/model.gguf"
	sysd_dropin kvd.service "/run/stage/bin/kvd --config /run/stage/kvd.conf" kvd.log "[Unit]" StartLimitIntervalSec=0
	printf '[model]\npath = /run/stage/model.gguf\n[kv]\npool_size = 64M\n[engine]\nthreads = 2\n' >"$ST/kvd.conf"
	chmod 644 "$ST/kvd.conf"
	sysd_boot 600
	local P cold=() warm=() hib=() i r t
	P=$(long_prompt ttft)
	ttft() { # -> ms, cached tokens
		IN /run/stage/bin/kvd_raw -s /run/kvd/kvd.sock generate --raw -n 1 --temperature 0 "$P" 2>&1 >/dev/null |
			sed -n 's/^DONE.* prompt=\([0-9]*\) cached=\([0-9]*\).* ttft_ms=\([0-9.]*\).*/\3 \2 \1/p'
	}
	IN systemctl start kvd.socket kvd.service || fail "systemctl start"
	for r in $(seq 1 "$ROUNDS"); do
		IN systemctl stop kvd.service 2>/dev/null; IN rm -f /var/lib/kvd/prefix-cache; IN systemctl start kvd.service
		t=$(ttft); cold+=("${t%% *}")
		IN systemctl restart kvd.service
		t2=$(ttft); warm+=("${t2%% *}")
		IN systemctl stop kvd.service 2>/dev/null; IN systemctl start kvd.service
		for i in $(seq 1 100); do IN grep -q 'cache file .*: adopted' /run/stage/kvd.log && break; sleep 0.1; done
		IN sh -c ': >/run/stage/kvd.log'
		t3=$(ttft); hib+=("${t3%% *}")
		echo "round $r: ttft_ms cached prompt: cold $t, restart (fd store) $t2, stop+start (cache file) $t3"
	done
	echo "ttft: median cold $(median "${cold[@]}") ms, restart $(median "${warm[@]}") ms, stop+start $(median "${hib[@]}") ms;" \
	     "stop+start / restart = $($PY -c "print('%.2f' % ($(median "${hib[@]}") / $(median "${warm[@]}")))")"
	IN systemctl stop kvd.service kvd.socket
}

case "$MODE" in
ready) ready_part ;;
ttft) ttft_part ;;
all) ready_part; ttft_part ;;
*) echo "usage: $0 [ready|ttft|all] [ROUNDS]" >&2; exit 2 ;;
esac
