#!/usr/bin/env bash
# t_skips.sh — tests/run.sh counts every skip in its final summary, with its
# reason: a skipped cmocka case (the "skipped: ..." line it printed, or "no
# reason printed"), a case skipped inside a passing script, and a script that
# exits 77. Runs tests/run.sh on a fake build tree ($T/build/tests) of small
# scripts that print what cmocka and the test scripts print.
source "$(dirname "$0")/lib.sh"
mkdir -p "$T/build/tests"
cat >"$T/build/tests/test_fake" <<'FAKE'
#!/bin/sh
echo "[ RUN      ] test_a"
echo "[       OK ] test_a"
echo "[ RUN      ] test_b"
echo "skipped: no widget here"
echo "[  SKIPPED ] test_b"
echo "[ RUN      ] test_c"
echo "skipped: no widget here"
echo "[  SKIPPED ] test_c"
echo "[ RUN      ] test_d"
echo "[  SKIPPED ] test_d"
echo "[==========] 4 test(s) run."
echo "[  SKIPPED ] 3 test(s), listed below:"
echo "[  SKIPPED ] test_b"
echo " 3 SKIPPED TEST(S)" >&2
exit 0
FAKE
cat >"$T/build/tests/test_gone" <<'FAKE'
#!/bin/sh
echo "checking"
echo "SKIP: the gadget is missing"
exit 77
FAKE
chmod +x "$T/build/tests/test_fake" "$T/build/tests/test_gone"
BUILD=$T/build tests/run.sh --unit-only >"$T/out" 2>&1 || fail "tests/run.sh failed: $(tail "$T/out")"
sed -n '/^tests: /,$p' "$T/out" >"$T/summary"
cat "$T/summary"
grep -q '^tests: 1 passed, 1 skipped, 0 failed; 3 skipped case' "$T/summary" || fail "summary counts"
grep -qF 'skipped: unit/test_gone: the gadget is missing' "$T/summary" || fail "a script's skip reason is not in the summary"
grep -qF 'unit/test_fake: 2 case(s) skipped: no widget here (test_b, test_c)' "$T/summary" ||
	fail "skipped cases are not listed with their reason"
grep -qF 'unit/test_fake: 1 case(s) skipped: no reason printed (test_d)' "$T/summary" ||
	fail "a case skipped without a reason is not listed as such"
ok "tests/run.sh lists every skip with its reason"
