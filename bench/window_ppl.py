#!/usr/bin/env python3
"""Perplexity of a fixed text fed through kvd's engine under the context
window policies: full attention, a sliding window, and attention sinks plus
the same window (StreamingLLM). The text is fed in order (teacher-forced,
chunks of at most --chunk tokens, cut at the window's eviction points so
the result is the same as token by token); every token is scored against
the logits before it. Figures per segment of the stream show whether a
policy stays bounded once the stream is far past its window.

    bench/window_ppl.py [--model PATH] [--text FILE|REV:PATH] [--tokens N] [--windows 128,256] [--sinks 4]

The default text is README.md as of commit 2b7b33a (git show), so the
figures do not move when the README does.

Prints a table: policy, window, overall perplexity, perplexity per segment,
KV pages in use at most. Runs `nice`d; about 20 s per policy for 4,096
tokens of SmolLM2-135M on two cores.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(exe, a, policy, window):
    cmd = ["nice", exe, "--model", a.model, "--text-file", a.text, "--limit", str(a.tokens), "--policy", policy,
           "--window", str(window), "--sinks", str(a.sinks), "--chunk", str(a.chunk), "--threads",
           str(a.threads), "--segment", str(a.segment), "--block-size", "16"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit("kvd_stream failed: %s\n%s" % (" ".join(cmd), p.stderr))
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    # a fixed text: README.md as of a fixed commit (REV:PATH is read with git show)
    ap.add_argument("--text", default="2b7b33a:README.md", help="FILE, or REV:PATH of this repository")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--windows", default="128,256")
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--segment", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default=os.environ.get("KVD_BUILD", os.path.join(ROOT, "build")))
    a = ap.parse_args()
    exe = os.path.join(a.build, "tests", "kvd_stream")
    label = a.text
    if not os.path.exists(a.text) and ":" in a.text:
        data = subprocess.run(["git", "-C", ROOT, "show", a.text], capture_output=True, check=True).stdout
        tmp = tempfile.NamedTemporaryFile(prefix="kvd-ppl-", suffix=".txt", delete=False)
        tmp.write(data)
        tmp.close()
        a.text = tmp.name
    try:
        text_hash = hashlib.sha1(open(a.text, "rb").read()).hexdigest()[:12]
        print("model %s; text %s (sha1 %s), first %d tokens; segments of %d tokens; KV pages of 16 tokens" % (
            os.path.basename(a.model), label, text_hash, a.tokens, a.segment))
        table(exe, a)
    finally:
        if a.text != label:
            os.unlink(a.text)
    return 0


def table(exe, a):
    rows = [("full attention", 0, run(exe, a, "none", 1))]
    for w in [int(x) for x in a.windows.split(",")]:
        rows.append(("sliding-window", w, run(exe, a, "sliding-window", w)))
        rows.append(("sinks (%d)" % a.sinks, w, run(exe, a, "sinks", w)))
    print("%-16s %6s %8s  %-60s %s" % ("policy", "window", "ppl", "ppl per segment", "pages max"))
    for name, w, r in rows:
        print("%-16s %6s %8.2f  %-60s %d" % (name, w or "-", r["ppl"], " ".join("%.1f" % x for x in r["ppl_segments"]),
                                             r["pages_used_max"]))


if __name__ == "__main__":
    sys.exit(main())
