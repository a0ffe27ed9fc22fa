#!/usr/bin/env python3
"""Check kvd's engine against the NumPy reference (ref.py), and check that its
logits do not depend on paging, chunking, threads or batch-mates.

    check.py [--eval PATH] [--tiny-dir DIR] [--model PATH]
             [--part ref-self,tiny,real,inv-tiny,inv-real,isa,arch] [--only VARIANT,...]

The engine is driven by build/tests/kvd_eval (greedy decode; --logits-out
writes one float32 row of n_vocab per step: row 0 at the last prompt
position, row i after generated token i-1).

Parts
  ref-self  the reference on its own: dequantizers vs the gguf package's,
            step-by-step decode vs one teacher-forced pass.
  tiny      every tiny random model from scripts/gen_tiny_models.py (MHA, GQA,
            MQA, untied output, odd sizes, every weight type), 4 token prompts
            each: all logits rows vs the reference, greedy tokens identical.
  real      SmolLM2-135M-Instruct Q4_1 on 5 text prompts tokenized by kvd
            (--prompt; the ChatML one with its special tokens spliced in by
            id), 32 tokens each.
  inv-tiny  invariance on every tiny model: block size 1/16/64, shuffled page
            placement, prompt chunks of 7 and of 1 vs one chunk, 1 vs 2
            threads, batch of 8 different prompts vs solo runs: logits files
            must be bit-identical.
  inv-real  the same on the real model, one prompt (and a batch of 8), 4 tokens.
  arch      the tiny models of the other architectures (gen_tiny_models.py
            ARCH_VARIANTS: qwen2, qwen3, gemma3, llama3, mistral). The
            reference on its own: step-by-step decode equals one teacher-
            forced pass; with sliding windows, a token outside every layer's
            reach changes no logit bit (mistral: reach n_layer * (W - 1)),
            and one inside does; gemma3's global layer sees the whole prompt.
            The engine: a model whose features the CPU backend does not
            implement must be refused with the feature named; one it
            accepts is compared with the reference as in "tiny" (also on
            AVX2 and portable C) and checked for invariance as in
            "inv-tiny".
  kvtype    KV caches of type f32, bf16, q8_0 and q4_0 ([kv] cache_type) on tiny
            models with head sizes of 32 and 64: every logits row against the
            reference storing K/V in the same blocks (ref.kv_store_round),
            greedy tokens identical; q4_0 and bf16 also on AVX2 and
            portable C (bf16 where kvd has AVX-512 BF16: against a reference
            that rounds queries and weights as those products do).
  isa       the CPU backend forced to AVX2 (KVD_CPU_NO_AVX512) and to portable
            C (KVD_CPU_GENERIC) on several tiny models, and AVX2 on one real
            prompt (with "real"): the same comparison with the reference.

How the reference is compared
  The reference is run teacher-forced on the engine's own generated tokens
  (one pass over prompt + generated[:-1]), which gives the reference's logits
  for exactly the contexts the engine saw, so every row can be compared even
  if a token choice differed. The engine's greedy continuation equals the
  reference's own greedy continuation exactly when, at every step, the
  engine's token is the reference's argmax; that is what "greedy identical"
  checks. The reference runs with kv_f16 (K/V rounded to f16 as kvd stores
  them) and act_q8 (int8 activation blocks for Q4_0/Q4_1/Q8_0 matmuls, as
  kvd computes them).

Tolerances (max |logit difference| over a row, in units of that row's
standard deviation over the vocabulary; the largest seen is printed).
  Error sources between two correct implementations: (1) float32 summation
  order (kvd sums in float32 in its own order; the reference uses BLAS, in
  float64 for tiny models, float32 for the 135M model); (2) K/V rounding to
  f16: a last-bit difference in a K or V element can round to the neighbouring
  f16 value, a 2^-11 relative step; (3) int8 activation quantization: a tiny
  difference in an activation can move q = rint(x/d) to the neighbouring
  integer, a step of d = max|x|/127 in that element. (3) is discontinuous and
  compounds through layers: once one element flips, the next layer's inputs
  differ by ~1e-3 and many more elements flip, so after a few layers the two
  implementations see independent quantization noise. Measured between two
  correct runs of the reference itself (float32 vs float64, all else equal;
  and vs llama.cpp for the 135M model):
    float weights (F32/F16/BF16): max 1.1e-3 std      -> TOL 5e-3
    tiny models with Q4_0/Q4_1/Q8_0: max 8e-2 std     -> TOL 0.2
    SmolLM2-135M Q4_1 (30 layers): max 0.63 std, rms 0.24 std over 25
    prompts x 32 steps (kvd vs the reference: the same range;
    llama.cpp vs the reference: max 0.49 std)         -> TOL 1.0 (rms 0.35)
  What the bounds catch: on the float tiny models almost any slip (one that
  moves logits by more than ~1e-3 of their spread). On quantized models a
  wrong block format, RoPE pairing, head grouping or missing step moves logits
  by O(1) std or more; on the 135M model a wrong rope base (1e4 for 1e5) gives
  rms 0.69 std, a wrong RoPE pairing 4.8 std. Smaller slips there (norm eps
  1e-3, K/V kept in f32) stay within its quantization noise (rms <= 0.19 std),
  which is why the float tiny models carry the fine-grained check.
  Greedy tokens: the engine's token must be the reference's argmax. The one
  exception is a near tie: if the reference's logit for the engine's token is
  within TIE of its maximum, the two are indistinguishable at this precision;
  such steps are listed and counted, never silently. TIE (in std units) is
  the measured noise of a top-2 logit gap with margin: 1e-2 for float
  models (gap noise seen 3e-4), 0.2 for tiny quantized models (seen 6.4e-2),
  0.3 for the 135M model (seen 0.18 std = 0.76 logits; kvd's token differed
  from the reference's at gaps up to 0.06 std on prompts not used here).

Exit status: 0 all checks passed, 1 a check failed or kvd_eval is missing
or failed.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import ref  # noqa: E402
import gen_tiny_models  # noqa: E402

TOL_FLOAT, TIE_FLOAT = 5e-3, 1e-2
TOL_QTINY, TIE_QTINY = 0.2, 0.2
TOL_KVQ = 0.02   # float weights, q8_0/q4_0 KV cache (part kvtype)
TOL_REAL, TOL_REAL_RMS, TIE_REAL = 1.0, 0.35, 0.3

N_TINY = 20   # tokens generated per tiny prompt (crosses a 16-token page)
N_REAL = 32
N_INV_REAL = 4

# Five prompts of different kinds. Each was checked to have a greedy path
# whose top-2 logit gaps stay clear of the noise over its 32 tokens (smallest
# gap 0.02 to 0.7 std), so "identical" is decidable for every token. "chatml"
# is a list of segments: its special tokens are spliced in by id (see
# chatml_tokens) and the text between them is tokenized by kvd.
REAL_PROMPTS = [
    ("question", "What is the capital of Japan?"),
    ("code", "def add(a, b):\n    return a + b\n\n\ndef subtract(a, b):\n"),
    ("list", "Here are the months of the year:\n1. January\n2. February\n3."),
    ("chatml", ["<|im_start|>", "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face",
                "<|im_end|>", "\n", "<|im_start|>", "user\nWhat is the boiling point of water?",
                "<|im_end|>", "\n", "<|im_start|>", "assistant\n"]),
    ("paragraph",
     "Bees are flying insects closely related to wasps and ants, and they are known for their "
     "role in pollination. There are more than twenty thousand known species of bees, found on "
     "every continent except Antarctica. The best known is the western honey bee, which lives "
     "in large colonies made up of a single queen, thousands of female workers and, in summer, "
     "a few hundred male drones. Worker bees collect nectar and pollen from flowers, and as they "
     "move from flower to flower they carry pollen that fertilizes the plants. Back in the hive, "
     "the nectar is turned into honey, which the colony stores as food for the winter. Farmers "
     "depend on bees to pollinate many crops, including apples, almonds and blueberries. The "
     "three kinds of bees in a honey bee colony are"),
]
# extra short prompts that only fill the real model's batch of 8
REAL_BATCH_EXTRA = ["Once upon a time", "import numpy as np\n", "The three primary colors are"]


class Failure(Exception):
    pass


def log(msg=""):
    print(msg, flush=True)


# --------------------------------------------------------------------------
# driving kvd_eval


class Engine:
    def __init__(self, exe, tmpdir):
        self.exe = exe
        self.tmp = tmpdir
        self.n_runs = 0
        self.seconds = 0.0

    def run(self, model, tokens=None, prompt=None, batch=None, n_predict=N_TINY, extra=(), env=None):
        """Run kvd_eval; return a list (one per sequence) of dicts with
        prompt_tokens, generated, n_vocab, raw (logits bytes), logits (N, V)."""
        self.n_runs += 1
        out = os.path.join(self.tmp, "logits.%d" % self.n_runs)
        cmd = [self.exe, "--model", model, "--n-predict", str(n_predict), "--logits-out", out]
        if tokens is not None:
            cmd += ["--tokens", ",".join(map(str, tokens))]
        elif prompt is not None:
            cmd += ["--prompt", prompt]
        else:
            bf = os.path.join(self.tmp, "batch.%d" % self.n_runs)
            with open(bf, "w") as f:
                for t in batch:
                    f.write(",".join(map(str, t)) + "\n")
            cmd += ["--batch-file", bf]
        cmd += list(extra)
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, **env) if env else None)
        except subprocess.TimeoutExpired:
            raise Failure("kvd_eval timed out after 300s: %s" % " ".join(_short(c) for c in cmd))
        self.seconds += time.time() - t0
        if p.returncode != 0:
            raise Failure("kvd_eval failed (exit %d): %s\n  stderr: %s" % (
                p.returncode, " ".join(_short(c) for c in cmd), p.stderr.strip()[-2000:]))
        lines = [l for l in p.stdout.splitlines() if l.strip()]
        try:
            res = [json.loads(l) for l in lines]
        except ValueError:
            raise Failure("kvd_eval printed something other than JSON lines: %r" % p.stdout[:300])
        n_seq = 1 if batch is None else len(batch)
        if len(res) != n_seq:
            raise Failure("kvd_eval printed %d JSON objects, expected %d" % (len(res), n_seq))
        for i, r in enumerate(res):
            path = out if batch is None else "%s.%d" % (out, i)
            raw = open(path, "rb").read()
            os.unlink(path)
            V = r["n_vocab"]
            if len(r["generated"]) != n_predict:
                raise Failure("kvd_eval generated %d tokens, asked for %d" % (len(r["generated"]), n_predict))
            if len(raw) != 4 * V * n_predict:
                raise Failure("logits file holds %d bytes, expected %d rows of %d float32" % (len(raw), n_predict, V))
            r["raw"] = raw
            r["logits"] = np.frombuffer(raw, dtype="<f4").reshape(n_predict, V).astype(np.float64)
            if batch is not None and r["prompt_tokens"] != list(batch[i]):
                raise Failure("batch sequence %d: prompt_tokens differ from the batch file line" % i)
        if tokens is not None and res[0]["prompt_tokens"] != list(tokens):
            raise Failure("prompt_tokens %s differ from --tokens" % res[0]["prompt_tokens"][:20])
        return res


def _short(s, n=60):
    s = str(s).replace("\n", "\\n")
    return s if len(s) <= n else s[:n] + "..."


# --------------------------------------------------------------------------
# comparing with the reference


class Stats:
    """Largest differences seen, per model, for the summary."""

    def __init__(self):
        self.rows = {}

    def add(self, model, rel, absd, rms, tol, rows, toks, ties):
        s = self.rows.setdefault(model, dict(rel=0.0, abs=0.0, rms=0.0, tol=tol, rows=0, toks=0, same=0, ties=0))
        s["rel"] = max(s["rel"], rel)
        s["abs"] = max(s["abs"], absd)
        s["rms"] = max(s["rms"], rms)
        s["rows"] += rows
        s["toks"] += toks[1]
        s["same"] += toks[0]
        s["ties"] += ties


def compare(label, m, res, tol, tie, stats, stats_key, tol_rms=None, kv=True):
    """Compare one engine run with the reference teacher-forced on its tokens
    (kv: the reference's KV storage, True for f16 or a kvd KV type name).
    Returns a list of failure strings (empty when it passed)."""
    prompt, gen, got = res["prompt_tokens"], res["generated"], res["logits"]
    if res["n_vocab"] != m.n_vocab:
        return ["%s: n_vocab %d, reference %d" % (label, res["n_vocab"], m.n_vocab)]
    want = m.teacher_forced(prompt, gen, act_q8=True, kv_f16=kv)
    std = want.std(axis=1)
    diff = np.abs(got - want)
    rel_rows = diff.max(axis=1) / std
    rms_rows = np.sqrt((diff ** 2).mean(axis=1)) / std
    fails = []
    worst = int(np.argmax(rel_rows))
    # greedy: engine token vs reference argmax, with near ties listed
    am = want.argmax(axis=1)
    same, ties = 0, []
    for i, t in enumerate(gen):
        if t == am[i]:
            same += 1
            continue
        gap = (want[i, am[i]] - want[i, t]) / std[i]
        if gap <= tie:
            ties.append("step %d: kvd %d, reference %d, gap %.2g std <= %.2g" % (i, t, am[i], gap, tie))
        else:
            fails.append("%s: step %d: kvd chose token %d, reference argmax %d is %.3g std "
                         "(%.3g logits) higher (tie margin %.2g std)" % (
                             label, i, t, am[i], gap, gap * std[i], tie))
    if rel_rows.max() > tol:
        fails.append("%s: logits row %d max|diff| %.4g = %.3g std > tol %.3g std" % (
            label, worst, diff[worst].max(), rel_rows[worst], tol))
    if tol_rms is not None and rms_rows.max() > tol_rms:
        fails.append("%s: logits rms diff %.3g std > tol %.3g std" % (label, rms_rows.max(), tol_rms))
    first = "identical" if same == len(gen) else "%d/%d identical" % (same, len(gen))
    srt = np.sort(want, axis=1)
    min_gap = float(((srt[:, -1] - srt[:, -2]) / std).min())
    log("  %-34s %3d prompt + %2d gen: max|diff| %.3g (%.2e std, tol %.2g)%s; greedy %s%s "
        "(smallest top-2 gap %.2g std)%s" % (
        label, len(prompt), len(gen), diff.max(), rel_rows.max(), tol,
        (", rms %.2e std (tol %.2g)" % (rms_rows.max(), tol_rms)) if tol_rms is not None else "",
        first, (" + %d near tie(s)" % len(ties)) if ties else "", min_gap,
        " FAIL" if fails else ""))
    for t in ties:
        log("      near tie: " + t)
    stats.add(stats_key, float(rel_rows.max()), float(diff.max()), float(rms_rows.max()), tol,
              len(gen), (same, len(gen)), len(ties))
    return fails


def is_quantized(m):
    mats = [m.output] + [w for L in m.layers for w in L.values() if isinstance(w, ref.Weight)]
    return any(w.ggml_type in ref.QUANTIZED for w in mats)


def tiny_prompts(n_vocab, name):
    """Deterministic token prompts: 1, 7, 23 and 45 tokens, and 150 for the
    "hd" models (the longer ones cross 16-token pages and 7-token chunks).
    Ids cover the whole vocab, special tokens included."""
    rng = np.random.default_rng([n_vocab] + list(name.encode()))
    out = []
    # models with the tiled attention kernels also get a prompt longer than
    # one 128-position attention chunk
    for n in (1, 7, 23, 45) + ((150,) if name.startswith("hd") else ()):
        out.append([int(t) for t in rng.integers(0, n_vocab, n)])
    return out


def tiny_batch_extra(n_vocab):
    rng = np.random.default_rng(12345 + n_vocab)
    return [[int(t) for t in rng.integers(0, n_vocab, n)] for n in (2, 16, 17, 33)]


# --------------------------------------------------------------------------
# invariance


INV_VARIANTS = [
    ("block-size 1", ["--block-size", "1"]),
    ("block-size 64", ["--block-size", "64"]),
    ("shuffled pages", ["--shuffle-seed", "1"]),
    ("shuffled, block 1", ["--shuffle-seed", "987654321", "--block-size", "1"]),
    ("chunk 7", ["--chunk", "7"]),
    ("chunk 1", ["--chunk", "1"]),
    ("threads 1", ["--threads", "1"]),
    ("threads 2", ["--threads", "2"]),
]
BATCH_VARIANTS = [
    ("batch of 8", []),
    ("batch of 8, block 1, shuffled, chunk 7", ["--block-size", "1", "--shuffle-seed", "5", "--chunk", "7"]),
]


def bytes_equal(label, a, b):
    """Bit-identical float32 logits; on a difference say where and how much."""
    if a["raw"] == b["raw"]:
        return None
    x, y = a["logits"], b["logits"]
    if x.shape != y.shape:
        return "%s: %d rows vs %d" % (label, x.shape[0], y.shape[0])
    rows = np.nonzero(np.any(np.frombuffer(a["raw"], "<u4").reshape(x.shape) !=
                             np.frombuffer(b["raw"], "<u4").reshape(x.shape), axis=1))[0]
    return "%s: logits differ in rows %s (first at step %d, max|diff| %.3g); tokens %s" % (
        label, [int(r) for r in rows[:8]], int(rows[0]), np.abs(x - y).max(),
        "same" if a["generated"] == b["generated"] else "differ")


def invariance(eng, model_path, label, prompts, base, n_predict, batch_prompts, batch_solo, variants=INV_VARIANTS):
    """base[i]: baseline run of prompts[i]; batch_solo[j]: solo run of batch_prompts[j]."""
    fails = []
    n_cmp = 0
    for vname, extra in variants:
        bad = []
        for p, b in zip(prompts, base):
            r = eng.run(model_path, tokens=p, n_predict=n_predict, extra=extra)[0]
            e = bytes_equal("%s %s (%d-token prompt)" % (label, vname, len(p)), b, r)
            n_cmp += 1
            if e:
                bad.append(e)
        log("  %-28s %-40s %s" % (label, vname + ": %d prompt(s)" % len(prompts),
                                  "bit-identical" if not bad else "DIFFERENT"))
        fails += bad
    for vname, extra in BATCH_VARIANTS:
        res = eng.run(model_path, batch=batch_prompts, n_predict=n_predict, extra=extra)
        bad = [e for e in (bytes_equal("%s %s seq %d (%d tokens)" % (label, vname, i, len(p)), s, r)
                           for i, (p, s, r) in enumerate(zip(batch_prompts, batch_solo, res))) if e]
        n_cmp += len(res)
        log("  %-28s %-40s %s" % (label, vname + " vs solo", "bit-identical" if not bad else "DIFFERENT"))
        fails += bad
    return fails, n_cmp


# --------------------------------------------------------------------------


_MODELS = {}


def load_ref(path, dtype):
    """ref.Model(path, dtype), read once per run: the parts compare against
    the same reference, and the default model's tokenizer and weights take
    seconds to read."""
    key = (os.path.abspath(path), np.dtype(dtype).name)
    if key not in _MODELS:
        _MODELS[key] = ref.Model(path, dtype=dtype)
    return _MODELS[key]


def part_tiny(eng, tiny, stats, do_ref, do_inv):
    fails = []
    n_inv = 0
    for name, path in tiny.items():
        m = ref.Model(path, dtype=np.float64)
        q = is_quantized(m)
        tol, tie = (TOL_QTINY, TIE_QTINY) if q else (TOL_FLOAT, TIE_FLOAT)
        types = sorted(set(m.types.values()))
        log("tiny-%s: %s; types %s" % (name, m.describe(), "/".join(types)))
        prompts = tiny_prompts(m.n_vocab, name)
        base = []
        for p in prompts:
            r = eng.run(path, tokens=p, n_predict=N_TINY)[0]
            base.append(r)
            if do_ref:
                fails += compare("tiny-%s, %d-token prompt" % (name, len(p)), m, r, tol, tie,
                                 stats, "tiny-" + name)
        if do_inv:
            extra = tiny_batch_extra(m.n_vocab)
            solo_extra = [eng.run(path, tokens=p, n_predict=N_TINY)[0] for p in extra]
            f, n = invariance(eng, path, "tiny-" + name, prompts[2:], base[2:], N_TINY,
                              prompts + extra, base + solo_extra)
            fails += f
            n_inv += n
    return fails, n_inv


def part_arch(eng, tiny_dir, stats):
    fails = []
    arch = gen_tiny_models.generate(tiny_dir, list(gen_tiny_models.ARCH_VARIANTS))
    for name, path in arch.items():
        cfg = gen_tiny_models.ARCH_VARIANTS[name]
        m = ref.Model(path, dtype=np.float64)
        log("arch-%s: %s" % (name, m.describe()))
        prompt = tiny_prompts(m.n_vocab, name)[-1]
        gen, rows = m.greedy(prompt, 8, act_q8=True, kv_f16=True)
        tf = m.teacher_forced(prompt, gen, act_q8=True, kv_f16=True)
        d = float(np.abs(rows - tf).max())
        if d > 1e-9:
            fails.append("arch-%s: reference decode and teacher-forced pass differ by %.3g" % (name, d))
        W = cfg.get("window", 0)
        if W:
            # the last position's logits with token 0 changed, and with a
            # token inside every layer's reach changed
            seq = list(prompt) + list(gen)
            last = m.forward(seq, m.new_cache(), want=[len(seq) - 1])[0]
            far = [(seq[0] + 1) % m.n_vocab] + seq[1:]
            near = seq[:-2] + [(seq[-2] + 1) % m.n_vocab] + seq[-1:]
            l_far = m.forward(far, m.new_cache(), want=[len(seq) - 1])[0]
            l_near = m.forward(near, m.new_cache(), want=[len(seq) - 1])[0]
            reach = m.n_layer * (W - 1)
            local_only = cfg["arch"] == "llama"
            if len(seq) - 1 <= reach:
                fails.append("arch-%s: prompt of %d tokens is within the window reach %d" % (name, len(seq), reach))
            if local_only and not np.array_equal(last, l_far):
                fails.append("arch-%s: a token outside every window changed the logits" % name)
            if not local_only and np.array_equal(last, l_far):
                fails.append("arch-%s: the global layer does not see the first token" % name)
            if np.array_equal(last, l_near):
                fails.append("arch-%s: a token inside the window changed nothing" % name)
            log("  window %d, reach %d over %d tokens: far change %s, near change %s" % (
                W, reach, len(seq), "no effect" if np.array_equal(last, l_far) else "effect",
                "no effect" if np.array_equal(last, l_near) else "effect"))
        # the engine: refused with the feature named, or compared
        try:
            r = eng.run(path, tokens=prompt, n_predict=N_TINY)[0]
        except Failure as e:
            msg = str(e)
            if "does not implement" in msg:
                log("  engine refuses it: %s" % msg.split("stderr: ")[-1].split(": ", 1)[-1])
                continue
            fails.append("arch-%s: %s" % (name, msg))
            continue
        q = is_quantized(m)
        tol, tie = (TOL_QTINY, TIE_QTINY) if q else (TOL_FLOAT, TIE_FLOAT)
        fails += compare("arch-%s, %d-token prompt" % (name, len(prompt)), m, r, tol, tie, stats, "arch-" + name)
        # the other instruction sets against the reference, then invariance
        for isa, env in ISA_VARIANTS:
            ri = eng.run(path, tokens=prompt, n_predict=N_TINY, env=env)[0]
            fails += compare("arch-%s %s" % (name, isa), m, ri, tol, tie, stats, "arch-%s-%s" % (name, isa))
        prompts = tiny_prompts(m.n_vocab, name)
        base = [eng.run(path, tokens=p, n_predict=N_TINY)[0] for p in prompts]
        f, n = invariance(eng, path, "arch-" + name, prompts[2:], base[2:], N_TINY, prompts, base)
        fails += f
    return fails


# KV element types ([kv] cache_type): the engine with a quantized (or f32)
# cache against the reference storing the same blocks (ref.kv_store_round),
# on tiny models whose head size is a multiple of 32, with the portable
# build too (the quantized products are the same code in every build).
KV_TYPES = ("f32", "q8_0", "q4_0", "bf16")


def cpu_has_bf16_products():
    """Whether kvd's CPU backend computes a bf16 cache's attention with
    AVX-512 BF16 products here (then, for head sizes 64, 128 and 256, the
    reference rounds as they do; other sizes take the float products)."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return all(f in flags.split() for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"))
