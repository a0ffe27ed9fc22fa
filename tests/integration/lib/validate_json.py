#!/usr/bin/env python3
"""Validate the outputs of `kvctl generate --json-schema` runs against their
schemas (Python's jsonschema, Draft 2020-12 with format checks), for
t_constrained.sh and t_constrained_gemma.sh.

    validate_json.py SCHEMA_DIR OUT_DIR (--need-fraction F | --need-half) [NAME...]

For each schema NAME (every SCHEMA_DIR/*.json when no names are given) and
each mode (greedy, seeded), OUT_DIR/NAME.MODE.{out,err,rc} hold kvctl's
output, error text and exit status. Exit 8 must say "cut at --max-tokens"
(a cut output, counted as cut); any other non-zero exit, an output that is
not JSON or one that does not validate fails. Then enough outputs must be
complete: at least the fraction F of them (complete >= F * total), or with
--need-half at least half (complete >= total // 2). Prints the counts;
exits non-zero with the reason on failure.
"""
import json
import os
import sys

import jsonschema


def main():
    args = sys.argv[1:]
    sdir, tdir, opt = args[0], args[1], args[2]
    if opt == "--need-fraction":
        fraction, names = float(args[3]), args[4:]
    elif opt == "--need-half":
        fraction, names = None, args[3:]
    else:
        sys.exit(f"validate_json.py: unknown option {opt}")
    names = names or [f[:-5] for f in sorted(os.listdir(sdir)) if f.endswith(".json")]
    complete = cut = 0
    for name in names:
        schema = json.load(open(os.path.join(sdir, name + ".json")))
        jsonschema.Draft202012Validator.check_schema(schema)
        v = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        for mode in ("greedy", "seeded"):
            base = os.path.join(tdir, f"{name}.{mode}")
            rc = int(open(base + ".rc").read())
            out, err = open(base + ".out").read(), open(base + ".err").read()
            if rc == 8:
                if "cut at --max-tokens" not in err:
                    sys.exit(f"{name} {mode}: exit 8 without the message: {err!r}")
                cut += 1
                continue
            if rc != 0:
                sys.exit(f"{name} {mode}: exit {rc}: {err.strip()}")
            try:
                doc = json.loads(out)
            except ValueError as e:
                sys.exit(f"{name} {mode}: not JSON ({e}): {out[:300]!r}")
            errs = list(v.iter_errors(doc))
            if errs:
                sys.exit(f"{name} {mode}: {out[:300]!r}: {errs[0].message}")
            complete += 1
    print(f"{complete} complete outputs validate, {cut} reported cut")
    if fraction is not None and complete < fraction * (complete + cut):
        sys.exit(f"fewer than {fraction:.0%} of the outputs completed within the token budget")
    if fraction is None and complete < (complete + cut) // 2:
        sys.exit("fewer than half of the outputs completed within the token budget")


if __name__ == "__main__":
    main()
