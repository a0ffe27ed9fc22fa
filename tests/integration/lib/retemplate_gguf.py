#!/usr/bin/env python3
"""Copy a tiny test model (scripts/gen_tiny_models.py) with another chat
template and that template's marker tokens, for tests of a chat family's
formats on a model that runs in milliseconds.

    retemplate_gguf.py [--ctx N] IN OUT TEMPLATE_FILE MARKER...

The markers replace the vocabulary's last merge tokens (their merges are
dropped), as control tokens, so the vocabulary keeps its size and every
tensor is copied byte for byte; the key-value section is rewritten with
tokenizer.chat_template set to the file's text (and, with --ctx, the
context length set to N: byte-level prompts with tools are long). Only the GGUF container is
read and written here (little-endian, version 3).
"""
import struct
import sys

T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
SCALAR = {T_U8: "B", T_I8: "b", T_U16: "H", T_I16: "h", T_U32: "I", T_I32: "i", T_F32: "f", T_BOOL: "?",
          T_U64: "Q", T_I64: "q", T_F64: "d"}


class Reader:
    def __init__(self, b):
        self.b, self.o = b, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.b, self.o)
        self.o += struct.calcsize("<" + fmt)
        return v[0]

    def string(self):
        n = self.take("Q")
        s = self.b[self.o:self.o + n].decode("utf-8")
        self.o += n
        return s

    def header(self):
        """The GGUF v3 header from the start: (tensor count, [[key, type, value], ...])."""
        assert self.take("I") == 0x46554747 and self.take("I") == 3, "not a GGUF v3 file"
        n_t, n_kv = self.take("Q"), self.take("Q")
        kvs = []
        for _ in range(n_kv):
            k = self.string()
            t = self.take("I")
            kvs.append([k, t, self.value(t)])
        return n_t, kvs

    def value(self, t):
        if t == T_STR:
            return self.string()
        if t == T_ARR:
            et, n = self.take("I"), self.take("Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(SCALAR[t])


def put_value(out, t, v):
    if t == T_STR:
        b = v.encode("utf-8")
        out += struct.pack("<Q", len(b)) + b
    elif t == T_ARR:
        et, items = v
        out += struct.pack("<IQ", et, len(items))
        for x in items:
            put_value(out, et, x)
    else:
        out += struct.pack("<" + SCALAR[t], v)


def main():
    argv, ctx = sys.argv[1:], None
    if argv[0] == "--ctx":
        ctx, argv = int(argv[1]), argv[2:]
    src, dst, tmpl_file, markers = argv[0], argv[1], argv[2], argv[3:]
    b = open(src, "rb").read()
    r = Reader(b)
    n_t, kvs = r.header()
    ti_start = r.o
    for _ in range(n_t):  # tensor infos: name, n_dims, dims, type, offset
        r.string()
        nd = r.take("I")
        r.o += 8 * nd + 4 + 8
    ti = b[ti_start:r.o]
    kv = {k: (t, v) for k, t, v in kvs}
    align = kv.get("general.alignment", (T_U32, 32))[1]
    data_start = (r.o + align - 1) // align * align

    tokens = kv["tokenizer.ggml.tokens"][1][1]
    types = kv["tokenizer.ggml.token_type"][1][1]
    merges = kv["tokenizer.ggml.merges"][1][1]
    n = len(markers)
    assert n <= len(merges), "more markers than merge tokens"
    gone = set(tokens[len(tokens) - n:])
    tokens[len(tokens) - n:] = markers
    types[len(types) - n:] = [3] * n
    kv["tokenizer.ggml.merges"][1][1][:] = [m for m in merges if m.replace(" ", "") not in gone]
    tmpl = open(tmpl_file, encoding="utf-8").read()
    out = bytearray(struct.pack("<IIQQ", 0x46554747, 3, n_t, len(kvs)))
    for k, t, v in kvs:
        if k == "tokenizer.chat_template":
            v = tmpl
        if ctx and k.endswith(".context_length"):
            v = ctx
        put_value(out, T_STR, k)
        out += struct.pack("<I", t)
        put_value(out, t, v)
    out += ti
    out += b"\0" * ((-len(out)) % align)
    out += b[data_start:]
    open(dst, "wb").write(out)


if __name__ == "__main__":
    main()
