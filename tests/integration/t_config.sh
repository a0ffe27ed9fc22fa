#!/usr/bin/env bash
# t_config.sh — kvd's configuration errors and --check-config.
#
# An unknown key, a bad value, a missing model and a missing explicit config
# file each give "file:line: message" (or the flag's name) on stderr and exit
# status 78 (EX_CONFIG); the shipped etc/kvd.conf passes --check-config with
# a model; command-line mistakes exit 64; --help and --version exit 0.
source "$(dirname "$0")/lib.sh"
[ -x "$KVD" ] || skip "$KVD not built"
TINY=$(tiny_model gqa)

# expect_78 NAME PATTERN ARGS...: exit 78 and PATTERN (grep -E) on stderr
expect_78() {
	local name=$1 pat=$2; shift 2
	"$KVD" "$@" >"$T/out" 2>"$T/err"
	local rc=$?
	[ $rc = 78 ] || fail "$name: exit $rc, expected 78 ($(cat "$T/err"))"
	grep -Eq -- "$pat" "$T/err" || fail "$name: stderr '$(cat "$T/err")' does not match '$pat'"
	ok "$name: $(sed 's/^<[0-9]>//' "$T/err" | head -1)"
}

C=$T/kvd.conf
printf '# test\n[model]\npath = %s\n\n[server]\nbogus_key = 1\n' "$TINY" >"$C"
expect_78 "unknown key" "^(<3>)?$C:6: unknown key 'bogus_key' in section \[server\]" --config "$C" --check-config
expect_78 "unknown key (daemon start)" "$C:6: unknown key" --config "$C"

printf '[model]\npath = %s\n[kv]\nblock_size = sixteen\n' "$TINY" >"$C"
expect_78 "bad value" "^(<3>)?$C:4: bad value 'sixteen' for kv.block_size" --config "$C" --check-config

printf '[model]\npath = %s\n[kv]\n# 8-bit keys and values\ncache_type = q8\n' "$TINY" >"$C"
expect_78 "bad cache type" "^(<3>)?$C:5: cache_type must be auto, f16, bf16, q8_0, q4_0 or f32, not 'q8'$" --config "$C" --check-config
expect_78 "bad cache type (flag)" "^(<3>)?--cache-type: cache_type must be auto, f16, bf16, q8_0, q4_0 or f32, not 'f8'" \
	--config /dev/null --model "$TINY" --cache-type f8 --check-config
printf '[model]\npath = %s\n[kv]\ncache_type = q4_0\n' "$TINY" >"$C"
"$KVD" --config "$C" --check-config 2>"$T/err" | grep -q "cache_type q4_0" ||
	fail "cache_type = q4_0: --check-config does not report it ($(cat "$T/err"))"
ok "kv.cache_type: a bad value names its line; a good one is reported by --check-config"

printf '[engine]\nbackend = tpu\n' >"$C"
expect_78 "bad backend" "^(<3>)?$C:2: backend must be auto, cpu or cuda" --config "$C" --check-config

printf '[log]\nlevel = loud\n' >"$C"
expect_78 "bad log level" "^(<3>)?$C:2: log level must be" --config "$C" --check-config

printf '[kv]\npool_size = 200%%\n' >"$C"
expect_78 "bad pool percentage" "^(<3>)?$C:2: pool_size percentage" --config "$C" --check-config

printf 'this is not ini\n' >"$C"
expect_78 "syntax error" "^(<3>)?$C:1: " --config "$C" --check-config

# the first error is reported, at its own line, with its own message: a
# misspelt section makes every key in it unknown, and the first of them is named
printf '[model]\npath = %s\n\n[schedular]\n# tokens\nmax_model_len = 2048\nmax_num_seqs = 8\n\nmax_waiting = 64\n' "$TINY" >"$C"
expect_78 "misspelt section" "^(<3>)?$C:6: unknown key 'max_model_len' in section \[schedular\]$" --config "$C" --check-config
# a broken section header is a syntax error at its line, not an unknown key later
printf '[model]\npath = %s\n\n[kv\nblock_size = 16\nprefix_caching = yes\n' "$TINY" >"$C"
expect_78 "broken section header" "^(<3>)?$C:4: syntax error: section header '\[kv' has no closing '\]'" --config "$C" --check-config
printf '[model]\npath = %s\n[server]\nsocket /tmp/x.sock\nbogus = 1\n' "$TINY" >"$C"
expect_78 "line without =" "^(<3>)?$C:4: syntax error: expected \[section\], key = value or a comment, not 'socket /tmp/x.sock'" --config "$C" --check-config

printf '[model]\n# where\npath = %s/none.gguf\n' "$T" >"$C"
expect_78 "missing model" "^(<3>)?$C:3: model '$T/none.gguf': No such file or directory" --config "$C" --check-config
expect_78 "missing model (daemon start)" "$C:3: model" --config "$C"
expect_78 "missing model (flag)" "^(<3>)?--model: model '$T/none.gguf'" --config /dev/null --model "$T/none.gguf"

expect_78 "missing explicit config file" "$T/nope.conf: cannot read the configuration: No such file" \
	--config "$T/nope.conf" --model "$TINY" --check-config
# --check-config checks a file: without one (the default path missing) it says so
if [ ! -e /etc/kvd/kvd.conf ]; then
	expect_78 "check-config, default file missing" "/etc/kvd/kvd.conf: cannot read the configuration: No such file" \
		--model "$TINY" --check-config
else
	echo "note: /etc/kvd/kvd.conf exists here; the missing-default-file check is not run"
fi
expect_78 "bad flag value" "^(<3>)?--max-num-seqs: bad value '0'" --config /dev/null --model "$TINY" --max-num-seqs 0

