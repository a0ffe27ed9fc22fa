#!/usr/bin/env bash
# t_metrics_agree.sh — kvctl stats --prometheus and kvd-http's /metrics,
# scraped from one daemon, agree family by family: every kvd_* family of
# either is in the other (kvd-http adds only kvd_up and its own kvd_http_*),
# with the same # TYPE, the same # HELP and the same samples (label sets and
# values), after requests that used the prefix cache, so the counters are
# not all zero. Only the gauges that move between two scrapes by themselves
# are compared by presence alone: kvd_uptime_seconds and kvd_clients (each
# scraper is a client of its own). Both outputs come from one list,
# client/kvc_metrics.h; the list's every row must be there, and the gauges a
# fleet router reads (requests waiting and running, KV cache utilisation
# from 0 to 1, the page size and count in kvd_cache_config_info) say what
# the pool's counters say.
source "$(dirname "$0")/lib.sh"
need_bins
HTTPD=${KVD_HTTP:-$ROOT/$BUILD/bin/kvd-http}
[ -x "$HTTPD" ] || skip "$HTTPD not built (libmicrohttpd-dev / libjansson-dev missing: run scripts/setup)"
[ -x "$KVCTL" ] || skip "$KVCTL not built"
command -v curl >/dev/null || skip "curl not installed"
[ -f "$REAL_MODEL" ] || skip "default model missing (run scripts/setup)"

S=$T/kvd.sock
start_kvd kvd "$S" --model "$REAL_MODEL" --pool-size 32M --threads 2
PORT=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$HTTPD" --kvd-socket "$S" --listen "127.0.0.1:$PORT" 2>"$T/http.log" &
PIDS+=($!)
B=http://127.0.0.1:$PORT
for i in $(seq 1 100); do
	[ "$(curl -s -o /dev/null -w '%{http_code}' "$B/health")" = 200 ] && break
	sleep 0.1
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "$B/health")" = 200 ] || fail "kvd-http not healthy at $B"

K=("$KVCTL" --socket "$S")
P="The lighthouse keeper wrote in the log every evening: the wind, the sea, the ships that passed, and the name of each gull."
for i in 1 2; do
	"${K[@]}" generate --raw --temperature 0 --max-tokens 4 "$P" >/dev/null || fail "kvctl generate $i"
done
curl -sf "$B/v1/completions" -d '{"prompt":"Name a colour.","max_tokens":3,"temperature":0}' >/dev/null ||
	fail "POST /v1/completions"

"${K[@]}" stats --prometheus >"$T/kvctl.prom" || fail "kvctl stats --prometheus"
curl -sf "$B/metrics" >"$T/http.prom" || fail "GET /metrics"

$PY - "$T/kvctl.prom" "$T/http.prom" client/kvc_metrics.h <<'PYEOF' || fail "the two outputs disagree"
import re, sys

def families(path):
    fams, cur = {}, None
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("# HELP "):
            name, help_ = line[7:].split(" ", 1)
            cur = fams.setdefault(name, {"help": help_, "type": None, "samples": {}})
        elif line.startswith("# TYPE "):
            name, typ = line[7:].split(" ")
            assert name in fams, "TYPE before HELP: " + line
            fams[name]["type"] = typ
        elif line:
            m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$', line)
            assert m and cur is not None, "malformed line in %s: %r" % (path, line)
            cur["samples"][m.group(1) + (m.group(2) or "")] = m.group(3)
    return fams

ctl, http = families(sys.argv[1]), families(sys.argv[2])
VOLATILE = {"kvd_uptime_seconds", "kvd_clients"}
http_kvd = {n: f for n, f in http.items() if n != "kvd_up" and not n.startswith("kvd_http_")}
bad = []
for n in sorted(set(ctl) | set(http_kvd)):
    if n not in http_kvd:
        bad.append("%s: in kvctl stats --prometheus, not in /metrics" % n); continue
    if n not in ctl:
        bad.append("%s: in /metrics, not in kvctl stats --prometheus" % n); continue
    a, b = ctl[n], http_kvd[n]
    if a["type"] != b["type"]:
        bad.append("%s: TYPE %s against %s" % (n, a["type"], b["type"]))
    if a["help"] != b["help"]:
        bad.append("%s: HELP %r against %r" % (n, a["help"], b["help"]))
    if set(a["samples"]) != set(b["samples"]):
        bad.append("%s: samples %s against %s" % (n, sorted(a["samples"]), sorted(b["samples"])))
    elif n not in VOLATILE and a["samples"] != b["samples"]:
        bad.append("%s: values %s against %s" % (n, a["samples"], b["samples"]))
# every row of the list is exported, with its kind
rows = re.findall(r'X\((\w+), (GAUGE|COUNTER), "[^"]*", "(\w+)"', open(sys.argv[3]).read())
assert len(rows) >= 30, "only %d rows found in %s" % (len(rows), sys.argv[3])
for field, kind, name in rows:
    full = "kvd_" + name + ("_total" if kind == "COUNTER" else "")
    want = "counter" if kind == "COUNTER" else "gauge"
    if full not in ctl or ctl[full]["type"] != want:
        bad.append("%s (%s): not exported as a %s" % (full, field, want))
# the families fleet routers read (Gateway API Inference Extension model-server protocol)
def value(n, sample=None):
    return float(ctl[n]["samples"][sample or n])
for n in ("kvd_requests_waiting", "kvd_requests_running", "kvd_kv_cache_usage_perc", "kvd_cache_config_info"):
    if n not in ctl or ctl[n]["type"] != "gauge":
        bad.append("%s: not a gauge" % n)
if not bad:
    used, total = value("kvd_pages_used"), value("kvd_pages_total")
    u = value("kvd_kv_cache_usage_perc")
    if not (0 <= u <= 1 and abs(u - used / total) < 1e-6):
        bad.append("kvd_kv_cache_usage_perc %s, pages used/total %s/%s" % (u, used, total))
    want = 'kvd_cache_config_info{block_size="%d",num_gpu_blocks="%d"}' % (value("kvd_block_size_tokens"), total)
    if want not in ctl["kvd_cache_config_info"]["samples"]:
        bad.append("kvd_cache_config_info: %s, wanted %s" % (list(ctl["kvd_cache_config_info"]["samples"]), want))
hits = ctl.get("kvd_prefix_hit_tokens_total", {"samples": {}})["samples"].get("kvd_prefix_hit_tokens_total", "0")
if int(hits) < 16:
    bad.append("kvd_prefix_hit_tokens_total is %s after a prompt sent twice" % hits)
if bad:
    print("\n".join(bad)); sys.exit(1)
print("%d kvd families agree (%d rows of client/kvc_metrics.h; kvd_prefix_hit_tokens_total %s)" %
      (len(ctl), len(rows), hits))
PYEOF
ok "kvctl stats --prometheus and /metrics agree family by family"
