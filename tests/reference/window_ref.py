"""Streaming reference for kvd's context-window policies (sliding window and
attention sinks), and the test that checks kvd's engine against it.

The reference shares nothing with kvd's C code but ref.py's model reading:
it keeps, for every token still in the cache, its K before RoPE and its V as
computed when the token was fed (so deeper layers' K/V reflect the context
that token saw then: StreamingLLM's semantics), drops the oldest window
tokens by the policy's rule, and at every step rotates the cached keys at
their *current* index in the cache (positions always contiguous 0..n-1),
rounding K and V to float16 as kvd's cache stores them. kvd instead keeps
keys rotated at their position and re-rotates them by -delta when tokens
before them are dropped; the two agree up to float16 rounding.

The policy rule (daemon/engine.h): the first `sink` tokens (the sinks, whole
pages) are never dropped; the window after them grows to max_window tokens;
before a token would make it max_window + 1, the oldest block_size window
tokens go.

Checks (each fails the run):
* logits at sampled stream positions match the reference within check.py's
  tolerance for the model's type (float: 5e-3 std, quantized tiny: 0.2 std);
* greedy generation follows the reference's argmax (or a near tie);
* the surviving tokens are the first S (rounded to a page) and the last
  max_window - block_size + 1 or more, exactly the reference's;
* pages in use stay flat: the same maximum for a stream of 1x and 3x the
  model's context, and within the bound sink pages + max_window / block_size;
* positions stay within the model's context although the stream is 3x it.

    window_ref.py [--build DIR] [--tiny-dir DIR]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import ref  # noqa: E402
import gen_tiny_models  # noqa: E402

TOL_FLOAT, TIE_FLOAT = 5e-3, 1e-2   # as check.py
TOL_QTINY, TIE_QTINY = 0.2, 0.2
# Against keys rotated afresh at their current position: kvd's cached keys
# are rounded to f16 once more at every drop they survive (up to
# max_window / block_size times), which the fresh reference does not do.
TOL_FRESH = 2e-2


class StreamCache:
    """Per layer: pre-RoPE K (float64) and f16-rounded V of the tokens kept,
    with their stream indices. With rerotate set it also keeps K the way a
    cache of rotated f16 keys must: rotated at the position it was fed at,
    rounded, and on every drop rotated again by -n positions and rounded
    again (kvd's arithmetic, computed here in float64 from the formula)."""

    def __init__(self, m, rerotate):
        self.m = m
        # arrays grown by doubling, the first n[l] rows in use (a list of
        # rows stacked at every step cost more than the arithmetic)
        shape = (64, m.n_head_kv, m.head_dim)
        self.k = [np.empty(shape) for _ in range(m.n_layer)]
        self.kr = [np.empty(shape) for _ in range(m.n_layer)]
        self.v = [np.empty(shape) for _ in range(m.n_layer)]
        self.n = [0] * m.n_layer
        self.idx = []
        self.rerotate = rerotate

    def __len__(self):
        return len(self.idx)

    def append(self, l, k, kr, v):
        n = self.n[l]
        if n == len(self.k[l]):
            for a in (self.k, self.kr, self.v):
                a[l] = np.concatenate([a[l], np.empty_like(a[l])])
        self.k[l][n], self.kr[l][n], self.v[l][n] = k, kr, v
        self.n[l] = n + 1

    def drop(self, first, n):
        for l in range(len(self.k)):
            cnt = self.n[l]
            for a in (self.k, self.kr, self.v):
                a[l][first:cnt - n] = a[l][first + n:cnt].copy()
            cnt -= n
            self.n[l] = cnt
            if self.rerotate and cnt > first:
                _, base, pos_scale = self.m.layer_attn[l]
                moved = self.m._rope(self.kr[l][first:cnt].copy(), np.full(cnt - first, -n), base, pos_scale)
                self.kr[l][first:cnt] = moved.astype(np.float16).astype(np.float64)
        del self.idx[first:first + n]


def stream_step(m, tok, stream_index, cache, act_q8=True):
    """Feed one token at position len(cache); return its logits (float64)."""
    H, HKV, D = m.n_head, m.n_head_kv, m.head_dim
    group = H // HKV
    pos = len(cache)
    x = (m.tok_embd[[tok]].astype(np.float64) * m.embd_scale).astype(m.dtype)
    for li, L in enumerate(m.layers):
        window, base, pos_scale = m.layer_attn[li]
        assert not window, "model-level sliding windows are not part of this check"
        h = m._rmsnorm(x, L["attn_norm"])
        q, k, v = L["wq"](h, act_q8), L["wk"](h, act_q8), L["wv"](h, act_q8)
        if L["bq"] is not None:
            q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
        q = q.reshape(1, H, D).astype(m.dtype)
        k = k.reshape(1, HKV, D).astype(m.dtype)
        v = v.reshape(1, HKV, D).astype(m.dtype)
        if L["q_norm"] is not None:
            q = m._rmsnorm(q, L["q_norm"])
            k = m._rmsnorm(k, L["k_norm"])
        kr = m._rope(k, np.array([pos]), base, pos_scale)
        cache.append(li, k[0].astype(np.float64), kr[0].astype(np.float16).astype(np.float64),
                     v[0].astype(np.float16).astype(np.float64))
        n = cache.n[li]
        if cache.rerotate:
            K = cache.kr[li][:n]
        else:  # every key rotated afresh at its current index
            K = m._rope(cache.k[li][:n], np.arange(n), base, pos_scale).astype(np.float16).astype(np.float64)
        V = cache.v[li][:n]
        q = m._rope(q, np.array([pos]), base, pos_scale)
        att = np.empty((1, H, D))
        for kh in range(HKV):
            qh = q[:, kh * group:(kh + 1) * group, :].astype(np.float64)
            s = np.einsum("tgd,sd->tgs", qh, K[:, kh, :]) * m.attn_scale
            s = s - s.max(axis=-1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(axis=-1, keepdims=True)
            att[:, kh * group:(kh + 1) * group, :] = np.einsum("tgs,sd->tgd", p, V[:, kh, :])
        o = L["wo"](att.reshape(1, H * D).astype(m.dtype), act_q8)
        if L["post_attn_norm"] is not None:
            o = m._rmsnorm(o, L["post_attn_norm"])
        x = x + o
        h = m._rmsnorm(x, L["ffn_norm"])
        g = L["gate"](h, act_q8).astype(np.float64)
        u = L["up"](h, act_q8).astype(np.float64)
        if m.geglu:
            act = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))
        else:
            act = g / (1.0 + np.exp(-g))
        f = L["down"]((act * u).astype(m.dtype), act_q8)
        if L["post_ffn_norm"] is not None:
            f = m._rmsnorm(f, L["post_ffn_norm"])
        x = x + f
    cache.idx.append(stream_index)
    h = m._rmsnorm(x, m.out_norm)
    return m.output(h, act_q8).astype(np.float64)[0]


