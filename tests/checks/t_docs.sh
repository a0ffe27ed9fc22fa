#!/usr/bin/env bash
# tests/checks/t_docs.sh — the man pages and docs/ say what the programs do.
#
# 1. man/ is what scripts/gen-man writes now (from daemon/config.c's key
#    table, kvctl's command table and help texts, kvd's and kvd-http's
#    --help, client/kvclient.h): a key, option or function added without
#    `make man` fails here.
# 2. Completeness, checked against the programs rather than the generator:
#    every configuration key in kvd.conf(5); every kvctl command and each of
#    its options in kvctl(1); every option of kvd --help in kvd(8); every
#    key of etc/kvd-http.conf in kvd-http(8); every function libkvclient.so
#    exports in libkvclient(3).
# 3. Every page renders with man -l, without a warning from groff.
# 4. docs/: the pages the README points to exist; docs/operations.md's metric
#    table is the one kvd-docgen prints from client/kvc_metrics.h; the
#    README begins with `make run` and `make test` and points, from its
#    first screens, to systemd, C, the metrics and the pool size.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${KVD_BUILD:-build}
T=$(mktemp -d /tmp/kvd-docs.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ok() { echo "ok: $*"; }
DOCGEN=$BUILD/scripts/kvd-docgen KVCTL=$BUILD/bin/kvctl KVD=$BUILD/bin/kvd HTTPD=$BUILD/bin/kvd-http
for b in "$DOCGEN" "$KVCTL" "$KVD"; do
	[ -x "$b" ] || { echo "SKIP: $b not built"; exit 77; }
done
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }

# ---- 1. up to date
scripts/gen-man "$BUILD" "$T/man" || fail "scripts/gen-man"
for p in "$T"/man/*; do
	n=$(basename "$p")
	[ -f "man/$n" ] || fail "man/$n is missing (run make man)"
	diff -u "man/$n" "$p" >"$T/diff" || fail "man/$n is out of date (run make man): $(head -n 20 "$T/diff")"
done
ok "man/ is current: $(cd man && echo *)"

# ---- 2. completeness
while read -r k; do
	sec=${k%%.*} key=${k#*.}
	awk -v s="[$sec]" -v k="\\\\fB$key\\\\fR = " '$0 == ".SH " s { in_s = 1; next } /^\.SH / { in_s = 0 }
		in_s && index($0, k) == 1 { found = 1 } END { exit !found }' man/kvd.conf.5 ||
		fail "kvd.conf(5) lacks $k"
done < <("$DOCGEN" keys)
ok "kvd.conf(5) documents all $("$DOCGEN" keys | wc -l) keys"

cmds=$("$KVCTL" --help | awk '/^COMMANDS/ { c = 1; next } /^[A-Z]/ { c = 0 } c && /^    [a-z]+  / { print $1 }')
[ -n "$cmds" ] || fail "kvctl --help lists no commands"
nopt=0
for c in $cmds; do
	[ "$c" = help ] && continue
	grep -qx ".SS \"kvctl $c\"" man/kvctl.1 || fail "kvctl(1) lacks the command $c"
	for o in $("$KVCTL" "$c" --help | grep -oE '(^|[ [,])--[a-z][a-z-]*' | grep -oE -- '--[a-z-]+' | sort -u); do
		grep -qF -- "$o" man/kvctl.1 || fail "kvctl(1) lacks kvctl $c's option $o"
		nopt=$((nopt + 1))
	done
done
ok "kvctl(1) documents every command ($(echo $cmds | wc -w)) and option ($nopt)"

for o in $("$KVD" --help | grep -oE '^ +(-[a-zA-Z], )?--[a-z][a-z-]*' | grep -oE -- '--[a-z-]+'); do
	grep -qF -- "$o" man/kvd.8 || fail "kvd(8) lacks $o"
done
ok "kvd(8) documents every option of kvd --help"

if [ -x "$HTTPD" ]; then
	[ -f man/kvd-http.8 ] || fail "man/kvd-http.8 is missing"
	for k in $(sed -n 's/^\([a-z_]*\) =.*/\1/p' etc/kvd-http.conf); do
		grep -qE "^$k = " man/kvd-http.8 || fail "kvd-http(8) lacks the key $k"
	done
	ok "kvd-http(8) documents every key of etc/kvd-http.conf"
