#!/usr/bin/env python3
"""Evaluation report: the quality of a model's next-token distributions
under each of kvd's cache policies, against the memory each policy keeps.

    bench/eval/report.py --model PATH --out DIR [--tokens N] [--quick] [--threads N]

Every figure comes from tests/tools/kvd_policy_eval (kvd's own engine, CPU
backend), which feeds a text teacher-forced to a reference engine (f32 K/V,
full attention) and to one engine per policy in the same steps, and
compares their distributions position by position. Writes into DIR:

  policies.csv  one row per run: KV type, policy, window, sinks, the most
                pool bytes held (kv_bytes_peak), K/V bytes read per scored
                token, perplexity, mean/max KL(p_f32 || p_run) in nats,
                top-1 agreement with f32; the K/V bytes held per layer
                group (Gemma 3: local layers keep at most their window)
  prefix.csv    per KV type: a request whose first tokens come from pages
                another request left in the prefix cache against the same
                request computed alone, logits rows compared bit for bit
  needles.csv   per run and planted fact: the distance in tokens from the
                fact to its question, and whether every token of the
                answer is the run's argmax (teacher-forced greedy recall)
  roles.csv     per run and role of a chat (system prompt, quoted
                document, question, generated reply): mean loss of the
                role's tokens under the run and under f32, and mean KL
  *.png         the plots (matplotlib), report.md the page

--only RUN,...: measure those runs again in the policy sweep, the needles
and the roles, replace their rows in DIR's CSV files, and redraw.

--replot: redraw the plots and the page from DIR's CSV files and meta.json
(written by every run: label, tokens, seconds, the chat's role spans, the
command), without running anything.

--quick: a few seconds (the policy table on a short prefix of the text,
two runs, and the prefix check), for tests/integration/t_eval_quick.sh.
Texts: tests/data/text/lighthouse.txt and bench/eval/texts/ (README).
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXTS = os.path.join(ROOT, "bench", "eval", "texts")
MAIN_TEXT = os.path.join(ROOT, "tests", "data", "text", "lighthouse.txt")
TYPES = ["f16", "bf16", "q8_0", "q4_0"]

POLICY_COLS = ["model", "run", "kv_type", "policy", "window", "sinks", "kv_bytes_peak", "kv_bytes_per_token",
               "read_bytes_per_token", "kv_slots_mean", "ppl", "ppl_ref", "kl_mean", "kl_max", "top1", "scored",
               "restarts", "kv_bytes_by_group"]
PREFIX_COLS = ["model", "kv_type", "prefix_tokens", "hit_tokens", "request_tokens", "compared_rows",
               "identical_rows", "max_abs_diff", "bit_identical"]
NEEDLE_COLS = ["model", "run", "doc", "place", "distance", "answer_tokens", "recovered"]
ROLE_COLS = ["model", "run", "role", "tokens", "nll", "nll_ref", "delta_nll", "kl_mean"]


class Tool:
    def __init__(self, a):
        self.exe = os.path.join(a.build, "tests", "kvd_policy_eval")
        self.stream = os.path.join(a.build, "tests", "kvd_stream")
        self.model, self.threads, self.tmp = a.model, a.threads, a.tmp

    def call(self, args, what):
        cmd = ["nice", self.exe, "--model", self.model, "--threads", str(self.threads)] + args
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            sys.exit("kvd_policy_eval (%s) failed: %s\n%s" % (what, " ".join(cmd), p.stderr))
        return p.stdout, p.stderr

    def tokenize(self, parts):
        """Token ids of each part (BOS before the first where the model wants one)."""
        path = os.path.join(self.tmp, "parts.txt")
        with open(path, "wb") as f:
            f.write(b"\x1e".join(x.encode() for x in parts))
        out, _ = self.call(["--tokenize", path], "tokenize")
        lines = out.split("\n")[:len(parts)]
        return [[int(x) for x in l.split(",")] if l else [] for l in lines]

    def write_ids(self, ids, name):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(",".join(map(str, ids)))
        return path

    def evaluate(self, ids, runs, name, score=None):
        """Summaries (by run) and rows (by run: list of (pos, nll, nll_ref, kl, top1, hit))."""
        rows_path = os.path.join(self.tmp, name + ".rows.csv")
        args = ["--tokens-file", self.write_ids(ids, name + ".ids"), "--rows", rows_path]
        for r in runs:
            args += ["--run", r]
        if score:
            args += ["--score", ",".join("%d-%d" % s for s in score)]
        out, err = self.call(args, name)
        for line in err.splitlines():
            print("  (%s) %s" % (name, line))
        summ = {}
        for line in out.splitlines():
            j = json.loads(line)
            summ[j["run"]] = j
        rows = {}
        with open(rows_path) as f:
            for r in csv.DictReader(f):
                rows.setdefault(r["run"], []).append((int(r["pos"]), float(r["nll"]), float(r["nll_ref"]),
                                                      float(r["kl"]), int(r["top1"]), int(r["hit"])))
        return summ, rows


ONLY = None  # --only: the runs measured again; other rows of the CSV files stay


def write_csv(path, cols, rows):
    if ONLY is not None and os.path.exists(path) and "run" in cols:
        again = set(ONLY) | {"f32/full"}
        kept = [r for r in csv.DictReader(open(path)) if r["run"] not in again]
        rows = kept + list(rows)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in cols})


def only(runs):
    return runs if ONLY is None else [r for r in runs if r in ONLY]


def policy_runs(a):
    if a.quick:
        return ["f16/full", "f16/window/32", "f16/truncate/64"]
    runs = ["%s/full" % t for t in TYPES]
    for w in a.windows:
        runs += ["f16/window/%d" % w, "f16/sinks/%d/4" % w]
    runs += ["f16/truncate/%d" % w for w in a.windows[1:]]
    return runs


def part_policies(a, tool, label):
    ids = tool.tokenize([open(MAIN_TEXT).read()])[0][:a.tokens]
    summ, _ = tool.evaluate(ids, only(policy_runs(a)), "policies")
    out = []
    for run, j in summ.items():
        if "error" in j:
            out.append({"model": label, "run": run, "policy": "not run: " + j["error"]})
            continue
        row = {k: j[k] for k in POLICY_COLS if k in j}
        row.update(model=label, run=run,
                   kv_bytes_by_group=" ".join("%sx%d:%d" % (g["window"] or "all", g["layers"], g["kv_bytes"])
                                              for g in j["layer_groups"]))
        out.append(row)
    write_csv(os.path.join(a.out, "policies.csv"), POLICY_COLS, out)
    return out, len(ids)


def part_prefix(a, tool, label):
    ids = tool.tokenize([open(MAIN_TEXT).read()])[0][:a.tokens if a.quick else 1024]
    P = 32 if a.quick else 256
    types = "f32,f16" if a.quick else ",".join(["f32"] + TYPES)
    out, _ = tool.call(["--tokens-file", tool.write_ids(ids, "prefix.ids"), "--prefix-check", str(P),
                        "--types", types], "prefix check")
    rows = []
    for line in out.splitlines():
        j = json.loads(line)
        rows.append(dict(model=label, kv_type=j["type"], bit_identical=int(j["identical_rows"] == j["compared_rows"] > 0),
                         **{k: j[k] for k in PREFIX_COLS if k in j and k != "kv_type"}))
    write_csv(os.path.join(a.out, "prefix.csv"), PREFIX_COLS, rows)
    return rows


def needle_docs():
    spec = json.load(open(os.path.join(TEXTS, "needles.json")))
    paras = [p.strip() + "\n\n" for p in open(os.path.join(TEXTS, "harbour.txt")).read().split("\n\n") if p.strip()]
    docs = []
    for k, d in enumerate(spec["documents"]):
        facts = d["facts"]
        parts = [(spec["intro"], None)]
        chosen = [paras[(k * 3 + i) % len(paras)] for i in range(len(facts) - 1)]
        for i, (place, number) in enumerate(facts):
            parts.append((spec["fact"].format(place=place, number=number), ("fact", i)))
            if i < len(chosen):
                parts.append((chosen[i], None))
        for i, (place, number) in enumerate(facts):
            q = spec["question"].format(place=place, number=number)
            head, tail = q.split(" " + number, 1)
            parts += [(head, None), (" " + number, ("answer", i)), (tail, None)]
        docs.append((facts, parts))
    return docs


def needle_runs(a):
    runs = ["f16/full", "q4_0/full"]
    for w in a.windows:
        runs += ["f16/window/%d" % w, "f16/sinks/%d/4" % w]
    runs += ["f16/truncate/%d" % a.windows[-1]]
    return runs


def part_needles(a, tool, label):
    out = []
    for k, (facts, parts) in enumerate(needle_docs()):
        toks = tool.tokenize([p for p, _ in parts])
        ids, fact_at, ans = [], {}, {}
        for (text, tag), t in zip(parts, toks):
            if tag and tag[0] == "fact":
                fact_at[tag[1]] = len(ids) + len(t) - 1  # the fact's last token
            if tag and tag[0] == "answer":
                ans[tag[1]] = (len(ids), len(ids) + len(t) - 1)
            ids += t
        summ, rows = tool.evaluate(ids, only(needle_runs(a)), "needles%d" % k, score=sorted(ans.values()))
        for run, rr in rows.items():
            by_pos = {r[0]: r for r in rr}
            for i, (place, number) in enumerate(facts):
                lo, hi = ans[i]
                out.append(dict(model=label, run=run, doc=k, place=place, distance=lo - fact_at[i],
                                answer_tokens=hi - lo + 1, recovered=int(all(by_pos[p][5] for p in range(lo, hi + 1)))))
    write_csv(os.path.join(a.out, "needles.csv"), NEEDLE_COLS, out)
    return out


def role_runs(a):
    runs = ["f16/full", "q4_0/full"]
    for w in a.windows[:2]:
        runs += ["f16/window/%d" % w, "f16/sinks/%d/4" % w]
    runs += ["f16/truncate/%d" % a.windows[1]]
    return runs


def part_roles(a, tool, label):
    chat = json.load(open(os.path.join(TEXTS, "chat.json")))
    roles = ["system", "document", "question"]
    toks = tool.tokenize([chat[r] for r in roles])
    prompt = sum(toks, [])
    # the reply: greedy under full attention, by kvd's engine (kvd_stream)
    p = subprocess.run(["nice", tool.stream, "--model", tool.model, "--tokens-file", tool.write_ids(prompt, "chat.ids"),
                        "--policy", "none", "--generate", str(chat["generate_tokens"]), "--chunk", "64",
                        "--threads", str(tool.threads)], capture_output=True, text=True)
    if p.returncode:
        sys.exit("kvd_stream (chat reply) failed:\n" + p.stderr)
    gen = json.loads(p.stdout)["generated"]
    spans, at = {}, 0
    for r, t in zip(roles + ["generated"], toks + [gen]):
        spans[r] = (at, at + len(t) - 1)
        at += len(t)
    summ, rows = tool.evaluate(prompt + gen, only(role_runs(a)), "roles")
    out = []
    for run, rr in rows.items():
        for role, (lo, hi) in spans.items():
            sel = [r for r in rr if lo <= r[0] <= hi and r[0] >= 1]
            if not sel:
                continue
            n = len(sel)
            nll, ref = sum(r[1] for r in sel) / n, sum(r[2] for r in sel) / n
            out.append(dict(model=label, run=run, role=role, tokens=n, nll="%.4f" % nll, nll_ref="%.4f" % ref,
                            delta_nll="%.4f" % (nll - ref), kl_mean="%.5f" % (sum(r[3] for r in sel) / n)))
    write_csv(os.path.join(a.out, "roles.csv"), ROLE_COLS, out)
    return out, spans


from plots import plots, page  # noqa: E402  (beside this file)


def replot(out):
    meta = json.load(open(os.path.join(out, "meta.json")))
    res = {"label": meta["label"], "n_tokens": meta["n_tokens"], "seconds": meta["seconds"], "spans": meta["spans"]}
    for part in ("policies", "prefix", "needles", "roles"):
        path = os.path.join(out, part + ".csv")
        if os.path.exists(path):
            res[part] = list(csv.DictReader(open(path)))
    for r in res["prefix"]:
        r["bit_identical"] = int(r["bit_identical"])
    if res["spans"]:
        res["spans"] = {k: tuple(v) for k, v in res["spans"].items()}
    plots(out, res)
    page(out, res, meta["command"])
    print("redrew %s" % out)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--label", help="model name in the tables (default: the file name)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens of the running text (policy sweep)")
    ap.add_argument("--windows", default="128,256,512")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--replot", action="store_true", help="redraw from DIR's CSV files and meta.json")
    ap.add_argument("--only", help="measure these runs again (comma-separated), keep DIR's other rows, redraw")
    ap.add_argument("--build", default=os.environ.get("KVD_BUILD", os.path.join(ROOT, "build")))
    a = ap.parse_args()
    a.windows = [int(x) for x in a.windows.split(",")]
    if a.quick:
        a.tokens = min(a.tokens, 160)
    label = a.label or os.path.basename(a.model)
    if a.replot:
        return replot(a.out)
    if a.only:
        global ONLY
        ONLY = a.only.split(",")
        with tempfile.TemporaryDirectory(prefix="kvd-eval-") as tmp:
            a.tmp = tmp
            tool = Tool(a)
            part_policies(a, tool, label)
            part_needles(a, tool, label)
            part_roles(a, tool, label)
        return replot(a.out)
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="kvd-eval-") as tmp:
        a.tmp = tmp
        tool = Tool(a)
        res = {"label": label, "model": a.model}
        res["policies"], res["n_tokens"] = part_policies(a, tool, label)
        print("policies: %d runs (%.0f s)" % (len(res["policies"]), time.time() - t0))
        res["prefix"] = part_prefix(a, tool, label)
        print("prefix sharing: %s (%.0f s)" % (", ".join("%s %s" % (r["kv_type"], "bit-identical" if r["bit_identical"]
                                                                    else "DIFFERS") for r in res["prefix"]),
                                             time.time() - t0))
        if not a.quick:
            res["needles"] = part_needles(a, tool, label)
            print("needles: %d facts x runs (%.0f s)" % (len(res["needles"]), time.time() - t0))
            res["roles"], res["spans"] = part_roles(a, tool, label)
            print("roles: %d rows (%.0f s)" % (len(res["roles"]), time.time() - t0))
    res["seconds"] = time.time() - t0
    cmd = " ".join(["bench/eval/report.py"] + sys.argv[1:])
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump({"label": label, "n_tokens": res["n_tokens"], "seconds": round(res["seconds"]),
                   "spans": res.get("spans"), "command": cmd}, f, indent=1)
    if not a.no_plots:
        plots(a.out, res)
    page(a.out, res, cmd)
    print("wrote %s (%.0f s)" % (a.out, res["seconds"]))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