def reference_stream(m, stream, sink, max_window, bs, want, rerotate):
    """Feed the stream token by token under the policy; return ({position:
    logits row} for positions in want, surviving stream indices, largest
    cache length)."""
    cache = StreamCache(m, rerotate)
    rows, longest = {}, 0
    want = set(want)
    for t, tok in enumerate(stream):
        if len(cache) >= sink + max_window:
            cache.drop(sink, bs)
        row = stream_step(m, tok, t, cache)
        longest = max(longest, len(cache))
        if t in want:
            rows[t] = row
    return rows, list(cache.idx), longest


def run_kvd(exe, model, toks, policy, window, sinks, bs, at, tmp, n_gen=0, chunk=1):
    tf = os.path.join(tmp, "toks")
    with open(tf, "w") as f:
        f.write(",".join(map(str, toks)))
    out = os.path.join(tmp, "logits")
    cmd = [exe, "--model", model, "--tokens-file", tf, "--policy", policy, "--window", str(window),
           "--sinks", str(sinks), "--block-size", str(bs), "--generate", str(n_gen), "--chunk", str(chunk)]
    if at:
        cmd += ["--logits-at", ",".join(map(str, at)), "--logits-out", out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("kvd_stream failed: %s\n%s" % (" ".join(cmd), p.stderr))
    res = json.loads(p.stdout)
    if at:
        res["logits"] = np.fromfile(out, dtype=np.float32).reshape(len(at), res["n_vocab"]).astype(np.float64)
    return res


def check_case(exe, path, name, policy, window, sinks, bs, n_ctx, tmp, gen, quantized):
    fails = []
    m = ref.Model(path)
    rng = np.random.default_rng(zlib.crc32(("%s/%s/%d" % (name, policy, window)).encode()))
    n_stream = 3 * n_ctx
    sink = ((sinks + bs - 1) // bs) * bs if policy == "sinks" else 0
    max_window = window + bs - 1
    assert sink + max_window <= n_ctx
    at = sorted(set(list(range(n_ctx // 2, n_stream, n_ctx // 2)) + [n_stream - 1]) - {n_stream})
    at = [a for a in at if a < n_stream]
    if gen:  # a short prompt, then greedy generation to 3x the context
        prompt = [int(x) for x in rng.integers(3, m.n_vocab, 8)]
        res = run_kvd(exe, path, prompt, policy, window, sinks, bs, at, tmp, n_gen=n_stream - len(prompt))
        stream = prompt + res["generated"]
    else:    # a fixed token stream, teacher-forced, prefilled in chunks of 40
        stream = [int(x) for x in rng.integers(3, m.n_vocab, n_stream)]
        res = run_kvd(exe, path, stream, policy, window, sinks, bs, at, tmp, chunk=40)
    assert len(stream) == n_stream
    want, surv, longest = reference_stream(m, stream, sink, max_window, bs, at, rerotate=True)
    fresh, _, _ = reference_stream(m, stream, sink, max_window, bs, at, rerotate=False)
    tol, tie = (TOL_QTINY, TIE_QTINY) if quantized else (TOL_FLOAT, TIE_FLOAT)
    tol_fresh = TOL_QTINY if quantized else TOL_FRESH
    worst = worst_fresh = 0.0
    for i, a in enumerate(at):
        got, w = res["logits"][i], want[a]
        std = w.std()
        rel = np.abs(got - w).max() / std
        rel_fresh = np.abs(got - fresh[a]).max() / fresh[a].std()
        worst = max(worst, rel)
        worst_fresh = max(worst_fresh, rel_fresh)
        if rel > tol:
            fails.append("%s %s: logits after stream position %d differ by %.3g std > %.3g" % (
                name, policy, a, rel, tol))
        if rel_fresh > tol_fresh:
            fails.append("%s %s: logits after stream position %d differ from keys rotated afresh at "
                         "contiguous positions by %.3g std > %.3g" % (name, policy, a, rel_fresh, tol_fresh))
        if gen and a + 1 < n_stream:
            t = stream[a + 1]
            if t != int(np.argmax(w)) and (w.max() - w[t]) / std > tie:
                fails.append("%s %s: generated %d at %d, reference argmax %d (gap %.3g std)" % (
                    name, policy, t, a + 1, int(np.argmax(w)), (w.max() - w[t]) / std))
    # which tokens survive: the reference's, and by the rule itself
    kvd_surv = list(range(sink)) + list(range(sink + res["dropped_tokens"], n_stream))
    if kvd_surv != surv:
        fails.append("%s %s: kvd keeps %d tokens (dropped %d), the reference %d" % (
            name, policy, len(kvd_surv), res["dropped_tokens"], len(surv)))
    tail = n_stream - (sink + res["dropped_tokens"])
    if not (window <= tail <= max_window) or res["kv_tokens"] != sink + tail:
        fails.append("%s %s: %d window tokens kept, expected %d..%d" % (name, policy, tail, window, max_window))
    if longest > n_ctx:
        fails.append("%s %s: positions reached %d > context %d" % (name, policy, longest, n_ctx))
    # memory: bounded, and flat from 1x to 3x the context
    bound = sink // bs + (max_window + bs - 1) // bs
    if res["pages_used_max"] > bound:
        fails.append("%s %s: %d pages in use > bound %d" % (name, policy, res["pages_used_max"], bound))
    short = run_kvd(exe, path, stream[:n_ctx], policy, window, sinks, bs, [], tmp, chunk=40)
    if short["pages_used_max"] != res["pages_used_max"]:
        fails.append("%s %s: pages in use grew from %d (1x context) to %d (3x)" % (
            name, policy, short["pages_used_max"], res["pages_used_max"]))
    print("  %-8s %-14s %s %d tokens (3x ctx %d), W %d, sinks %d: logits max|diff| %.2e std (tol %.0e), "
          "vs fresh rotation %.2e std (tol %.0e), at %d points; kept %d (dropped %d); pages max %d (1x ctx: %d, "
          "bound %d)%s" % (
              name, policy, "generated" if gen else "fed", n_stream, n_ctx, window, sink, worst, tol,
              worst_fresh, tol_fresh, len(at),
              res["kv_tokens"], res["dropped_tokens"], res["pages_used_max"], short["pages_used_max"], bound,
              " FAIL" if fails else ""))
    sys.stdout.flush()
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("KVD_BUILD", "build"))
    ap.add_argument("--tiny-dir", default=None)
    a = ap.parse_args()
    exe = os.path.join(a.build, "tests", "kvd_stream")
    if not os.access(exe, os.X_OK):
        print("FAIL: %s missing (run make)" % exe)
        return 1
    with tempfile.TemporaryDirectory(prefix="kvd-window-") as tmp:
        tiny_dir = a.tiny_dir or os.path.join(tmp, "tiny")
        paths = gen_tiny_models.generate(tiny_dir, ["mha", "qwen2", "llama3"])
        n_ctx = 512  # the tiny models' context_length
        cases = [
            # model, policy, window, sinks, block size, generate?, quantized?
            ("mha", "sliding-window", 100, 0, 16, True, False),
            ("mha", "sinks", 100, 4, 16, True, False),
            ("mha", "sinks", 450, 4, 16, False, False),
            ("qwen2", "sinks", 120, 4, 8, False, True),      # NEOX pairs, biases, q8_0
            ("llama3", "sinks", 90, 20, 16, False, False),   # rope_freqs, linear scaling
            ("llama3", "sliding-window", 64, 0, 16, True, False),
        ]
        fails = []
        for name, policy, window, sinks, bs, gen, q in cases:
            fails += check_case(exe, paths[name], name, policy, window, sinks, bs, n_ctx, tmp, gen, q)
    for f in fails:
        print("FAIL: " + f)
    print("window policies vs streaming reference: %s" % ("FAILED" if fails else "ok"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
