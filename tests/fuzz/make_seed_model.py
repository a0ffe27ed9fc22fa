#!/usr/bin/env python3
"""Write the smallest complete model kvd loads, as a fuzzing seed.

    tests/fuzz/make_seed_model.py OUT.gguf

One layer, n_embd 32, one head, n_ff 32, the 300-token byte-level BPE
vocabulary with ChatML special tokens and the chat template of
scripts/gen_tiny_models.py, Q8_0 matrices: about 25 KB. It seeds
fuzz_model and fuzz_gguf (tests/fuzz/corpus/*/seed-model.gguf) and gives
fuzz_chat its vocabulary. Deterministic: re-running writes the same bytes.
"""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import gen_tiny_models as g  # noqa: E402

SEED = dict(n_layer=1, n_embd=32, n_head=1, n_head_kv=1, n_ff=32, n_vocab=300, wtype="q8_0", etype="q8_0")


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    g.VARIANTS["fuzz-seed"] = SEED
    with tempfile.TemporaryDirectory() as d:
        p = g.generate(d, ["fuzz-seed"])["fuzz-seed"]
        shutil.copyfile(p, sys.argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
