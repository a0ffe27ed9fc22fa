#!/usr/bin/env python3
"""bench/llama_peer.py — the peer's side of kvd's benchmarks: llama.cpp,
through the low-level API of the llama-cpp-python package, measured on the
same GGUF file, thread count, prompts and greedy decoding as bench/kvd_bench.

Usage mirrors kvd_bench (one figure per run, one JSON object on stdout):

  llama_peer.py --model M --threads N decode --depth D [--tokens T]
  llama_peer.py --model M --threads N prefill --tokens P
  llama_peer.py --model M --threads N batch --seqs S [--depth D] [--tokens T]
  llama_peer.py --model M --threads N prefix --tokens P [--suffix K]

Prompt ids come from the same generator as kvd_bench
(x = x * 1103515245 + 12345 mod 2^32; id = 100 + (x >> 8) % (n_vocab - 200)).
The batch figure puts all sequences in one llama_batch per step, as
llama.cpp's own batched benchmark does. The prefix figure reuses the KV of
a previous request with the same prefix inside one context (llama.cpp's
prompt cache), against a cold context.
"""
import argparse
import json
import resource
import sys
import time

import llama_cpp as L
import numpy as np


def prompt_ids(n, n_vocab, seed):
    x = seed & 0xFFFFFFFF
    out = []
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        out.append(100 + (x >> 8) % (n_vocab - 200))
    return out


class Peer:
    def __init__(self, model, threads, n_ctx, n_seq, n_batch):
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        mp.use_mmap = True
        self.model = L.llama_model_load_from_file(model.encode(), mp)
        if not self.model:
            sys.exit("llama_peer: cannot load %s" % model)
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = min(n_batch, 512)
        cp.n_seq_max = n_seq
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            sys.exit("llama_peer: cannot create a context")
        self.batch = L.llama_batch_init(max(n_batch, n_seq), 0, 1)

    def decode(self, items):
        """items: list of (seq, pos0, tokens, want_logits_of_last)."""
        b = self.batch
        n = 0
        for seq, pos0, toks, want in items:
            for i, t in enumerate(toks):
                b.token[n] = t
                b.pos[n] = pos0 + i
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = seq
                b.logits[n] = 1 if (want and i == len(toks) - 1) else 0
                n += 1
        b.n_tokens = n
        r = L.llama_decode(self.ctx, b)
        if r != 0:
            sys.exit("llama_peer: llama_decode returned %d" % r)

    def argmax(self, i):
        p = L.llama_get_logits_ith(self.ctx, i)
        return int(np.ctypeslib.as_array(p, shape=(self.n_vocab,)).argmax())

    def prefill(self, seq, toks, chunk):
        for p in range(0, len(toks), chunk):
            part = toks[p:p + chunk]
            self.decode([(seq, p, part, p + len(part) == len(toks))])

    def clear(self):
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)


def peak_rss_kib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--depth", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seqs", type=int, default=1)
    ap.add_argument("--suffix", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("figure", choices=["decode", "prefill", "batch", "prefix"])
    a = ap.parse_args()

    if a.figure == "prefill":
        peer = Peer(a.model, a.threads, a.tokens + 16, 1, a.chunk)
        toks = prompt_ids(a.tokens, peer.n_vocab, 1)
        t0 = time.perf_counter()
        peer.prefill(0, toks, a.chunk)
        dt = time.perf_counter() - t0
        print(json.dumps({"figure": "prefill", "tokens": a.tokens, "threads": a.threads, "seconds": dt,
                          "tokens_per_s": a.tokens / dt, "peak_rss_kib": peak_rss_kib()}))
    elif a.figure in ("decode", "batch"):
        seqs = a.seqs if a.figure == "batch" else 1
        peer = Peer(a.model, a.threads, seqs * (a.depth + a.tokens + 16), seqs, a.chunk)
        nxt = []
        for s in range(seqs):
            toks = prompt_ids(a.depth, peer.n_vocab, 1 + s)
            peer.prefill(s, toks, a.chunk)
            nxt.append(peer.argmax(-1))
        t0 = time.perf_counter()
        for step in range(a.tokens):
            peer.decode([(s, a.depth + step, [nxt[s]], True) for s in range(seqs)])
            nxt = [peer.argmax(s) for s in range(seqs)]
        dt = time.perf_counter() - t0
        print(json.dumps({"figure": a.figure, "depth": a.depth, "seqs": seqs, "tokens": a.tokens,
                          "threads": a.threads, "seconds": dt, "tokens_per_s": a.tokens * seqs / dt,
                          "peak_rss_kib": peak_rss_kib()}))
    else:
        n = a.tokens + a.suffix
        peer = Peer(a.model, a.threads, n + 16, 1, a.chunk)
        pa = prompt_ids(a.tokens, peer.n_vocab, 7) + prompt_ids(a.suffix, peer.n_vocab, 8)
        pb = pa[:a.tokens] + prompt_ids(a.suffix, peer.n_vocab, 9)
        t0 = time.perf_counter()
        peer.prefill(0, pa, a.chunk)
        cold = time.perf_counter() - t0
        # warm: keep the shared prefix's KV, drop the old suffix, compute the new one
        t0 = time.perf_counter()
        L.llama_memory_seq_rm(L.llama_get_memory(peer.ctx), 0, a.tokens, -1)
        peer.decode([(0, a.tokens, pb[a.tokens:], True)])
        warm = time.perf_counter() - t0
        print(json.dumps({"figure": "prefix", "prefix_tokens": a.tokens, "suffix_tokens": a.suffix,
                          "hit_tokens": a.tokens, "threads": a.threads, "cold_s": cold, "warm_s": warm,
                          "warm_over_cold": warm / cold, "peak_rss_kib": peak_rss_kib()}))


if __name__ == "__main__":
    main()
