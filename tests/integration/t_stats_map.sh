#!/usr/bin/env bash
# t_stats_map.sh — kvctl stats --map on a daemon in a known state.
#
# A tiny pool with a swap file: a long prompt fills the pool so the
# scheduler demotes cached prefix pages to swap (swapped cells), three
# sessions hold the same prompt (their common pages are shared by 3 and each
# keeps private pages of its own), a finished prompt leaves cached pages.
# Then, from the map printed in a pipe:
#   - the cells of each kind (free, private, shared, cached; swapped and
#     demoted in the swap file) count exactly what kvctl stats --json says,
#     and what the legend says, and every kind is there;
#   - the pages shared by all three sessions show the digit 3, as many as the
#     third session's cached tokens fill pages (its DONE, not the map, says);
#   - rows are as wide as $COLUMNS (10 here: the pool takes 3 rows); no
#     escape code in a pipe or with NO_COLOR on a terminal; colour on a
#     terminal and with --color always;
#   - --watch redraws until SIGINT, and exits 0.
source "$(dirname "$0")/lib.sh"
need_bins
[ -f "$REAL_MODEL" ] || skip "$REAL_MODEL missing (run scripts/setup)"
S=$T/kvd.sock
start_kvd map "$S" --model "$REAL_MODEL" --pool-size 9M --swap-file "$T/swap" --swap-size 4M --threads 2
K=("$KVCTL" --socket "$S")

long=$($PY -c "print(' '.join('word%d is here and there' % i for i in range(45)))")
"${K[@]}" generate --json --temperature 0 --max-tokens 30 "$long" >"$T/long.json" || fail "the long prompt"
P="The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill, thinking about dinner and the long afternoon ahead of it."
for s in a b c; do
	id=$("${K[@]}" session open) || fail "session open"
	"${K[@]}" generate --json --temperature 0 --max-tokens 4 --session "$id" "$P" >"$T/sess_$s.json" ||
		fail "session turn $s"
done
"${K[@]}" generate --json --temperature 0 --max-tokens 4 "Tell me about elephants and their memory." >/dev/null ||
	fail "the finished prompt"

COLUMNS=10 "${K[@]}" stats --map >"$T/map.txt" || fail "stats --map: $(cat "$T/map.txt")"
"${K[@]}" stats --json >"$T/stats.json" || fail "stats --json"
cat "$T/map.txt"
$PY - "$T/map.txt" "$T/stats.json" "$T/sess_c.json" <<'PYEOF' || fail "the map does not match the stats"
import json, re, sys
text = open(sys.argv[1]).read()
st = json.load(open(sys.argv[2]))
sess_c = json.load(open(sys.argv[3]))
assert "\x1b" not in text, "escape codes in a pipe"
lines = text.split("\n")

def grid_after(prefix):
    i = next(k for k, l in enumerate(lines) if l.startswith(prefix)) + 1
    rows = []
    while not lines[i].startswith("  "):
        rows.append(lines[i]); i += 1
    legend = []
    while i < len(lines) and lines[i].startswith("  "):
        legend.append(lines[i]); i += 1
    return rows, " ".join(legend)

def legend_count(legend, name):
    m = re.search(r"\S+ " + re.escape(name) + r" (\d+)", legend)
    assert m, (name, legend)
    return int(m.group(1))

rows, legend = grid_after("requests:")
assert all(len(r) == 10 for r in rows[:-1]) and 0 < len(rows[-1]) <= 10 and len(rows) > 1, rows
cells = "".join(rows)
n = {k: 0 for k in ("free", "private", "shared", "cached")}
digits = {}
for ch in cells:
    if ch == ".": n["free"] += 1
    elif ch == "o": n["private"] += 1
    elif ch == "c": n["cached"] += 1
    elif ch in "23456789+":
        n["shared"] += 1; digits[ch] = digits.get(ch, 0) + 1
    else: raise AssertionError("unknown cell %r" % ch)
assert len(cells) == st["pages_total"], (len(cells), st["pages_total"])
assert n["free"] == st["pages_free"], (n, st)
assert n["private"] + n["shared"] == st["pages_used"], (n, st)
assert n["shared"] == st["pages_shared"], (n, st)
assert n["cached"] == st["pages_cached"], (n, st)
for k in n:
    assert legend_count(legend, k) == n[k], (k, legend, n)
# the three sessions share the pages of their common prompt: refcount 3
assert sess_c["cached_tokens"] >= 16, sess_c
assert digits.get("3", 0) == sess_c["cached_tokens"] // st["block_size"], (digits, sess_c)

srows, slegend = grid_after("swap file:")
scells = "".join(srows)
assert all(len(r) == 10 for r in srows[:-1]), srows
assert len(scells) == st["swap_bytes"] // st["page_bytes"], (len(scells), st)
sw, dm, fr = scells.count("s"), scells.count("d"), scells.count("_")
assert sw + dm + fr == len(scells), scells
assert sw + dm == st["pages_swapped"] and dm == st["pages_demoted"], (sw, dm, st)
assert legend_count(slegend, "swapped") == sw and legend_count(slegend, "free") == fr, slegend
assert "demoted (cached prefix in swap) %d" % dm in slegend, slegend
# every kind of cell is in the picture, so no equality above is 0 == 0
assert n["free"] and n["private"] and n["shared"] and n["cached"] and dm, (n, dm)
print("cells: %s; swap: %d swapped, %d demoted, %d free; shared digits %s" % (n, sw, dm, fr, digits))
PYEOF
ok "every cell kind counts what stats says (free, private, shared by 3 sessions, cached, demoted to swap)"

# colour: never in a pipe (above), always with --color always, on a terminal
# unless NO_COLOR is set
"${K[@]}" stats --map --color always >"$T/color.txt" || fail "--color always"
grep -q $'\x1b\[' "$T/color.txt" || fail "--color always printed no escape codes"
"${K[@]}" stats --map --color never >"$T/never.txt" || fail "--color never"
! grep -q $'\x1b' "$T/never.txt" || fail "--color never printed escape codes"
if command -v script >/dev/null; then
	script -qec "$KVCTL --socket $S stats --map" /dev/null >"$T/tty.txt" </dev/null || fail "stats --map on a pty"
	grep -q $'\x1b\[' "$T/tty.txt" || fail "no colour on a terminal"
	NO_COLOR=1 script -qec "$KVCTL --socket $S stats --map" /dev/null >"$T/tty_nc.txt" </dev/null ||
		fail "stats --map on a pty with NO_COLOR"
	! grep -q $'\x1b\[[0-9;]*m' "$T/tty_nc.txt" || fail "colour on a terminal despite NO_COLOR"
	ok "colour on a terminal, none with NO_COLOR, none in a pipe, always with --color always"
else
	echo "skipped: the terminal colour check (no script(1) to give kvctl a pty)"
fi

# --watch: frames until SIGINT, then exit 0
timeout --preserve-status -s INT 2.5 "${K[@]}" stats --map --watch 0.5 >"$T/watch.txt"
rc=$?
[ "$rc" = 0 ] || fail "stats --map --watch exited $rc after SIGINT"
frames=$(grep -c '^KV pool:' "$T/watch.txt")
[ "$frames" -ge 2 ] || fail "--watch drew $frames frames in 2.5 s"
ok "--watch drew $frames frames and stopped on SIGINT with status 0"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
