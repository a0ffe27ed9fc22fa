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
# test-run: alone (a real systemd as PID 1 of private namespaces)
source "$(dirname "$0")/lib.sh"
need_bins
HTTPD=$ROOT/$BUILD/bin/kvd-http
[ -x "$HTTPD" ] || skip "$HTTPD not built"
command -v curl >/dev/null || skip "curl not installed"
source "$(dirname "$0")/lib_systemd.sh"
sysd_require kvd-http-test
TINY=$(tiny_model gqa)

# ---- stage: everything the inner world needs, copied into its /run ----------
sysd_stage kvd.service kvd.socket kvd-http.service kvd-http.socket
cp "$KVD" "$RAW" "$HTTPD" "$ST/bin/"
cp "$TINY" "$ST/model.gguf"
chmod 644 "$ST/model.gguf"
sysd_dropin kvd.service "/run/stage/bin/kvd --config /run/stage/kvd.conf" kvd.log
sysd_dropin kvd-http.service "/run/stage/bin/kvd-http --config /run/stage/kvd-http.conf" kvd-http.log
cp etc/kvd-http.conf "$ST/kvd-http.conf"
chmod 644 "$ST/kvd-http.conf"
printf '[model]\npath = /run/stage/model.gguf\n[kv]\npool_size = 4M\n[engine]\nthreads = 2\n' >"$ST/kvd.conf"
chmod 644 "$ST/kvd.conf"
sysd_boot 150

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
