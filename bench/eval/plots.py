"""Plots (matplotlib, PNG) and the Markdown page of an evaluation report
(bench/eval/report.py)."""
import os

MIB = 1024.0 * 1024.0


def _f(r, k):
    try:
        return float(r[k])
    except (KeyError, TypeError, ValueError):
        return None


def _ok(rows):
    return [r for r in rows if _f(r, "ppl") is not None]


def _family(r):
    return {"full": r["kv_type"], "window": "sliding window", "sinks": "sinks + window",
            "truncate": "truncate-oldest"}[r["policy"]]


def pareto(points):
    """The points not beaten on both axes (smaller x and smaller y), by x."""
    front, best = [], None
    for x, y, lab in sorted(points):
        if best is None or y < best:
            front.append((x, y, lab))
            best = y
    return front


def plots(out, res):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _ok(res["policies"])
    label = res["label"]
    marks = {"sliding window": "s", "sinks + window": "^", "truncate-oldest": "v"}

    # quality against retained KV bytes
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in rows:
        fam = _family(r)
        x = _f(r, "kv_bytes_peak") / MIB
        for k, key in enumerate(("ppl", "kl_mean")):
            ax[k].scatter([x], [_f(r, key)], marker=marks.get(fam, "o"), label=fam if k == 0 else None)
            ax[k].annotate(r["run"].split("/", 1)[1] if r["policy"] != "full" else r["kv_type"], (x, _f(r, key)),
                           fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax[0].set_ylabel("perplexity")
    ax[1].set_ylabel("mean KL vs f32 cache (nats)")
    ax[1].set_yscale("symlog", linthresh=1e-3)
    for a in ax:
        a.set_xlabel("KV bytes held at most (MiB)")
        a.grid(alpha=0.3)
    h, lab = ax[0].get_legend_handles_labels()
    uniq = dict(zip(lab, h))
    ax[0].legend(uniq.values(), uniq.keys(), fontsize=7)
    fig.suptitle("%s: quality against retained KV bytes (%d tokens)" % (label, res["n_tokens"]))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "quality_vs_kv_bytes.png"), dpi=110)
    plt.close(fig)

    # Pareto: KL against read bytes per token
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    pts = [(_f(r, "read_bytes_per_token") / MIB, _f(r, "kl_mean"), r["run"]) for r in rows if r["run"] != "f32/full"]
    for x, y, lab in pts:
        ax.scatter([x], [y], s=14)
        ax.annotate(lab, (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
    fr = pareto(pts)
    ax.plot([p[0] for p in fr], [p[1] for p in fr], "k--", lw=1, label="Pareto front")
    ax.set_xlabel("K/V bytes read per token (MiB, mean over scored positions)")
    ax.set_ylabel("mean KL vs f32 cache (nats)")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("%s: quality against decode bytes read" % label, fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pareto_read_bytes.png"), dpi=110)
    plt.close(fig)

    # KV element types
    full = [r for r in rows if r["policy"] == "full" and r["kv_type"] != "f32"]
    if full:
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        xs = range(len(full))
        ax.bar(xs, [_f(r, "kl_mean") for r in full], color="tab:blue")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(["%s\n%d B/token" % (r["kv_type"], int(_f(r, "kv_bytes_per_token"))) for r in full])
        ax.set_ylabel("mean KL vs f32 cache (nats)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, axis="y")
        ax.set_title("%s: quality against KV element type" % label, fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "kv_types.png"), dpi=110)
        plt.close(fig)

    if res.get("needles"):
        buckets = needle_buckets(res)
        fig, ax = plt.subplots(figsize=(7.5, 4))
        runs = sorted({r["run"] for r in res["needles"]}, key=_run_order)
        for run in runs:
            ys = [buckets[run].get(b, (0, 0)) for b in BUCKETS]
            ax.plot(range(len(BUCKETS)), [s / n if n else float("nan") for s, n in ys], marker="o", label=run)
        ax.set_xticks(range(len(BUCKETS)))
        ax.set_xticklabels(["%d-%d" % b for b in BUCKETS])
        ax.set_xlabel("distance from the fact to its question (tokens)")
        ax.set_ylabel("share of facts recovered")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
        ax.set_title("%s: planted facts recovered by distance" % label, fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "needles.png"), dpi=110)
        plt.close(fig)

    if res.get("roles"):
        roles = ["system", "document", "question", "generated"]
        runs = sorted({r["run"] for r in res["roles"]}, key=_run_order)
        fig, ax = plt.subplots(figsize=(8, 4))
        wdt = 0.8 / len(runs)
        for k, run in enumerate(runs):
            v = {r["role"]: float(r["delta_nll"]) for r in res["roles"] if r["run"] == run}
            ax.bar([i + k * wdt for i in range(len(roles))], [v.get(x, 0) for x in roles], wdt, label=run)
        ax.set_xticks([i + 0.4 - wdt / 2 for i in range(len(roles))])
        ax.set_xticklabels(roles)
        ax.set_ylabel("loss minus the f32 cache's (nats/token)")
        ax.axhline(0, color="k", lw=0.6)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=6, ncol=2)
        ax.set_title("%s: loss by document role" % label, fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "roles.png"), dpi=110)
        plt.close(fig)


BUCKETS = [(0, 255), (256, 383), (384, 511), (512, 639), (640, 767), (768, 4096)]


def _run_order(run):
    t, _, rest = run.partition("/")
    return (rest != "full", rest.split("/")[0], int((rest.split("/") + ["0", "0"])[1] or 0), t)


