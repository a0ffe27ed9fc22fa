#!/usr/bin/env bash
# t_http_systemctl.sh — kvd-http under a real systemd, with the shipped units.
#
# systemd runs as PID 1 of private namespaces (pid, mount, cgroup, uts, ipc,
# net; loopback brought up) with tmpfs over /run, the unit directories,
# /var/lib, /tmp and /var/tmp, so nothing on the host changes (recipe:
# machine-facts.md, as in t_systemctl.sh). The units are kvd-http.socket,
# kvd-http.service, kvd.socket and kvd.service as shipped, plus drop-ins that
# point ExecStart at the built binaries and test configs (tiny model) and
# send stderr to files. The kvd user and group come from systemd/kvd.sysusers.
#
# Checked: `systemctl start kvd-http.socket` listens on 127.0.0.1:8484 without
# starting the service; the first HTTP connection starts kvd-http.service
# (socket activation, Type=notify), which runs as a dynamic unprivileged user
# with supplementary group kvd, no capabilities, NoNewPrivs; a completion
# through it starts kvd through kvd.socket and answers; systemctl stop
# kvd-http.service ends it cleanly. Skips (77) where namespaces or cgroups
# are refused.
source "$(dirname "$0")/lib.sh"
need_bins
HTTPD=$ROOT/$BUILD/bin/kvd-http
[ -x "$HTTPD" ] || skip "$HTTPD not built"
command -v curl >/dev/null || skip "curl not installed"
[ "$(id -u)" = 0 ] || skip "needs root"
SYSTEMD=/lib/systemd/systemd
for c in unshare nsenter timeout systemd-sysusers; do command -v $c >/dev/null || skip "$c missing"; done
[ -x "$SYSTEMD" ] || skip "$SYSTEMD missing"
CG=
for d in /sys/fs/cgroup/unified /sys/fs/cgroup; do
	[ "$(stat -f -c %T "$d" 2>/dev/null)" = cgroup2fs ] && { CG=$d; break; }
done
[ -n "$CG" ] || skip "no cgroup v2 hierarchy"
CGN=$CG/kvd-http-test-$$
mkdir "$CGN" 2>/dev/null || skip "cannot create a cgroup under $CG"
TINY=$(tiny_model gqa)