fi

if [ -f "$BUILD/libkvclient.so" ]; then
	fns=$(nm -D --defined-only "$BUILD/libkvclient.so" | awk '$2 == "T" { print $3 }' | grep -E '^kvc?_')
	[ -n "$fns" ] || fail "libkvclient.so exports no kvc_ function"
	for fn in $fns; do
		grep -qE "(^|[^a-z_])$fn\(" man/libkvclient.3 || fail "libkvclient(3) lacks $fn()"
	done
	ok "libkvclient(3) documents all $(echo $fns | wc -w) exported functions"
fi

# ---- 3. they render
for p in man/*.[0-9]; do
	MANWIDTH=80 man --warnings=w -l "$p" >"$T/out" 2>"$T/err" || fail "man -l $p failed: $(cat "$T/err")"
	[ ! -s "$T/err" ] || fail "man -l $p warned: $(head -n 5 "$T/err")"
	[ "$(wc -l <"$T/out")" -gt 20 ] || fail "man -l $p rendered $(wc -l <"$T/out") lines"
done
ok "every page renders with man -l, no warnings"

# ---- 4. docs/ and the README
for d in $(grep -oE 'docs/[a-z-]+\.md' README.md | sort -u); do
	[ -f "$d" ] || fail "README.md points to $d, which does not exist"
done
for d in benchmarks protocol design security operations testing; do
	[ -f "docs/$d.md" ] || fail "docs/$d.md is missing"
	grep -q "docs/$d.md" README.md || fail "README.md does not point to docs/$d.md"
done
"$DOCGEN" metrics >"$T/metrics.md"
missing=$(grep -vxF -f docs/operations.md "$T/metrics.md")
[ -z "$missing" ] || fail "docs/operations.md's metric table differs from kvd-docgen metrics: $missing"
ok "docs/operations.md lists all $(($(wc -l <"$T/metrics.md") - 2)) metrics as client/kvc_metrics.h has them"
head -n 8 README.md | grep -q '^make run' && head -n 8 README.md | grep -q '^make test' ||
	fail "README.md does not begin with make run and make test"
for w in 'systemctl enable --now kvd.socket' 'kvc_generate' 'kvd_prefix_hit_tokens' 'pool_size'; do
	grep -qF -- "$w" README.md || fail "README.md does not mention $w"
done
[ "$(wc -l <README.md)" -le 300 ] || fail "README.md has $(wc -l <README.md) lines: a guide is read in one sitting"
ok "README.md: the two commands first, systemd, C, metrics and pool size, $(wc -l <README.md) lines"

# the README's C example compiles against the public header as shown
awk '/^```c$/ { c = 1; next } c && /^```/ { exit } c { print }' README.md >"$T/readme.c"
[ -s "$T/readme.c" ] || fail "README.md has no C example"
${CC:-cc} -std=c11 -Wall -Wextra -Wno-unused-parameter -Werror -fsyntax-only -Iclient "$T/readme.c" 2>"$T/cc.err" ||
	fail "README.md's C example does not compile: $(cat "$T/cc.err")"
ok "README.md's C example compiles against client/kvclient.h"

# kvctl stats --help names every member --json prints (the list's fields)
"$KVCTL" stats --help | tr -s ' \n,' '\n' >"$T/stats_help"
for f in $(grep -oE '^	X\([a-z0-9_]+' client/kvc_metrics.h | cut -c4-); do
	grep -qx "$f" "$T/stats_help" || fail "kvctl stats --help does not name the --json member $f"
done
ok "kvctl stats --help names every --json member of client/kvc_metrics.h"
