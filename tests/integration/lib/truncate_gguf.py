#!/usr/bin/env python3
"""Copy a GGUF model keeping only its first N transformer blocks: a model
with the same vocabulary and other (fewer) layers, which is what a draft
model for speculative decoding is, made from the default model in a second.

    truncate_gguf.py IN OUT N

Tensors named blk.K.* with K >= N are left out, every other tensor is
copied byte for byte (re-aligned), and the architecture's block_count is
set to N. Only the GGUF container is read and written here (little-endian,
version 3); the key-value section is copied as it is but for that one value.
"""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from retemplate_gguf import T_STR, T_U32, Reader, put_value  # noqa: E402


def main():
    src, dst, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
    b = open(src, "rb").read()
    r = Reader(b)
    n_t, kvs = r.header()
    infos = []  # name, dims, type, offset
    for _ in range(n_t):
        name = r.string()
        nd = r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        infos.append((name, dims, r.take("I"), r.take("Q")))
    kv = {k: (t, v) for k, t, v in kvs}
    align = kv.get("general.alignment", (T_U32, 32))[1]
    data_start = (r.o + align - 1) // align * align
    # a tensor's bytes run to the next tensor's offset (or the file's end)
    ends = sorted(o for _, _, _, o in infos) + [len(b) - data_start]
    size = {o: ends[i + 1] - o for i, o in enumerate(ends[:-1])}
    kept = [t for t in infos if not (t[0].startswith("blk.") and int(t[0].split(".")[1]) >= keep)]
    n_blocks = None
    out = bytearray(struct.pack("<IIQQ", 0x46554747, 3, len(kept), len(kvs)))
    for k, t, v in kvs:
        if k.endswith(".block_count"):
            n_blocks, v = v, keep
        put_value(out, T_STR, k)
        out += struct.pack("<I", t)
        put_value(out, t, v)
    assert n_blocks is not None and 0 < keep <= n_blocks, "no block_count, or N out of range"
    off, blobs = 0, []
    for name, dims, typ, o in kept:
        put_value(out, T_STR, name)
        out += struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", typ, off)
        blob = b[data_start + o:data_start + o + size[o]]
        blob += b"\0" * ((-len(blob)) % align)
        blobs.append(blob)
        off += len(blob)
    out += b"\0" * ((-len(out)) % align)
    with open(dst, "wb") as f:
        f.write(out)
        for blob in blobs:
            f.write(blob)


if __name__ == "__main__":
    main()
