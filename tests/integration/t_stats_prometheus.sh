#!/usr/bin/env bash
# t_stats_prometheus.sh — kvctl stats --prometheus, read by Prometheus' own
# text parser (the prometheus-client package scripts/setup installs) and by
# a strict line check:
#   - every family has # HELP and # TYPE; names and label syntax are valid;
#   - counters end in _total and never go down between two scrapes, with
#     requests run in between; there is no hit-rate gauge, the prefix cache
#     has hit and query counters;
#   - the histograms' buckets are cumulative, le increasing, +Inf equal to
#     _count; time-to-first-token counts one sample per request run and
#     inter-token latency one per token after each request's first (the
#     requests' own DONE records say how many they generated);
#   - a session turn that continues from its kept KV counts as a prefix
#     lookup whose hit is the turn's cached tokens.
source "$(dirname "$0")/lib.sh"
need_bins
[ -f "$REAL_MODEL" ] || skip "$REAL_MODEL missing (run scripts/setup)"
VPY=$ROOT/.venv/bin/python
[ -x "$VPY" ] || VPY=python3
"$VPY" -c 'import prometheus_client' 2>/dev/null ||
	skip "prometheus_client is not installed in .venv (run scripts/setup)"
S=$T/kvd.sock
start_kvd prom "$S" --model "$REAL_MODEL" --pool-size 32M --threads 2
K=("$KVCTL" --socket "$S")

"${K[@]}" stats --prometheus >"$T/scrape0.txt" || fail "stats --prometheus"
: >"$T/runs.jsonl"
for i in 1 2 3; do
	"${K[@]}" generate --json --temperature 0 --max-tokens $((3 * i)) "Count to $i in words." >>"$T/runs.jsonl" ||
		fail "generate $i"
done
sid=$("${K[@]}" session open) || fail "session open"
"${K[@]}" generate --json --temperature 0 --max-tokens 5 --session "$sid" "Name a colour." >>"$T/runs.jsonl" ||
	fail "session turn 1"
"${K[@]}" stats --prometheus >"$T/scrape1.txt" || fail "stats --prometheus"
"${K[@]}" generate --json --temperature 0 --max-tokens 5 --session "$sid" "And another one." >"$T/turn2.json" ||
	fail "session turn 2"
cat "$T/turn2.json" >>"$T/runs.jsonl"
"${K[@]}" stats --prometheus >"$T/scrape2.txt" || fail "stats --prometheus"
grep -E '^kvd_(time_to_first_token|inter_token_latency)_seconds_(count|sum)|^kvd_prefix' "$T/scrape2.txt"

"$VPY" - "$T" <<'PYEOF' || fail "the exposition format"
import json, math, re, sys
from prometheus_client.parser import text_string_to_metric_families

T = sys.argv[1]
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*$")
SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*"(,[a-zA-Z_][a-zA-Z0-9_]*="(\\.|[^"\\])*")*)?\})? (\S+)$')

def strict(text):
    """Every line: HELP, then TYPE, then the family's samples."""
    helped, typed, fam = set(), {}, None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            assert NAME.match(name) and name not in helped, line
            helped.add(name); fam = name
        elif line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ")
            assert name == fam and typ in ("counter", "gauge", "histogram"), line
            typed[name] = typ
        else:
            m = SAMPLE.match(line)
            assert m, "malformed sample line: %r" % line
            name = m.group(1)
            base = fam if typed.get(fam) != "histogram" else re.sub(r"_(bucket|sum|count)$", "", name)
            assert name == fam or (typed.get(fam) == "histogram" and base == fam), (line, fam)
            v = float(m.group(7))
            assert not math.isnan(v), line
    for name, typ in typed.items():
        assert name in helped
        if typ == "counter":
            assert name.endswith("_total"), name
        assert not re.search(r"(^|_)(rate|ratio)(_|$)", name), "a ratio gauge: " + name
    return typed

