# tests/integration/lib_systemd.sh — a real systemd for a test (sourced after
# lib.sh).
#
# systemd runs as PID 1 of private namespaces (pid, mount, cgroup, uts, ipc,
# net; loopback up) with tmpfs over /run, the unit directories, /var/lib,
# /tmp and /var/tmp, and a copy of the host's user database with the kvd
# user from systemd/kvd.sysusers, so nothing on the host changes (recipe:
# machine-facts.md). A test:
#
#   sysd_require NAME          root, the tools, a cgroup v2 child (or skip 77)
#   sysd_stage UNIT...         $ST: the shipped units named, the basic targets,
#                              kvd-test.target, users ($KUID: kvd's uid);
#                              the test then adds binaries, configs, drop-ins
#   sysd_dropin UNIT EXEC LOG [LINE...]
#                              ExecStart= and stderr of UNIT pointed at files
#                              under /run/stage, plus extra [Service] lines
#   sysd_boot SECONDS          boot it ($SYSD: its pid) under a time limit;
#                              IN CMD... runs CMD inside
# Teardown (kill, cgroups removed, lib.sh's cleanup) runs on exit.

SYSTEMD=/lib/systemd/systemd

sysd_require() { # name
	[ "$(id -u)" = 0 ] || skip "needs root"
	local c d
	for c in unshare nsenter timeout systemd-sysusers; do command -v $c >/dev/null || skip "$c missing"; done
	[ -x "$SYSTEMD" ] || skip "$SYSTEMD missing"
	CG=
	for d in /sys/fs/cgroup/unified /sys/fs/cgroup; do
		[ "$(stat -f -c %T "$d" 2>/dev/null)" = cgroup2fs ] && { CG=$d; break; }
	done
	[ -n "$CG" ] || skip "no cgroup v2 hierarchy"
	CGN=$CG/$1-$$
	mkdir "$CGN" 2>/dev/null || skip "cannot create a cgroup under $CG"
	trap sysd_teardown EXIT
}

sysd_stage() { # unit files under systemd/
	local u f
	ST=$T/stage
	mkdir -p "$ST/bin" "$ST/units" "$ST/etcroot/etc"
	chmod 755 "$ST" "$ST/bin"
	for u in "$@"; do cp "systemd/$u" "$ST/units/"; done
	cp /usr/lib/systemd/system/*.target /usr/lib/systemd/system/*.slice "$ST/units/" 2>/dev/null
	printf '[Unit]\nDescription=kvd integration test\n' >"$ST/units/kvd-test.target"
	for f in passwd group shadow gshadow; do [ -r /etc/$f ] && cp /etc/$f "$ST/etcroot/etc/"; done
	systemd-sysusers --root="$ST/etcroot" "$ROOT/systemd/kvd.sysusers" >"$T/sysusers.out" 2>&1 ||
		skip "systemd-sysusers: $(cat "$T/sysusers.out")"
	KUID=$(awk -F: '$1 == "kvd" { print $3 }' "$ST/etcroot/etc/passwd")
	[ -n "$KUID" ] || fail "sysusers made no kvd user"
	touch "$T/console.log"
}

sysd_dropin() { # unit exec log [extra [Service] lines...]
	local unit=$1 exec=$2 log=$3 l
	shift 3
	mkdir -p "$ST/units/$unit.d"
	{
		printf '[Service]\nExecStart=\nExecStart=%s\nStandardError=append:/run/stage/%s\n' "$exec" "$log"
		for l in "$@"; do printf '%s\n' "$l"; done
	} >"$ST/units/$unit.d/test.conf"
	touch "$ST/$log"
	chmod 666 "$ST/$log"
}

# PID 1 of the test namespaces: make a private world, then become systemd.
sysd_inner() {
	cat >"$ST/inner.sh" <<'INNER'
#!/bin/bash
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
}

sysd_teardown() {
	[ -n "${SYSD:-}" ] && kill -9 "$SYSD" 2>/dev/null
	[ -n "${OUTER:-}" ] && { kill -9 "$OUTER" 2>/dev/null; wait "$OUTER" 2>/dev/null; }
	local i
	if [ -n "${CGN:-}" ] && [ -d "$CGN" ]; then
		for i in $(seq 1 50); do
			[ -z "$(find "$CGN" -name cgroup.procs -exec cat {} + 2>/dev/null)" ] && break
			sleep 0.1
		done
		find "$CGN" -depth -type d -exec rmdir {} + 2>/dev/null
		[ -d "$CGN" ] && echo "note: could not remove $CGN" >&2
	fi
	cleanup
}

IN() { nsenter -t "$SYSD" -m -p -u -i -n -C "$@"; }

sysd_boot() { # time limit in seconds
	local i U st
	sysd_inner
	( echo "$BASHPID" >"$CGN/cgroup.procs" &&
	  exec timeout -k 5 "$1" unshare --pid --fork --kill-child --mount --mount-proc --cgroup --uts --ipc --net \
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
	for i in $(seq 1 100); do
		st=$(IN systemctl is-system-running 2>/dev/null)
		case "$st" in running|degraded) break ;; esac
		sleep 0.1
	done
	case "$st" in running|degraded) ;; *) fail "systemd in the namespace is '$st': $(tail -20 "$T/console.log")" ;; esac
	ok "systemd booted as PID 1 of private namespaces ($st)"
}
