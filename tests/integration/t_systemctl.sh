#!/usr/bin/env bash
# t_systemctl.sh — a real `systemctl start kvd` with the shipped units.
#
# systemd runs as PID 1 of private namespaces (pid, mount, cgroup, uts, ipc,
# net) with tmpfs over /run, the unit directories, /var/lib, /tmp and
# /var/tmp, so nothing on the host changes (recipe: machine-facts.md). The
# units are systemd/kvd.service and kvd.socket as shipped, plus a drop-in
# that points ExecStart at the built binary and a test config (tiny model),
# sends stderr to a file, and shortens WatchdogSec. The kvd user comes from
# systemd/kvd.sysusers, applied to copies of the host's user database.
#
# Checked: socket activation on the first connection; Type=notify readiness
# (systemctl start returns once READY=1, StatusText shows serving); the
# hardening in force in the running service (NoNewPrivs, no capabilities,
# its own uid, /usr not writable, /var/lib/kvd writable, no network, a
# seccomp filter, /proc with hidepid=invisible, DevicePolicy=closed);
# a generation through /run/kvd/kvd.sock; a watchdog restart (SIGSTOP the
# main process: systemd kills and restarts it); systemctl stop (clean exit,
# socket file removed). Skips (77) where namespaces or cgroups are refused.
# test-run: alone (a real systemd as PID 1 of private namespaces)
source "$(dirname "$0")/lib.sh"
need_bins
source "$(dirname "$0")/lib_systemd.sh"
sysd_require kvd-test
TINY=$(tiny_model gqa)

# ---- stage: everything the inner world needs, copied into its /run ----------
sysd_stage kvd.service kvd.socket
cp "$KVD" "$RAW" "$ST/bin/"
cp "$TINY" "$ST/model.gguf"
chmod 644 "$ST/model.gguf"
sysd_dropin kvd.service "/run/stage/bin/kvd --config /run/stage/kvd.conf" kvd.log WatchdogSec=2 TimeoutAbortSec=2
printf '[model]\npath = /run/stage/model.gguf\n[kv]\npool_size = 480K\nswap_file = /var/lib/kvd/swap\nswap_size = 16M\n[engine]\nthreads = 2\n' >"$ST/kvd.conf"
chmod 644 "$ST/kvd.conf"
sysd_boot 120

inner_fail() { IN cat /run/stage/kvd.log >"$T/kvd.log" 2>/dev/null; IN systemctl status kvd.service kvd.socket --no-pager >"$T/status.log" 2>&1; cp "$T/console.log" "$T/console-tail.log"; fail "$@"; }

# socket activation on the first connection
IN systemctl start kvd.socket || inner_fail "systemctl start kvd.socket"
IN test -S /run/kvd/kvd.sock || inner_fail "no /run/kvd/kvd.sock"
[ "$(IN stat -c '%a %G' /run/kvd/kvd.sock)" = "660 kvd" ] || inner_fail "socket mode/group: $(IN stat -c '%a %G' /run/kvd/kvd.sock)"
[ "$(IN systemctl is-active kvd.service)" = inactive ] || inner_fail "kvd.service active before any connection"
IN /run/stage/bin/kvd_raw -s /run/kvd/kvd.sock hello >"$T/hello.out" 2>&1 || inner_fail "first connection: $(cat "$T/hello.out")"
[ "$(IN systemctl is-active kvd.service)" = active ] || inner_fail "kvd.service not active after the first connection"
status=$(IN systemctl show -p StatusText --value kvd.service)
case "$status" in serving:*) ;; *) inner_fail "StatusText '$status'" ;; esac
ok "kvd.socket started kvd.service on the first connection; StatusText: $status"

# hardening in force
MP=$(IN systemctl show -p MainPID --value kvd.service)
[ "${MP:-0}" -gt 0 ] || inner_fail "no MainPID"
IN grep -q "^NoNewPrivs:[[:space:]]*1" /proc/"$MP"/status || inner_fail "NoNewPrivs not set"
IN grep -q "^CapEff:[[:space:]]*0000000000000000" /proc/"$MP"/status || inner_fail "kvd has capabilities"
IN grep -Eq "^Uid:[[:space:]]+$KUID[[:space:]]" /proc/"$MP"/status || inner_fail "kvd does not run as the kvd user ($KUID)"
IN nsenter -t "$MP" -m test -w /usr && inner_fail "/usr is writable in the service"
IN nsenter -t "$MP" -m test -w /etc && inner_fail "/etc is writable in the service"
IN nsenter -t "$MP" -m test -w /var/lib/kvd || inner_fail "/var/lib/kvd (StateDirectory) is not writable"
# kvd opens its swap file and unlinks it: look for it among the open files
IN ls -l /proc/"$MP"/fd | grep -q "/var/lib/kvd/swap" || inner_fail "no swap file open in /var/lib/kvd (io_uring swap under the sandbox)"
[ "$(IN readlink /proc/"$MP"/ns/net)" != "$(IN readlink /proc/1/ns/net)" ] || inner_fail "PrivateNetwork not in force"
[ "$(IN readlink /proc/"$MP"/ns/mnt)" != "$(IN readlink /proc/1/ns/mnt)" ] || inner_fail "no private mount namespace"
IN grep -q "^Seccomp:[[:space:]]*2" /proc/"$MP"/status || inner_fail "no seccomp filter (SystemCallFilter=)"
IN nsenter -t "$MP" -m grep -Eq "^proc /proc proc .*hidepid=(invisible|4)" /proc/self/mounts ||
	inner_fail "/proc not mounted with hidepid=invisible in the service (ProtectProc=): $(IN nsenter -t "$MP" -m grep ' /proc ' /proc/self/mounts)"
