#!/usr/bin/env bash
# tests/integration/t_grammar_schema.sh — every document the JSON Schema
# constraint let a random walk produce (test_grammar's suite: 35 schemas,
# SmolLM2's vocabulary) validates with Python's jsonschema (Draft 2020-12,
# formats checked where the package can, patterns with Python's re), a
# validator that shares nothing with kvd.
source "$(dirname "$0")/lib.sh"
BIN=$ROOT/$BUILD/tests/test_grammar
VPY=$ROOT/.venv/bin/python
[ -x "$BIN" ] || fail "$BIN not built (make)"
[ -f "$REAL_MODEL" ] || skip "$REAL_MODEL missing (scripts/setup)"
"$VPY" -c 'import jsonschema' 2>/dev/null || skip "jsonschema not in .venv (scripts/setup installs it)"
KVD_GRAMMAR_DUMP=$T/docs.jsonl CMOCKA_TEST_ABORT=0 timeout 300 "$BIN" >"$T/unit.log" 2>&1 || fail "test_grammar failed"
"$VPY" - "$T/docs.jsonl" <<'PY' || fail "a constrained document does not validate"
import json, sys
import jsonschema
names, n = set(), 0
for line in open(sys.argv[1]):
    rec = json.loads(line)
    v = jsonschema.Draft202012Validator(rec["schema"], format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    errs = list(v.iter_errors(rec["doc"]))
    if errs:
        print(f"{rec['name']}: {json.dumps(rec['doc'])[:300]}: {errs[0].message}")
        sys.exit(1)
    names.add(rec["name"]); n += 1
if len(names) < 30 or n < 100:
    print(f"only {n} documents from {len(names)} schemas"); sys.exit(1)
print(f"{n} documents from {len(names)} schemas validate")
PY
ok "constrained outputs validate with jsonschema"