# ---- stage: everything the inner world needs, copied into its /run ----------
ST=$T/stage
mkdir -p "$ST/bin" "$ST/units" "$ST/etcroot/etc"
chmod 755 "$ST" "$ST/bin"
cp "$KVD" "$RAW" "$HTTPD" "$ST/bin/"
cp "$TINY" "$ST/model.gguf"
chmod 644 "$ST/model.gguf"
cp systemd/kvd.service systemd/kvd.socket systemd/kvd-http.service systemd/kvd-http.socket "$ST/units/"
cp /usr/lib/systemd/system/*.target /usr/lib/systemd/system/*.slice "$ST/units/" 2>/dev/null
cat >"$ST/units/kvd-test.target" <<'UNIT'
[Unit]
Description=kvd integration test
UNIT
mkdir -p "$ST/units/kvd.service.d"
cat >"$ST/units/kvd.service.d/test.conf" <<'UNIT'
[Service]
ExecStart=
ExecStart=/run/stage/bin/kvd --config /run/stage/kvd.conf
StandardError=append:/run/stage/kvd.log
UNIT
mkdir -p "$ST/units/kvd-http.service.d"
cat >"$ST/units/kvd-http.service.d/test.conf" <<'UNIT'
[Service]
ExecStart=
ExecStart=/run/stage/bin/kvd-http --config /run/stage/kvd-http.conf
StandardError=append:/run/stage/kvd-http.log
UNIT
cp etc/kvd-http.conf "$ST/kvd-http.conf"
chmod 644 "$ST/kvd-http.conf"
printf '[model]\npath = /run/stage/model.gguf\n[kv]\npool_size = 4M\n[engine]\nthreads = 2\n' >"$ST/kvd.conf"
chmod 644 "$ST/kvd.conf"
for f in passwd group shadow gshadow; do [ -r /etc/$f ] && cp /etc/$f "$ST/etcroot/etc/"; done
systemd-sysusers --root="$ST/etcroot" "$ROOT/systemd/kvd.sysusers" >"$T/sysusers.out" 2>&1 ||
	{ rmdir "$CGN"; skip "systemd-sysusers: $(cat "$T/sysusers.out")"; }
KUID=$(awk -F: '$1 == "kvd" { print $3 }' "$ST/etcroot/etc/passwd")
[ -n "$KUID" ] || fail "sysusers made no kvd user"
touch "$T/console.log" "$ST/kvd-http.log" "$ST/kvd.log"
chmod 666 "$ST/kvd-http.log" "$ST/kvd.log"

cat >"$ST/inner.sh" <<'INNER'
#!/bin/bash
# PID 1 of the test namespaces: make a private world, then become systemd.
set -e
ST=$1 CONSOLE=$2
mount --make-rprivate /
ip link set lo up 2>/dev/null || true
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount --bind "$CONSOLE" /dev/console
mount -t tmpfs -o mode=755 tmpfs /run
cp -a "$ST" /run/stage
mount --bind /run/stage/etcroot/etc/passwd /etc/passwd
mount --bind /run/stage/etcroot/etc/group /etc/group
mount -t tmpfs -o mode=755 tmpfs /etc/systemd/system
mount -t tmpfs -o mode=755 tmpfs /usr/lib/systemd/system
cp -a /run/stage/units/. /usr/lib/systemd/system/
mount -t tmpfs -o mode=755 tmpfs /usr/lib/systemd/system-generators
mount -t tmpfs -o mode=755 tmpfs /var/lib
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /var/tmp
export container=kvd-test
exec /lib/systemd/systemd --system --unit=kvd-test.target --log-target=console --log-level=info
INNER
chmod 755 "$ST/inner.sh"

teardown() {
	[ -n "${SYSD:-}" ] && kill -9 "$SYSD" 2>/dev/null
	[ -n "${OUTER:-}" ] && { kill -9 "$OUTER" 2>/dev/null; wait "$OUTER" 2>/dev/null; }
	local i
	for i in $(seq 1 50); do
		[ -z "$(find "$CGN" -name cgroup.procs -exec cat {} + 2>/dev/null)" ] && break
		sleep 0.1
	done
	find "$CGN" -depth -type d -exec rmdir {} + 2>/dev/null
	[ -d "$CGN" ] && echo "note: could not remove $CGN" >&2
	cleanup
}
trap teardown EXIT

( echo "$BASHPID" >"$CGN/cgroup.procs" &&
  exec timeout -k 5 150 unshare --pid --fork --kill-child --mount --mount-proc --cgroup --uts --ipc --net \
	"$ST/inner.sh" "$ST" "$T/console.log" ) >"$T/unshare.log" 2>&1 &
OUTER=$!
# timeout -> unshare -> systemd (PID 1 inside)
SYSD=
for i in $(seq 1 100); do
	U=$(pgrep -P "$OUTER" -x unshare 2>/dev/null | head -1)
	[ -n "$U" ] && SYSD=$(pgrep -P "$U" 2>/dev/null | head -1)
	[ -n "$SYSD" ] && grep -qa systemd "/proc/$SYSD/cmdline" 2>/dev/null && break
	SYSD=
	kill -0 "$OUTER" 2>/dev/null || break
	sleep 0.1
done
if [ -z "$SYSD" ]; then
	grep -Eqi "operation not permitted|permission denied|cannot|failed" "$T/unshare.log" &&
		skip "namespaces not permitted here: $(head -3 "$T/unshare.log")"
	fail "systemd did not start: $(cat "$T/unshare.log") $(tail -20 "$T/console.log")"
fi
IN() { nsenter -t "$SYSD" -m -p -u -i -n -C "$@"; }
for i in $(seq 1 100); do
	st=$(IN systemctl is-system-running 2>/dev/null)
	case "$st" in running|degraded) break ;; esac
	sleep 0.1
done
case "$st" in running|degraded) ;; *) fail "systemd in the namespace is '$st': $(tail -20 "$T/console.log")" ;; esac
ok "systemd booted as PID 1 of private namespaces ($st)"

inner_fail() { IN cat /run/stage/kvd.log >"$T/kvd.log" 2>/dev/null; IN cat /run/stage/kvd-http.log >"$T/kvd-http.log" 2>/dev/null
	IN systemctl status kvd-http.service kvd-http.socket kvd.service --no-pager >"$T/status.log" 2>&1; cp "$T/console.log" "$T/console-tail.log"; fail "$@"; }


IN ip link set lo up 2>/dev/null
IN systemctl start kvd.socket kvd-http.socket || inner_fail "systemctl start kvd.socket kvd-http.socket"
[ "$(IN systemctl is-active kvd-http.service)" = inactive ] || inner_fail "kvd-http.service active before any connection"
IN curl -s -o "$T/health.out" -w '%{http_code}' --max-time 30 http://127.0.0.1:8484/health >"$T/health.code" 2>&1
[ "$(IN systemctl is-active kvd-http.service)" = active ] || inner_fail "kvd-http.service not active after the first connection"
[ "$(cat "$T/health.code")" = 200 ] || inner_fail "/health: $(cat "$T/health.code") $(cat "$T/health.out")"
[ "$(IN systemctl is-active kvd.service)" = active ] || inner_fail "kvd.service not started through kvd.socket"
ok "kvd-http.socket on 127.0.0.1:8484 started kvd-http.service on the first connection; /health 200 (kvd started through kvd.socket)"

MP=$(IN systemctl show -p MainPID --value kvd-http.service)
[ "${MP:-0}" -gt 0 ] || inner_fail "no MainPID"
HUID=$(IN awk '/^Uid:/ { print $2 }' /proc/"$MP"/status)
[ "${HUID:-0}" -gt 0 ] || inner_fail "kvd-http runs as root"
KGID=$(awk -F: '$1 == "kvd" { print $3 }' "$ST/etcroot/etc/group")
IN grep -Eq "^Groups:.*\b$KGID\b" /proc/"$MP"/status || inner_fail "kvd-http lacks group kvd ($KGID): $(IN grep ^Groups: /proc/"$MP"/status)"
IN grep -q "^NoNewPrivs:[[:space:]]*1" /proc/"$MP"/status || inner_fail "NoNewPrivs not set"
IN grep -q "^CapEff:[[:space:]]*0000000000000000" /proc/"$MP"/status || inner_fail "kvd-http has capabilities"
IN nsenter -t "$MP" -m test -w /usr && inner_fail "/usr is writable in the service"
ok "kvd-http runs as dynamic uid $HUID with group kvd ($KGID), NoNewPrivs, no capabilities, /usr read-only"

IN curl -sf --max-time 60 http://127.0.0.1:8484/v1/completions -d '{"prompt":"hello from systemd","max_tokens":8,"temperature":0}' \
	>"$T/compl.json" 2>&1 || inner_fail "completion through kvd-http: $(cat "$T/compl.json")"
$PY -c 'import json,sys; d = json.load(open(sys.argv[1])); assert d["usage"]["completion_tokens"] >= 1, d' "$T/compl.json" ||
	inner_fail "completion: $(cat "$T/compl.json")"
status=$(IN systemctl show -p StatusText --value kvd-http.service)
[ "$status" = serving ] || inner_fail "StatusText '$status'"
ok "a completion through kvd-http.service -> /run/kvd/kvd.sock -> kvd.service; StatusText: $status"

IN systemctl stop kvd-http.service kvd-http.socket || inner_fail "systemctl stop kvd-http.service kvd-http.socket"
res=$(IN systemctl show -p Result --value kvd-http.service)
[ "$res" = success ] || inner_fail "stop result '$res'"
IN grep -q "stopping" /run/stage/kvd-http.log || inner_fail "kvd-http did not log a clean stop"
IN curl -s --max-time 5 http://127.0.0.1:8484/health >/dev/null 2>&1 && inner_fail "port 8484 still answers after stopping kvd-http.socket"
ok "systemctl stop kvd-http.service kvd-http.socket: result success, the port is closed"
exit 0