KV_TINY = ("gqa", "mqa", "odd", "type-f32", "type-q4_0", "hd64")


def part_kvtype(eng, tiny, stats):
    fails = []
    for name in KV_TINY:
        if name not in tiny:
            continue
        m = ref.Model(tiny[name], dtype=np.float64)
        q = is_quantized(m)
        log("tiny-%s: %s" % (name, m.describe()))
        for p in tiny_prompts(m.n_vocab, name)[2:]:
            for kv in KV_TYPES:
                # q8_0/q4_0 round like int8 activations do: a last-bit
                # difference can move a quant by one step, which on float
                # weights was seen to move logits by up to 9e-3 std (and
                # 1e-5 std without such a step). The bound tells the types
                # apart: the q8_0 engine against an f16 reference differs
                # by 4e-2 std (tiny-hd64), q4_0 by 0.7 std; a wrong scale,
                # nibble order or block moves logits by O(0.1..1) std
                # bf16: the reference rounds K/V, and where kvd uses the
                # bfloat16 products, the queries and weights as they do
                # (kv "bf16-products"); the products' float sums and the
                # exp then differ by float rounding only
                # (a last-bit difference in a sum can move a query element's
                # or a weight's rounding by one bfloat16 step, 2^-8: seen to
                # move logits of the float tiny models by up to 1.4e-2 std,
                # hence TOL_KVQ; the bfloat16 products are checked exactly
                # against float64 in tests/unit/test_cpu_ops.c)
                variants = (("", None),) + (tuple(ISA_VARIANTS) if kv == "bf16" else tuple(ISA_VARIANTS[1:]) if kv == "q4_0" else ())
                for isa, env in variants:
                    rkv = ("bf16-products" if kv == "bf16" and not isa and cpu_has_bf16_products()
                           and m.head_dim in (64, 128, 256) else kv)
                    tol, tie = ((TOL_QTINY, TIE_QTINY) if q else (TOL_FLOAT, TIE_FLOAT) if rkv in ("f32", "bf16")
                                else (TOL_KVQ, TIE_QTINY))
                    r = eng.run(tiny[name], tokens=p, n_predict=N_TINY, extra=["--cache-type", kv], env=env)[0]
                    fails += compare("tiny-%s kv %s%s, %d-token prompt" % (name, rkv, " " + isa if isa else "", len(p)),
                                     m, r, tol, tie, stats, "kv %s tiny" % kv, kv=rkv)
    return fails


