# tests/integration/lib.sh — helpers shared by the integration tests (sourced).
#
# Every test gets a private temporary directory ($T), removed on exit with
# every daemon the test started (by pid). Exit 77 means "skipped".

set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
BUILD=${KVD_BUILD:-build}
KVD=$ROOT/$BUILD/bin/kvd
KVCTL=$ROOT/$BUILD/bin/kvctl
RAW=${KVD_RAW:-$ROOT/$BUILD/tests/kvd_raw}
REAL_MODEL=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
TINY_DIR=$ROOT/$BUILD/tests/tiny-models
PY=python3

T=$(mktemp -d /tmp/kvd-test.XXXXXX)
chmod 755 "$T"
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
	if [ "${KEEP_TMP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; for l in "$T"/*.log; do [ -f "$l" ] && { echo "--- $l" >&2; tail -n 30 "$l" >&2; }; done; exit 1; }
ok() { echo "ok: $*"; }
skip() { echo "SKIP: $*"; exit 77; }

need_bins() {
	[ -x "$KVD" ] || skip "$KVD not built"
	[ -x "$RAW" ] || skip "$RAW not built"
}

# tiny random-weight models (scripts/gen_tiny_models.py; rewritten only when changed)
tiny_model() { # NAME -> path
	local py=$ROOT/.venv/bin/python
	[ -x "$py" ] || py=/usr/bin/python3
	if [ ! -f "$TINY_DIR/tiny-$1.gguf" ]; then
		mkdir -p "$TINY_DIR"
		"$py" "$ROOT/scripts/gen_tiny_models.py" "$TINY_DIR" >/dev/null 2>&1 || skip "cannot generate tiny models"
	fi
	echo "$TINY_DIR/tiny-$1.gguf"
}

# start_kvd NAME SOCKET ARGS... : kvd in the background, log in $T/NAME.log,
# pid in KVD_PID; returns once it answers a HELLO (60 s at most).
start_kvd() {
	local name=$1 sock=$2; shift 2
	"$KVD" --config /dev/null --socket "$sock" "$@" 2>"$T/$name.log" &
	KVD_PID=$!
	PIDS+=("$KVD_PID")
	local i
	for i in $(seq 1 600); do
		kill -0 "$KVD_PID" 2>/dev/null || fail "kvd ($name) exited during start-up"
		"$RAW" -s "$sock" hello >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	fail "kvd ($name) not ready after 60 s"
}

stop_kvd() { # PID: SIGTERM and wait; returns kvd's exit status
	kill -TERM "$1" 2>/dev/null
	wait "$1"
}

# stats SOCKET KEY: one integer from the STATS reply
stat_of() {
	"$RAW" -s "$1" stats | $PY -c "import json,sys; print(json.load(sys.stdin)['$2'])"
}

# wait_stat SOCKET KEY VALUE [SECONDS]: until KEY == VALUE
wait_stat() {
	local i v n=$(( ${4:-5} * 10 ))
	for i in $(seq 1 $n); do
		v=$(stat_of "$1" "$2")
		[ "$v" = "$3" ] && return 0
		sleep 0.1
	done
	echo "$2 is $v, expected $3" >&2
	return 1
}

# free_port: a TCP port on 127.0.0.1 that nothing listens on now
free_port() {
	$PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_http NAME ARGS...: kvd-http ($HTTPD, run through the optional array
# HTTP_AS, e.g. setpriv) on a free port with ARGS, log in $T/NAME.log; sets
# PORT, B (its base URL) and HTTP_PID, and returns once /health answers 200
# (10 s at most).
start_http() {
	local name=$1 i; shift
	PORT=$(free_port)
	B=http://127.0.0.1:$PORT
	${HTTP_AS[@]+"${HTTP_AS[@]}"} "$HTTPD" --listen "127.0.0.1:$PORT" "$@" 2>"$T/$name.log" &
	HTTP_PID=$!
	PIDS+=("$HTTP_PID")
	for i in $(seq 1 100); do
		[ "$(curl -s -o /dev/null -w '%{http_code}' "$B/health")" = 200 ] && return 0
		kill -0 "$HTTP_PID" 2>/dev/null || fail "kvd-http ($name) exited during start-up"
		sleep 0.1
	done
	fail "kvd-http ($name) not healthy at $B after 10 s"
}
