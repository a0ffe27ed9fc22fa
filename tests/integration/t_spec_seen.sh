#!/usr/bin/env bash
# t_spec_seen.sh — speculative decoding seen and chosen, on one daemon
# under [speculative] mode = auto with the default model:
#   - kvctl generate --json reports spec_drafted_tokens and
#     spec_accepted_tokens; the ledger record (kvctl ledger --json) holds the
#     same two numbers; STATS' spec_* counters are their sums over the
#     requests, the acceptance histogram's buckets sum to the verify steps,
#     and --prometheus' kvd_spec_accepted_run_tokens histogram agrees;
#   - --no-speculate gives the same bytes with nothing drafted (the plain
#     path), greedy and seeded;
#   - requests that are not drafted for (a constraint, log-probabilities,
#     a sliding-window or sinks policy) give the bytes of the plain path
#     and report nothing drafted;
#   - a user that is not an administrator sees only its own uid's counters.
source "$(dirname "$0")/lib.sh"
need_bins
[ -x "$KVCTL" ] || skip "$KVCTL not built"
[ -f "$REAL_MODEL" ] || skip "no default model at $REAL_MODEL (scripts/setup)"

S=$T/kvd.sock
DOC="The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a lantern and a small \
notebook in which he recorded the color of the sea, the direction of the wind, and the names of the ships that passed."
QUOTE="Repeat the following paragraph exactly, word for word: $DOC"

printf '[server]\nsocket_mode = 0666\n' >"$T/kvd.conf"
start_kvd seen "$S" --config "$T/kvd.conf" --model "$REAL_MODEL" --pool-size 64M --threads 2 --speculative auto \
	--ledger "$T/ledger"

gen() { # OUT ARGS...: kvctl generate --json, exit status checked
	local out=$1
	shift
	"$KVCTL" --socket "$S" generate --json "$@" >"$T/$out.json" 2>"$T/$out.err" ||
		fail "$out: kvctl generate failed: $(cat "$T/$out.err")"
}
field() { # OUT KEY: one member of a --json result
	$PY -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$T/$1.json" "$2"
}
same_text() { # A B: the same generated text
	$PY - "$T/$1.json" "$T/$2.json" <<'EOF' || fail "$1 and $2 differ"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["text"] == b["text"] and a.get("token_ids") == b.get("token_ids"), (a["text"][:200], b["text"][:200])
EOF
}

# ---- drafted and accepted, per request and in total ----
gen g --temperature 0 --max-tokens 80 "$QUOTE"
gen gp --temperature 0 --max-tokens 80 --no-speculate "$QUOTE"
gen s --temperature 0.8 --seed 7 --max-tokens 64 "$QUOTE"
gen sp --temperature 0.8 --seed 7 --max-tokens 64 --no-speculate "$QUOTE"
same_text g gp
same_text s sp
d=$(field g spec_drafted_tokens); a=$(field g spec_accepted_tokens)
[ "$d" -gt 0 ] && [ "$a" -gt 0 ] && [ "$a" -le "$d" ] || fail "greedy quote: drafted $d, accepted $a"
for o in gp sp; do
	[ "$(field $o spec_drafted_tokens)" = 0 ] || fail "--no-speculate ($o) drafted $(field $o spec_drafted_tokens) tokens"
done
ok "generate --json: greedy quote drafted $d, accepted $a; --no-speculate: the same bytes, nothing drafted (greedy, seeded)"

# ---- requests speculation skips: the plain path's bytes, nothing drafted ----
gen c --temperature 0 --max-tokens 24 --regex '[A-Za-z ,.]{10,60}' "$QUOTE"
gen cp --temperature 0 --max-tokens 24 --regex '[A-Za-z ,.]{10,60}' --no-speculate "$QUOTE"
gen l --temperature 0 --max-tokens 40 --logprobs 2 "$QUOTE"
gen lp --temperature 0 --max-tokens 40 --logprobs 2 --no-speculate "$QUOTE"
gen w --temperature 0 --max-tokens 60 --context-policy sliding-window --window 64 "$QUOTE"
gen wp --temperature 0 --max-tokens 60 --context-policy sliding-window --window 64 --no-speculate "$QUOTE"
gen k --temperature 0 --max-tokens 60 --context-policy sinks --window 64 "$QUOTE"
gen kp --temperature 0 --max-tokens 60 --context-policy sinks --window 64 --no-speculate "$QUOTE"
for x in c l w k; do
	same_text $x ${x}p
	[ "$(field $x spec_drafted_tokens)" = 0 ] || fail "$x: drafted $(field $x spec_drafted_tokens) (not drafted for, in this version)"