# The CPU backend's other instruction sets, forced through its environment
# switches: each must match the reference on its own (the default run above
# uses the best the machine has).
ISA_VARIANTS = [("avx2", {"KVD_CPU_NO_AVX512": "1"}), ("generic", {"KVD_CPU_GENERIC": "1"})]
ISA_TINY = ("gqa", "mqa", "odd", "hd64", "hd128", "type-q4_0", "type-bf16", "kquant")


def part_isa(eng, tiny, model_path, stats):
    fails = []
    for isa, env in ISA_VARIANTS:
        for name in ISA_TINY:
            if name not in tiny:
                continue
            m = ref.Model(tiny[name], dtype=np.float64)
            tol, tie = (TOL_QTINY, TIE_QTINY) if is_quantized(m) else (TOL_FLOAT, TIE_FLOAT)
            p = tiny_prompts(m.n_vocab, name)[-1]
            r = eng.run(tiny[name], tokens=p, n_predict=N_TINY, env=env)[0]
            fails += compare("%s: tiny-%s, %d-token prompt" % (isa, name, len(p)), m, r, tol, tie,
                             stats, "%s tiny" % isa)
        if isa == "avx2" and model_path and os.path.exists(model_path):
            m = load_ref(model_path, np.float32)
            tag, text = REAL_PROMPTS[0]
            r = eng.run(model_path, prompt=text, n_predict=N_INV_REAL * 2, env=env)[0]
            fails += compare("%s: %s" % (isa, _short(text, 24)), m, r, TOL_REAL, TIE_REAL, stats,
                             "%s %s" % (isa, os.path.basename(model_path)), tol_rms=TOL_REAL_RMS)
            del m
    return fails