def needle_buckets(res):
    out = {}
    for r in res["needles"]:
        for b in BUCKETS:
            if b[0] <= int(r["distance"]) <= b[1]:
                s, n = out.setdefault(r["run"], {}).get(b, (0, 0))
                out[r["run"]][b] = (s + int(r["recovered"]), n + 1)
    return out


def page(out, res, cmd):
    L = []
    w = L.append
    w("# Evaluation report: %s" % res["label"])
    w("")
    w("Made by `%s` in %.0f s (kvd's engine on the CPU backend, through tests/tools/kvd_policy_eval; "
      "every figure compares a run with the reference run of the same engine: f32 K/V, full attention). "
      "Texts: tests/data/text/lighthouse.txt (first %d tokens) and bench/eval/texts/. CSV beside this page." %
      (cmd, res["seconds"], res["n_tokens"]))
    w("")
    w("## Quality against retained KV bytes and decode bytes read")
    w("")
    w("Perplexity of the running text, mean and largest KL(p_f32 || p_run) over every scored position, the share "
      "of positions whose argmax is f32's, the most pool bytes the run held and the K/V bytes a position's step "
      "read (each layer its window of the sequence). Window W: sliding window; sinks W/4: 4 sink tokens (one page "
      "of 16) plus the window; truncate W: at most W tokens; when full, the first 16 tokens (the head, as truncate-oldest keeps a "
      "chat's system block) and the newest up to W/2 are kept and recomputed, the rest cut.")
    w("")
    w("| run | KV held (MiB) | read/token (KiB) | ppl | KL mean | KL max | top-1 = f32 | held per layer group |")
    w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in res["policies"]:
        if _f(r, "ppl") is None:
            w("| %s | %s | | | | | | |" % (r["run"], r.get("policy", "")))
            continue
        w("| %s | %.2f | %.0f | %.3f | %.5f | %.4f | %.3f | %s |" % (
            r["run"], _f(r, "kv_bytes_peak") / MIB, _f(r, "read_bytes_per_token") / 1024, _f(r, "ppl"),
            _f(r, "kl_mean"), _f(r, "kl_max"), _f(r, "top1"), r["kv_bytes_by_group"]))
    w("")
    for png, what in (("quality_vs_kv_bytes.png", "quality against KV bytes held"),
                      ("pareto_read_bytes.png", "quality against bytes read per token (Pareto front dashed)"),
                      ("kv_types.png", "KV element types")):
        if os.path.exists(os.path.join(out, png)):
            w("![%s](%s)" % (what, png))
            w("")
    front = pareto([(_f(r, "read_bytes_per_token"), _f(r, "kl_mean"), r["run"]) for r in _ok(res["policies"])
                    if r["run"] != "f32/full"])
    w("Pareto front (least KL for the bytes read): " + ", ".join(p[2] for p in front) + ".")
    w("")
    w("Layer groups: `WINDOWxLAYERS:BYTES` is the K/V one group of layers holds at the run's longest sequence "
      "(`all`: full attention); a local layer of Gemma 3 keeps at most its window, so its share stops growing "
      "there (kvd releases the pages those layers are done with: kv.release_local).")
    w("")
    w("## Prefix sharing: shared pages against computing alone")
    w("")
    w("| KV type | prefix tokens | hit tokens | rows compared | identical rows | max abs diff | bit-identical |")
    w("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in res["prefix"]:
        w("| %s | %s | %s | %s | %s | %s | %s |" % (r["kv_type"], r["prefix_tokens"], r["hit_tokens"],
                                                    r["compared_rows"], r["identical_rows"], r["max_abs_diff"],
                                                    "yes" if r["bit_identical"] else "NO"))
    w("")
    if res.get("needles"):
        b = needle_buckets(res)
        w("## Planted facts recovered, by distance")
        w("")
        w("Eighteen four-digit numbers planted between paragraphs of bench/eval/texts/harbour.txt (three documents), "
          "asked for at the end; a fact is recovered when every token of its number is the run's argmax "
          "(teacher-forced). Shares by distance in tokens from the fact to its answer:")
        w("")
        w("| run | " + " | ".join("%d-%d" % x for x in BUCKETS) + " |")
        w("| --- |" + " ---: |" * len(BUCKETS))
        for run in sorted(b, key=_run_order):
            w("| %s | " % run + " | ".join("%d/%d" % b[run].get(x, (0, 0)) for x in BUCKETS) + " |")
        w("")
        if os.path.exists(os.path.join(out, "needles.png")):
            w("![needles](needles.png)")
            w("")
    if res.get("roles"):
        w("## Loss by document role")
        w("")
        sp = res["spans"]
        w("A chat (bench/eval/texts/chat.json): system prompt (tokens %d-%d), a user turn quoting a document (%d-%d), "
          "the question (%d-%d), and the model's own greedy reply under full attention (%d-%d). Mean loss "
          "(nats/token) under the run, and its excess over the f32 cache's:" % (
              sp["system"] + sp["document"] + sp["question"] + sp["generated"]))
        w("")
        roles = ["system", "document", "question", "generated"]
        w("| run | " + " | ".join(roles) + " |")
        w("| --- |" + " ---: |" * len(roles))
        for run in sorted({r["run"] for r in res["roles"]}, key=_run_order):
            v = {r["role"]: r for r in res["roles"] if r["run"] == run}
            w("| %s | " % run + " | ".join("%s (%+.3f)" % (v[x]["nll"], float(v[x]["delta_nll"])) if x in v else ""
                                           for x in roles) + " |")
        w("")
        if os.path.exists(os.path.join(out, "roles.png")):
            w("![roles](roles.png)")
            w("")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(L))
