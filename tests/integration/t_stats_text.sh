#!/usr/bin/env bash
# t_stats_text.sh — `kvctl stats`' text table is rendered from the one
# counter list (client/kvc_metrics.h):
#   - it has one row per counter of `kvctl stats --json`, each group's name
#     once, and the heading names the KV type and bytes per token;
#   - after constrained generations the grammar rows show the counts the
#     JSON form gives (gram_checked, gram_masked), and they add up to the
#     tokens generated under the constraints;
#   - STATS grows by version: a client saying 0.7.0 gets 0.7.0's 320-byte
#     reply (it accepts no other length), a 0.8.0 client the longer one,
#     with the grammar counters.
source "$(dirname "$0")/lib.sh"
need_bins
[ -f "$REAL_MODEL" ] || skip "default model missing (run scripts/setup)"
S=$T/kvd.sock
start_kvd kvd "$S" --model "$REAL_MODEL" --threads 2 --cache-type f16
export KVD_SOCKET=$S
"$KVCTL" generate --max-tokens 6 --choice "red,green,blue" "Name a colour:" >/dev/null || fail "generate --choice"
"$KVCTL" generate --max-tokens 6 --regex '[0-9]{2,4}' "A year:" >/dev/null || fail "generate --regex"
"$KVCTL" stats >"$T/text" || fail "kvctl stats"
"$KVCTL" stats --json >"$T/json" || fail "kvctl stats --json"

n_json=$($PY -c 'import json,sys; print(sum(isinstance(v, int) for v in json.load(open(sys.argv[1])).values()))' "$T/json")
# rows: the lines after the two heading lines that are not blank
n_rows=$(tail -n +3 "$T/text" | grep -c .)
[ "$n_rows" = "$n_json" ] || fail "$n_rows table rows for $n_json counters:
$(cat "$T/text")"
groups=$(tail -n +3 "$T/text" | grep -v '^ ' | grep . | awk '{ print $1 }' | sort | uniq -d)
[ -z "$groups" ] || fail "groups shown twice: $groups"
grep -q "per token, f16)" "$T/text" || fail "the heading does not name the KV type: $(head -n 2 "$T/text")"
ok "$n_rows rows, one per counter, in $(tail -n +3 "$T/text" | grep -v '^ ' | grep -c .) groups"

read -r checked masked gen < <($PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["gram_checked"], d["gram_masked"], d["generated_tokens_total"])' "$T/json")
row() { sed -n "s/^.*$1 *\([0-9][0-9]*\) tokens.*/\1/p" "$T/text"; }
[ "$(row 'fast-path tokens')" = "$checked" ] && [ "$(row 'full-mask tokens')" = "$masked" ] ||
	fail "grammar rows '$(row 'fast-path tokens')' '$(row 'full-mask tokens')', JSON $checked $masked"
[ $((checked + masked)) -ge 2 ] && [ $((checked + masked)) -le "$gen" ] ||
	fail "constrained tokens $checked + $masked for $gen generated"
ok "grammar: $checked fast-path and $masked full-mask tokens of $gen generated, as --json says"

raw_stats() { KVD_RAW_CLIENT_VERSION=$1 "$RAW" -s "$S" stats >"$T/raw" || fail "kvd_raw stats as $1"
	$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["reply_bytes"], d["gram_masked"])' "$T/raw"; }
[ "$(raw_stats 0x000700)" = "320 0" ] || fail "a 0.7.0 client's STATS reply: $(cat "$T/raw")"
read -r len m8 < <(raw_stats 0x000800)
[ "$len" -ge 400 ] && [ $((len % 8)) = 0 ] && [ "$m8" = "$masked" ] ||
	fail "a 0.8.0 client's STATS reply: $(cat "$T/raw")"
ok "STATS: 320 bytes for a 0.7.0 client, $len with the grammar and speculation counters for 0.8.0 and later"