# the shipped configuration is valid (with a model that exists here)
"$KVD" --config etc/kvd.conf --model "$TINY" --check-config >"$T/out" 2>"$T/err" ||
	fail "etc/kvd.conf --check-config: exit $? ($(cat "$T/err"))"
grep -q "configuration OK" "$T/out" || fail "--check-config printed no summary"
ok "etc/kvd.conf passes --check-config"

# etc/kvd.conf documents exactly the keys of config.c's table (kvd_conf_keys[]),
# each in its section and with the table's default: "section.key = default"
# from each side, compared as sorted lists
table_keys() { # the first line of each row: { "section", "name", KVD_CONF_TYPE, "default",
	sed -nE 's/^\t\{ "([a-z]+)", "([a-z_]+)", KVD_CONF_[A-Z0-9_]+, "([^"]*)",$/\1.\2 = \3/p' daemon/config.c | sort
}
conf_keys() { # key = value lines of an INI file, with their section
	awk '/^\[[a-z]+\]/ { sec = substr($0, 2, length($0) - 2); next }
	     /^[a-z_]+ *=/ { k = $0; sub(/ *=.*/, "", k); v = $0; sub(/^[^=]*= */, "", v); print sec "." k " = " v }' "$1" | sort
}
# check_documented CONF: prints what differs, fails when anything does
check_documented() {
	local t c
	t=$(table_keys); c=$(conf_keys "$1")
	[ "$(echo "$t" | wc -l)" -ge 20 ] || { echo "found only $(echo "$t" | wc -l) rows in config.c's table"; return 1; }
	diff <(echo "$t") <(echo "$c") | sed -n 's/^< /  table only (or another default): /p; s/^> /  etc\/kvd.conf only (or another default): /p'
	[ "$t" = "$c" ]
}
check_documented etc/kvd.conf || fail "etc/kvd.conf and config.c's key table differ (above)"
# the check catches a key the file lacks and a default that differs
sed '/^block_size *=/d' etc/kvd.conf >"$T/less.conf"
check_documented "$T/less.conf" >/dev/null && fail "the documentation check missed a key missing from kvd.conf"
sed 's/^max_num_seqs *=.*/max_num_seqs = 65/' etc/kvd.conf >"$T/other.conf"
check_documented "$T/other.conf" >/dev/null && fail "the documentation check missed a default that differs"
ok "etc/kvd.conf documents exactly the keys of config.c's table, with its defaults ($(table_keys | wc -l) keys)"

# every key of the table with an option is in --help, with the key it sets
"$KVD" --help >"$T/help.out" || fail "--help exited $?"
for opt in $(sed -nE 's/.*OPT\("(--[a-z-]+)".*/\1/p; s/^\t  "(--[a-z-]+)", 0, NULL, ".*/\1/p' daemon/config.c); do
	grep -qE -- "^ +(-[a-z], )?$opt( [A-Z]+)? " "$T/help.out" || grep -qE -- "^ +(-[a-z], )?$opt( [A-Z]+)?$" "$T/help.out" ||
		fail "--help does not list $opt"
done
grep -q '\[kv\] block_size$' "$T/help.out" || fail "--help does not name the key --block-size sets"
ok "--help lists every option of the key table"

# etc/kvd.conf names the same weight formats as the README's "Supported models"
fmt_re='\b(f32|f16|bf16|q[0-9]_[0-9k])\b'
readme_fmts=$(sed -n '/^## Supported models/,/^## /p' README.md | tr '\n' ' ' | grep -oE 'weights in [^.]*' | head -n 1 |
	sed 's/, so .*//' | tr 'A-Z' 'a-z' | grep -oE "$fmt_re" | sort -u | tr '\n' ' ')
conf_fmts=$(sed -n '/^\[model\]/,/^path/p' etc/kvd.conf | tr 'A-Z' 'a-z' | grep -oE "$fmt_re" | sort -u | tr '\n' ' ')
[ -n "$readme_fmts" ] || fail "no weight formats found in README.md's 'Supported models'"
[ "$readme_fmts" = "$conf_fmts" ] ||
	fail "etc/kvd.conf lists weight formats '$conf_fmts', README.md '$readme_fmts'"
ok "etc/kvd.conf and README.md list the same weight formats: $conf_fmts"

# KVD_SOCKET overrides the file; --socket overrides both
printf '[model]\npath = %s\n[server]\nsocket = /run/from-file.sock\n' "$TINY" >"$C"
KVD_SOCKET=/tmp/from-env.sock "$KVD" --config "$C" --check-config >"$T/cc1.out" || fail "check-config with KVD_SOCKET"
grep -q "socket /tmp/from-env.sock" "$T/cc1.out" || fail "KVD_SOCKET did not override server.socket"
KVD_SOCKET=/tmp/from-env.sock "$KVD" --config "$C" --socket /tmp/flag.sock --check-config >"$T/cc2.out" || fail "check-config with --socket"
grep -q "socket /tmp/flag.sock" "$T/cc2.out" || fail "--socket did not override KVD_SOCKET"
ok "socket precedence: --socket > KVD_SOCKET > file"

"$KVD" --no-such-flag >/dev/null 2>&1; rc=$?
[ $rc = 64 ] || fail "unknown flag: exit $rc, expected 64"
"$KVD" --help >"$T/help.out" || fail "--help exited $?"
grep -q "^SYNOPSIS" "$T/help.out" || fail "--help has no SYNOPSIS"
"$KVD" --version >"$T/version.out" || fail "--version exited $?"
grep -q "^kvd " "$T/version.out" || fail "--version"
ok "usage errors exit 64; --help and --version"
exit 0