[ "$(IN systemctl show -p DevicePolicy --value kvd.service)" = closed ] || inner_fail "DevicePolicy is not closed"
ok "hardening in force: NoNewPrivs 1, CapEff 0, uid $KUID, /usr and /etc read-only, /var/lib/kvd writable (swap file there), private network, seccomp filter, /proc hidepid=invisible, DevicePolicy=closed"

IN /run/stage/bin/kvd_raw -s /run/kvd/kvd.sock generate --raw -n 16 "hello from systemd" >"$T/gen.out" 2>"$T/gen.err" ||
	inner_fail "generate: $(cat "$T/gen.err")"
grep -q "^DONE" "$T/gen.err" || inner_fail "generate: no DONE"
# each client's sequence grows to about 26 of the pool's 40 pages, so any
# two of them running at once make the scheduler swap (with 120 tokens a
# client, six had to overlap, and under load they sometimes did not)
for i in 1 2 3 4 5 6 7 8; do
	IN /run/stage/bin/kvd_raw -s /run/kvd/kvd.sock generate --raw -n 400 "swap test $i under systemd" >/dev/null 2>"$T/sw$i.err" &
	SW[$i]=$!
done
for i in 1 2 3 4 5 6 7 8; do wait "${SW[$i]}" || inner_fail "swap client $i: $(cat "$T/sw$i.err")"; done
IN /run/stage/bin/kvd_raw -s /run/kvd/kvd.sock stats >"$T/sysstats.json" || inner_fail "stats"
so=$($PY -c "import json; print(json.load(open('$T/sysstats.json'))['swap_out_pages'])")
[ "$so" -gt 0 ] || inner_fail "8 clients on a 40-page pool did not swap"
ok "a generation through /run/kvd/kvd.sock; 8 clients on 40 pages swapped $so pages through io_uring inside the sandbox"

# watchdog: a stopped main process is killed and restarted
IN kill -STOP "$MP"
for i in $(seq 1 150); do
	MP2=$(IN systemctl show -p MainPID --value kvd.service)
	[ "${MP2:-0}" -gt 0 ] && [ "$MP2" != "$MP" ] && [ "$(IN systemctl is-active kvd.service)" = active ] && break
	sleep 0.1
done
[ "${MP2:-0}" -gt 0 ] && [ "$MP2" != "$MP" ] || inner_fail "no watchdog restart (MainPID still $MP2)"
nr=$(IN systemctl show -p NRestarts --value kvd.service)
[ "${nr:-0}" -ge 1 ] || inner_fail "NRestarts $nr"
IN /run/stage/bin/kvd_raw -s /run/kvd/kvd.sock hello >/dev/null 2>&1 || inner_fail "no answer after the watchdog restart"
ok "watchdog: SIGSTOPped pid $MP killed and restarted as $MP2 (NRestarts $nr), serving again"

# stop: clean exit; start directly (readiness), stop both
IN systemctl stop kvd.service || inner_fail "systemctl stop kvd.service"
[ "$(IN systemctl is-active kvd.service)" = inactive ] || inner_fail "kvd.service still active after stop"
res=$(IN systemctl show -p Result --value kvd.service)
[ "$res" = success ] || inner_fail "stop result '$res'"
IN grep -q "stopped" /run/stage/kvd.log || inner_fail "kvd did not log a clean stop"
IN systemctl start kvd.service || inner_fail "systemctl start kvd.service"
[ "$(IN systemctl is-active kvd.service)" = active ] || inner_fail "not active right after systemctl start (Type=notify)"
IN /run/stage/bin/kvd_raw -s /run/kvd/kvd.sock hello >/dev/null 2>&1 || inner_fail "not serving right after systemctl start"
IN systemctl stop kvd.service kvd.socket || inner_fail "systemctl stop kvd.service kvd.socket"
IN test -e /run/kvd/kvd.sock && inner_fail "socket file left after stopping kvd.socket"
ok "systemctl stop: result success, clean exit; systemctl start ready on return; socket removed on stop"
exit 0
