#!/usr/bin/env bash
# t_session_close.sh — a session closed during its running turn ends that
# turn with a message, not the Ctrl-C exit status.
#
# On the default model, a session's turn generating up to 4000 tokens is
# running (its first text has arrived) when `kvctl session close` closes the
# session from another kvctl. The turn's kvctl must exit 4 (a request kvd
# refused: here, its session went away), not 130 (interrupted with Ctrl-C),
# and say on stderr that the session was closed during the turn.
source "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || skip "$KVCTL not built"
[ -f "$REAL_MODEL" ] || skip "$REAL_MODEL not present (scripts/setup)"

S=$T/kvd.sock
start_kvd kvd "$S" --model "$REAL_MODEL" --threads 1
export KVD_SOCKET=$S

sid=$("$KVCTL" session open) || fail "session open"
"$KVCTL" generate --session "$sid" --temperature 1.5 --seed 7 --max-tokens 4000 \
	"Write a very long story about a lighthouse keeper." >"$T/turn.out" 2>"$T/turn.err" &
GEN=$!
PIDS+=("$GEN")
for i in $(seq 1 600); do
	[ -s "$T/turn.out" ] && break
	kill -0 "$GEN" 2>/dev/null || break
	sleep 0.05
done
[ -s "$T/turn.out" ] || fail "the turn produced no text ($(cat "$T/turn.err"))"
kill -0 "$GEN" 2>/dev/null || fail "the turn ended before the session could be closed"
"$KVCTL" session close "$sid" || fail "session close"
wait "$GEN"
rc=$?
[ "$rc" != 130 ] || fail "the turn's kvctl exited 130, the Ctrl-C status ($(cat "$T/turn.err"))"
[ "$rc" = 4 ] || fail "the turn's kvctl exited $rc, want 4 ($(cat "$T/turn.err"))"
grep -q "session $sid was closed during this turn" "$T/turn.err" ||
	fail "no message saying why the turn ended: $(cat "$T/turn.err")"
ok "a turn whose session is closed ends with exit 4: $(tr '\n' ' ' <"$T/turn.err")"
