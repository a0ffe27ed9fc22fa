#!/usr/bin/env python3
"""Rewrite kvd's CUDA sources into plain C++ for the CPU emulation.

    tests/gpu/emu/rewrite.py SRC.cu DST.cc

Two rewrites, nothing else:
  * kernel launches  k<<<grid, block, smem, stream>>>(args);
    become          emu_launch(dim3(grid), dim3(block), (size_t)(smem), [=]() { k(args); });
  * the dynamic shared memory declaration  extern __shared__ float sm[];
    becomes         float *sm = (float *)emu_dyn_smem;
Anything else CUDA-specific is provided by tests/gpu/emu/include/emu.h.
"""
import re
import sys


def split_top(s):
    """Split on commas outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def launch(m):
    cfg = split_top(m.group(2))
    while len(cfg) < 3:
        cfg.append("0")
    return "emu_launch(dim3(%s), dim3(%s), (size_t)(%s), [=]() { %s(%s); });" % (
        cfg[0], cfg[1], cfg[2], m.group(1), m.group(3))


def main():
    src = open(sys.argv[1]).read()
    out = re.sub(r"(\w+)<<<(.*?)>>>\((.*?)\);", launch, src, flags=re.S)
    out = re.sub(r"extern __shared__ (\w+) (\w+)\[\];", r"\1 *\2 = (\1 *)emu_dyn_smem;", out)
    if "<<<" in out or "extern __shared__" in out:
        sys.exit("rewrite.py: %s: a launch or shared declaration was not rewritten" % sys.argv[1])
    open(sys.argv[2], "w").write('#line 1 "%s"\n' % sys.argv[1] + out)


main()