def parse(path):
    text = open(path).read()
    typed = strict(text)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    vals, hists = {}, {}
    for f in fams.values():
        if f.type == "histogram":
            buckets = [(float(s.labels["le"]), s.value) for s in f.samples if s.name.endswith("_bucket")]
            count = [s.value for s in f.samples if s.name.endswith("_count")][0]
            total = [s.value for s in f.samples if s.name.endswith("_sum")][0]
            les = [b[0] for b in buckets]
            assert les == sorted(les) and len(set(les)) == len(les) and les[-1] == math.inf, les
            cum = [b[1] for b in buckets]
            assert all(a <= b for a, b in zip(cum, cum[1:])), ("not cumulative", f.name, cum)
            assert cum[-1] == count and total >= 0, (f.name, cum, count)
            hists[f.name] = (count, total, buckets)
        else:
            for s in f.samples:
                vals[s.name] = (f.type, s.value)
    return typed, vals, hists

t0, v0, h0 = parse(T + "/scrape0.txt")
t1, v1, h1 = parse(T + "/scrape1.txt")
t2, v2, h2 = parse(T + "/scrape2.txt")
assert t0 == t1 == t2
# counters never decrease
for a, b in ((v0, v1), (v1, v2)):
    for name, (typ, val) in a.items():
        if typ == "counter":
            assert b[name][1] >= val, (name, val, b[name])
for a, b in ((h0, h1), (h1, h2)):
    for name in a:
        assert b[name][0] >= a[name][0] and b[name][1] >= a[name][1], name
        assert all(y[1] >= x[1] for x, y in zip(a[name][2], b[name][2])), name
# the prefix cache: hit and query counters, no rate
for n in ("kvd_prefix_hit_tokens_total", "kvd_prefix_query_tokens_total", "kvd_prefix_lookups_total"):
    assert v2[n][0] == "counter", n
assert not any("hit_rate" in n for n in v2)

runs = [json.loads(l) for l in open(T + "/runs.jsonl")]
assert len(runs) == 5 and all(r["generated_tokens"] >= 1 for r in runs), runs
ttft = "kvd_time_to_first_token_seconds"
itl = "kvd_inter_token_latency_seconds"
assert h2[ttft][0] - h0[ttft][0] == len(runs), (h2[ttft][0], h0[ttft][0], len(runs))
want_itl = sum(r["generated_tokens"] - 1 for r in runs)
assert h2[itl][0] - h0[itl][0] == want_itl, (h2[itl][0], h0[itl][0], want_itl)
assert v2["kvd_requests_completed_total"][1] - v0["kvd_requests_completed_total"][1] == len(runs)
assert v2["kvd_generated_tokens_total"][1] - v0["kvd_generated_tokens_total"][1] == sum(r["generated_tokens"] for r in runs)
# TTFT sum: the requests' own ttft_ms (rounded to µs) add up to the histogram's sum
want = sum(r["ttft_ms"] for r in runs) / 1e3
got = h2[ttft][1] - h0[ttft][1]
assert abs(got - want) < 1e-5 * len(runs) + 1e-9, (got, want)

# the session's second turn: one lookup, its whole context queried, its kept history a hit
turn2 = json.load(open(T + "/turn2.json"))
assert turn2["cached_tokens"] > 0, turn2
d = lambda n: v2[n][1] - v1[n][1]
assert d("kvd_prefix_lookups_total") == 1, d("kvd_prefix_lookups_total")
assert d("kvd_prefix_query_tokens_total") == turn2["prompt_tokens"], (d("kvd_prefix_query_tokens_total"), turn2)
assert d("kvd_prefix_hit_tokens_total") == turn2["cached_tokens"], (d("kvd_prefix_hit_tokens_total"), turn2)
print("families: %d; ttft samples %d, itl samples %d; session turn 2: %d of %d tokens counted as hits"
      % (len(t2), h2[ttft][0], h2[itl][0], turn2["cached_tokens"], turn2["prompt_tokens"]))
PYEOF
ok "Prometheus' parser reads every family; counters rise, buckets accumulate, counts match the requests run"
stop_kvd "$KVD_PID" || fail "kvd exit status $?"