done
ok "constraint, logprobs, sliding-window, sinks: the plain path's bytes, speculation skipped (nothing drafted)"

# ---- the ledger and STATS agree with the requests ----
"$KVCTL" --socket "$S" ledger --json >"$T/led.json" || fail "kvctl ledger --json failed"
"$KVCTL" --socket "$S" stats --json >"$T/stats.json" || fail "kvctl stats --json failed"
"$KVCTL" --socket "$S" stats --prometheus >"$T/prom.txt" || fail "kvctl stats --prometheus failed"
$PY - "$T" <<'EOF' || fail "ledger / stats disagree"
import json, os, sys
t = sys.argv[1]
res = {}
for n in os.listdir(t):
    if n.endswith(".json") and n not in ("led.json", "stats.json"):
        res[n[:-5]] = json.load(open(os.path.join(t, n)))
recs = [json.loads(l) for l in open(os.path.join(t, "led.json")) if l.strip()]
assert len(recs) == len(res), (len(recs), len(res))
got = sorted((r["spec_drafted_tokens"], r["spec_accepted_tokens"], r["generated_tokens"]) for r in recs)
want = sorted((r["spec_drafted_tokens"], r["spec_accepted_tokens"], r["generated_tokens"]) for r in res.values())
assert got == want, (got, want)
st = json.load(open(os.path.join(t, "stats.json")))
assert st["spec_drafted_tokens"] == sum(r[0] for r in got), st
assert st["spec_accepted_tokens"] == sum(r[1] for r in got), st
runs = [st[k] for k in ("spec_runs_0", "spec_runs_1", "spec_runs_2_3", "spec_runs_4_7", "spec_runs_8_16")]
assert sum(runs) == st["spec_verify_steps"] > 0, st
# a verify step accepts at most its draft: the buckets bound the accepted tokens
lo = runs[1] + 2 * runs[2] + 4 * runs[3] + 8 * runs[4]
hi = runs[1] + 3 * runs[2] + 7 * runs[3] + 16 * runs[4]
assert lo <= st["spec_accepted_tokens"] <= hi, (runs, st["spec_accepted_tokens"])
prom = {}
for l in open(os.path.join(t, "prom.txt")):
    if l.startswith("kvd_spec_"):
        k, v = l.rsplit(" ", 1)
        prom[k] = int(float(v))
assert prom["kvd_spec_accepted_run_tokens_count"] == st["spec_verify_steps"], prom
assert prom['kvd_spec_accepted_run_tokens_bucket{le="0"}'] == runs[0], prom
assert prom["kvd_spec_accepted_run_tokens_sum"] == st["spec_accepted_tokens"], prom
assert prom["kvd_spec_drafted_tokens_total"] == st["spec_drafted_tokens"], prom
print("ok: ledger records, stats --json and --prometheus agree: %d drafted, %d accepted in %d verify steps (runs %s)"
      % (st["spec_drafted_tokens"], st["spec_accepted_tokens"], st["spec_verify_steps"], runs))
EOF

# ---- another user sees its own counters only ----
if command -v setpriv >/dev/null && [ "$(id -u)" = 0 ]; then
	AS="setpriv --reuid=65534 --regid=65534 --clear-groups"
	$AS "$KVCTL" --socket "$S" stats --json >"$T/u0.json" 2>"$T/u0.err" || fail "stats as uid 65534: $(cat "$T/u0.err")"
	[ "$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["spec_drafted_tokens"])' "$T/u0.json")" = 0 ] ||
		fail "uid 65534 sees other users' speculation counters"
	$AS "$KVCTL" --socket "$S" generate --json --temperature 0 --max-tokens 48 "$QUOTE" >"$T/u1.out" 2>"$T/u1.err" ||
		fail "generate as uid 65534: $(cat "$T/u1.err")"
	$AS "$KVCTL" --socket "$S" stats --json >"$T/u2.out" || fail "stats as uid 65534"
	$PY - "$T/u1.out" "$T/u2.out" <<'EOF' || fail "uid 65534's counters are not its request's"
import json, sys
r, st = (json.load(open(p)) for p in sys.argv[1:3])
assert st["spec_drafted_tokens"] == r["spec_drafted_tokens"] and st["spec_accepted_tokens"] == r["spec_accepted_tokens"], (r, st)
EOF
	ok "a user that is not an administrator sees only its own requests' speculation counters"
else
	echo "note: not root or no setpriv: the per-user check is left out"
fi
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