def chatml_tokens(eng, model_path, segments):
    """Token ids of a ChatML prompt: special-token segments by their id in the
    GGUF vocabulary, the text between them tokenized by kvd (--prompt), each
    piece on its own -- how a tokenizer that parses special tokens splits such
    text."""
    import gguf
    f = gguf.GGUFReader(model_path).fields["tokenizer.ggml.tokens"]
    vocab = {bytes(f.parts[i]).decode("utf-8", "replace"): n for n, i in enumerate(f.data)}
    out = []
    for seg in segments:
        if seg in vocab and seg.startswith("<|"):
            out.append(vocab[seg])
        else:
            out += eng.run(model_path, prompt=seg, n_predict=1)[0]["prompt_tokens"]
    return out


def part_ref_self(tiny, model_path):
    """Checks of the reference on its own: its dequantizers agree bit for bit
    with the gguf package's (an independent implementation of the same block
    formats), and a step-by-step greedy decode gives the same tokens and
    logits as one teacher-forced pass."""
    import gguf
    from gguf.quants import dequantize as gguf_dequantize
    fails = []
    files = list(tiny.values()) + ([model_path] if os.path.exists(model_path) else [])
    n, types = 0, set()
    for path in files:
        r = gguf.GGUFReader(path)
        for t in r.tensors:
            # the 135M model: the embedding and one layer cover its types
            if path == model_path and not (t.name.startswith("blk.0.") or "token_embd" in t.name):
                continue
            mine = ref.dequantize(t.data, int(t.tensor_type), int(np.prod(t.shape)))
            theirs = np.asarray(gguf_dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
            n += 1
            types.add(t.tensor_type.name)
            if mine.shape != theirs.shape or not np.array_equal(mine, theirs):
                fails.append("reference dequantize differs from gguf's for %s in %s" % (t.name, path))
    log("  reference dequantizers: %d tensors (%s) bit-identical to gguf.quants%s" % (
        n, "/".join(sorted(types)), "" if not fails else " -- NOT"))
    worst = 0.0
    for name, path in tiny.items():
        m = ref.Model(path)
        p = tiny_prompts(m.n_vocab, name)[1]
        gen, rows = m.greedy(p, 8)
        tf = m.teacher_forced(p, gen)
        worst = max(worst, float(np.abs(rows - tf).max()))
        if list(tf.argmax(axis=1)) != gen or np.abs(rows - tf).max() > 1e-9:
            fails.append("reference: greedy steps and teacher-forced pass disagree on tiny-%s" % name)
    log("  reference step-by-step vs one-pass logits: max|diff| %.2g on %d tiny models" % (worst, len(tiny)))
    return fails


def part_real(eng, model_path, stats, do_ref, do_inv):
    fails = []
    t0 = time.time()
    runs = []
    for tag, text in REAL_PROMPTS:
        if isinstance(text, list):
            toks = chatml_tokens(eng, model_path, text)
            runs.append(eng.run(model_path, tokens=toks, n_predict=N_REAL)[0])
        else:
            runs.append(eng.run(model_path, prompt=text, n_predict=N_REAL)[0])
    t_eng = time.time() - t0
    name = os.path.basename(model_path)
    if do_ref:
        t0 = time.time()
        m = load_ref(model_path, np.float32)
        log("%s: %s (reference load + dequantize %.1fs, engine %.1fs for %d prompts)" % (
            name, m.describe(), time.time() - t0, t_eng, len(runs)))
        for (tag, text), r in zip(REAL_PROMPTS, runs):
            shown = "".join(text) if isinstance(text, list) else text
            fails += compare("%s: %s" % (tag, _short(shown, 24)), m, r, TOL_REAL, TIE_REAL, stats, name,
                             tol_rms=TOL_REAL_RMS)
        del m
    n_inv = 0
    if do_inv:
        # one prompt through every variant; a batch of 8 vs solo runs
        inv_idx = 3  # the ChatML prompt
        p = runs[inv_idx]["prompt_tokens"]
        base = eng.run(model_path, tokens=p, n_predict=N_INV_REAL)[0]
        # the first rows of a longer run are the same computation
        if base["raw"] != runs[inv_idx]["raw"][:len(base["raw"])]:
            fails.append("real: %d-token run's logits differ from the first rows of the %d-token run" % (
                N_INV_REAL, N_REAL))
        batch = [r["prompt_tokens"] for r in runs]
        for text in REAL_BATCH_EXTRA:
            batch.append(eng.run(model_path, prompt=text, n_predict=1)[0]["prompt_tokens"])
        solo = [eng.run(model_path, tokens=b, n_predict=N_INV_REAL)[0] for b in batch]
        variants = [v for v in INV_VARIANTS if v[0] != "chunk 1"]
        f, n_inv = invariance(eng, model_path, name, [p], [base], N_INV_REAL, batch, solo, variants)
        fails += f
    return fails, n_inv


def main():
    ap = argparse.ArgumentParser(description="kvd engine vs NumPy reference, and invariance")
    build = os.environ.get("KVD_BUILD", "build")
    ap.add_argument("--eval", default=os.path.join(ROOT, build, "tests", "kvd_eval"))
    ap.add_argument("--tiny-dir", default=os.path.join(ROOT, build, "tiny-models"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--part", default="ref-self,tiny,real,inv-tiny,inv-real,isa,arch,kvtype")
    ap.add_argument("--only", help="comma-separated tiny variants (default all)")
    a = ap.parse_args()
    parts = set(a.part.split(","))
    t_start = time.time()

    if not os.access(a.eval, os.X_OK):
        log("FAIL: engine driver %s is missing (run make)" % a.eval)
        return 1
    if ("real" in parts or "inv-real" in parts) and not os.path.exists(a.model):
        log("FAIL: model %s is missing (run scripts/setup)" % a.model)
        return 1

    fails = []
    stats = Stats()
    n_inv = 0
    with tempfile.TemporaryDirectory(prefix="kvd-ref-") as tmp:
        eng = Engine(a.eval, tmp)
        try:
            if parts & {"ref-self", "tiny", "inv-tiny", "isa", "kvtype"}:
                names = a.only.split(",") if a.only else None
                tiny = gen_tiny_models.generate(a.tiny_dir, names)
                log("== tiny models in %s: %s" % (a.tiny_dir, ", ".join(tiny)))
                if "ref-self" in parts:
                    fails += part_ref_self(tiny, a.model)
                if parts & {"tiny", "inv-tiny"}:
                    f, n = part_tiny(eng, tiny, stats, "tiny" in parts, "inv-tiny" in parts)
                    fails += f
                    n_inv += n
                if "isa" in parts:
                    log("== other instruction sets (%s)" % ", ".join(i for i, _ in ISA_VARIANTS))
                    fails += part_isa(eng, tiny, a.model if "real" in parts else None, stats)
                if "kvtype" in parts:
                    log("== KV element types (%s) against the reference storing the same blocks" % ", ".join(KV_TYPES))
                    fails += part_kvtype(eng, tiny, stats)
            if "arch" in parts:
                log("== other architectures")
                fails += part_arch(eng, a.tiny_dir, stats)
            if "real" in parts or "inv-real" in parts:
                log("== real model")
                f, n = part_real(eng, a.model, stats, "real" in parts, "inv-real" in parts)
                fails += f
                n_inv += n
        except Failure as e:
            fails.append(str(e))

    log("")
    log("== summary (logit differences vs reference, in std of each row's logits)")
    for k, s in stats.rows.items():
        log("  %-36s largest max|diff| %.3g = %.2e std (tol %.2g), rms %.2e std; "
            "%d rows; greedy tokens %d/%d identical, %d near ties" % (
                k, s["abs"], s["rel"], s["tol"], s["rms"], s["rows"], s["same"], s["toks"], s["ties"]))
    if n_inv:
        log("  invariance: %d logits files compared bit for bit" % n_inv)
    log("  %d kvd_eval runs, %.1fs in the engine; total %.1fs" % (eng.n_runs, eng.seconds, time.time() - t_start))
    if fails:
        log("")
        log("FAILED (%d):" % len(fails))
        for f in fails:
            log("  " + f)
        return 1
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
