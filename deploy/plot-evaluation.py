#!/usr/bin/env python3
"""Draws the evaluation's CSVs (deploy/evaluate.sh) as PNGs and writes the page.

Usage: deploy/plot-evaluation.py --dir DIR [--page FILE] [--settings TEXT] [--run_time TEXT]

Reads DIR/{throughput,memory,planning,trace,schedules}.csv and DIR/traces/*.json,
writes DIR/*.png (one set per cost model: the analytic one without suffix,
measured ones with the cost model's name) and, with --page, the Markdown page
that shows every plot with what it shows and the headline numbers: in every
cell, Varipipe (the planner's default search, method `varipipe`) against the
best tuned baseline. CSVs written before `varipipe` rows existed fall back to
the DP alone (method `dp`) as Varipipe.
"""
import argparse
import csv
import json
import os
import re
import statistics
import sys
import textwrap
from collections import Counter, defaultdict

try:
    import matplotlib
except ImportError:
    # Debian's python3 has python3-matplotlib; another python3 may come first.
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    sys.exit("plot-evaluation: python3-matplotlib is missing (deploy/install-deps.sh installs it)")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Drawing order; "varipipe" is the planner's default search (every partition method, each
# baseline's setting tuned per mini-batch, every schedule), "dp" the dynamic program alone.
# "packing" computes attention over the whole packed row under a block-diagonal mask (as
# DynaPipe's evaluation and Megatron-LM in 2023 did), "packing-varlen" per sample with a
# variable-length kernel (as Megatron-Core's THD format, TRL and torchtitan do today).
METHODS = ["varipipe", "dp", "packing", "packing-varlen", "token-based", "fixed-size", "padding"]
# What Varipipe is compared against: the baselines, each tuned once per cell (not the DP).
BASELINES = ["packing", "packing-varlen", "token-based", "fixed-size", "padding"]
LABELS = {
    "varipipe": "Varipipe (default search)",
    "dp": "DP alone",
    "packing": "packing, full-row attention",
    "packing-varlen": "packing, variable-length attention",
    "token-based": "token-based",
    "fixed-size": "fixed-size (sorted)",
    "padding": "padding",
}
COLORS = {
    "varipipe": "#d62728",
    "dp": "#ff7f0e",
    "packing": "#1f77b4",
    "packing-varlen": "#17becf",
    "token-based": "#2ca02c",
    "fixed-size": "#9467bd",
    "padding": "#7f7f7f",
}
MARKERS = {"varipipe": "*", "dp": "o", "packing": "s", "packing-varlen": "P", "token-based": "^",
           "fixed-size": "D",
           "padding": "v"}
MIXTURES = {"flan": "FLAN-like", "documents": "documents-like"}


def suptitle(fig, text, fontsize):
    """A figure title whose lines wrap to the figure's width."""
    width = int(fig.get_figwidth() * 100 / fontsize)
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in text.split("\n")),
                 fontsize=fontsize)


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def cost_key(description):
    """'analytic' for the analytic models (one per hardware preset), else a file-safe name."""
    if description.startswith("analytic"):
        return "analytic"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", description)[:60]


def suffix(key):
    return "" if key == "analytic" else "." + key


def panels(rows):
    """(model, mixture) pairs in a stable order: GPT before T5, FLAN before documents."""
    seen = sorted({(r["model"], r["mixture"]) for r in rows},
                  key=lambda p: (not p[0].startswith("GPT"), p[1] != "flan", p))
    return seen


def model_label(model):
    """The page's short name of a model ('GPT 32L h4096 pp4 dp2' -> 'GPT-6.7B')."""
    if model.startswith("GPT"):
        return "GPT-6.7B"
    if model.startswith("T5"):
        return "T5-11B"
    return model


def chosen(rows):
    """{(model, mixture, max_len, memory_mib, method): row} of each method's tuned setting."""
    out = {}
    for r in rows:
        if r["chosen"] == "1":
            out[(r["model"], r["mixture"], r["max_len"], r["memory_mib"], r["method"])] = r
    return out


def headline(rows):
    """The method that stands for Varipipe: the default search ('varipipe'), or, on CSVs
    written before it was evaluated, the DP alone ('dp')."""
    return "varipipe" if any(r["method"] == "varipipe" for r in rows) else "dp"


def drawn(rows):
    """The methods the CSV holds, in drawing order."""
    present = {r["method"] for r in rows}
    return [m for m in METHODS if m in present]


def style(m, head):
    """Line style of method m; Varipipe (whichever method stands for it) drawn thickest."""
    key = "varipipe" if m == head else m
    label = (LABELS[key] if m != "dp" or head != "dp" else
             "Varipipe (DP alone; no default-search rows)")
    return dict(marker=MARKERS[key], color=COLORS[key], label=label,
                markersize=11 if key == "varipipe" else 6,
                linewidth=2.8 if key == "varipipe" else 1.8 if m == "dp" else 1.4,
                zorder=3 if key == "varipipe" else 2)


def cost_line(rows):
    return "; ".join(sorted({r["cost_model"] for r in rows}))


def fmt_ratio3(r):
    """Three decimals, four when three would print 1.000 for a side that wins or loses."""
    text = f"{r:.3f}"
    return (f"{r:.4f}" if text == "1.000" and r != 1 else text) + "x"


def fmt_ratio(r):
    """Two decimals, more when that hides which side wins."""
    return fmt_ratio3(r) if abs(r - 1) < 0.005 else f"{r:.2f}x"


def printed(tokens_per_s):
    """Tokens/s as the page prints them (one decimal); every ratio is computed from these."""
    return round(float(tokens_per_s), 1)


def fmt_tokens(v):
    return f"{printed(v):,.1f}"


def baseline_name(r):
    """'packing rows=8 (none)': the method, its tuned setting and recompute mode."""
    return f'{r["method"]} {r["setting"]} ({r["recompute"]})'


def cells(rows):
    """(model, mixture, max_len, memory_mib) of every cell, panels' order, then by number."""
    order = {p: k for k, p in enumerate(panels(rows))}
    return sorted({(r["model"], r["mixture"], r["max_len"], r["memory_mib"]) for r in rows},
                  key=lambda c: (order[c[:2]], int(c[2]), int(c[3])))


def compare(best, cell, method, pool):
    """method's tuned row in cell against the best tuned row of pool's methods that fits.

    Returns {"row", "best", "ratio", "why"}: ratio (of the printed tokens/s, so that it is at
    least 1 exactly when the printed numbers say so) when both fit, else why not in words."""
    row = best.get(cell + (method,))
    fit = [best[cell + (m,)] for m in pool
           if cell + (m,) in best and best[cell + (m,)]["feasible"] == "1"]
    top = max(fit, key=lambda r: float(r["tokens_per_s"])) if fit else None
    fits = row is not None and row["feasible"] == "1"
    out = {"row": row, "best": top, "ratio": None, "why": None}
    if row is None:
        out["why"] = f"no {method} row"
    elif fits and top is not None and printed(top["tokens_per_s"]) > 0:
        out["ratio"] = printed(row["tokens_per_s"]) / printed(top["tokens_per_s"])
    elif not fits and top is None:
        out["why"] = "nothing fits"
    elif not fits:
        out["why"] = ("Varipipe does not fit" if method in ("varipipe", "dp")
                      else f"{method} does not fit")
    else:
        out["why"] = "no baseline fits" if len(pool) > 1 else f"{pool[0]} does not fit"
    return out


def comparisons(rows):
    """{cell: {"head": Varipipe vs the best baseline, "dp": the DP alone vs it (when Varipipe
    is the default search), "packing" and "packing-varlen": Varipipe vs each packing}}."""
    best = chosen(rows)
    head = headline(rows)
    out = {}
    for cell in cells(rows):
        c = {"head": compare(best, cell, head, BASELINES),
             "packing": compare(best, cell, head, ["packing"]),
             "packing-varlen": compare(best, cell, head, ["packing-varlen"])}
        if head != "dp" and cell + ("dp",) in best:
            c["dp"] = compare(best, cell, "dp", BASELINES)
        out[cell] = c
    return out


def annotation(c):
    """One cell of a plot's 'Varipipe / best baseline' box."""
    if c["ratio"] is None:
        return c["why"]
    return f'{fmt_ratio3(c["ratio"])} ({c["best"]["method"]})'


def plot_throughput(rows, key, out, settings, comp):
    best = chosen(rows)
    head = headline(rows)
    pairs = panels(rows)
    fig, axes = plt.subplots(2, 2, figsize=(14, 10.5), squeeze=False)
    for ax, (model, mixture) in zip(axes.flat, pairs):
        lengths = sorted({int(r["max_len"]) for r in rows
                          if r["model"] == model and r["mixture"] == mixture})
        memory = next(r["memory_mib"] for r in rows if r["model"] == model)
        ymax = 0
        for m in drawn(rows):
            xs, ys, bad = [], [], []
            for L in lengths:
                r = best.get((model, mixture, str(L), memory, m))
                if r is None:
                    continue
                if r["feasible"] == "1":
                    xs.append(L)
                    ys.append(float(r["tokens_per_s"]))
                else:
                    bad.append(L)
            ymax = max([ymax] + ys)
            st = style(m, head)
            ax.plot(xs, ys, **st)
            if bad:
                ax.plot(bad, [0] * len(bad), linestyle="none", marker="x", color=st["color"],
                        markersize=10, clip_on=False)
        texts = [f"{L}: {annotation(comp[(model, mixture, str(L), memory)]['head'])}"
                 for L in lengths if (model, mixture, str(L), memory) in comp]
        ax.text(0.02, 0.02, "Varipipe / best baseline:\n" + "\n".join(texts),
                transform=ax.transAxes, fontsize=9, va="bottom", ha="left",
                bbox=dict(boxstyle="round", facecolor="white", alpha=0.85), zorder=4)
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths)
        ax.set_xticklabels([str(L) for L in lengths])
        ax.set_ylim(0, ymax * 1.12 if ymax > 0 else 1)
        ax.set_xlabel("maximum sequence length (tokens)")
        ax.set_ylabel("predicted real tokens / s")
        ax.set_title(f"{model}, {MIXTURES[mixture]}, {int(memory) // 1024} GiB per device",
                     fontsize=11)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(pairs):]:
        ax.axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 6), fontsize=10,
               bbox_to_anchor=(0.5, 0.93))
    suptitle(fig, "Real tokens/s vs maximum length (x on the axis: no setting fits memory)\n"
                 f"cost model: {cost_line(rows)}; 65,536 tokens per global batch; "
                 f"{settings}", 11)
    varipipe = ("Varipipe: the planner's default search (every partition method, each "
                "baseline's setting tuned per mini-batch, every schedule); DP alone: the "
                "dynamic program by itself.\n" if head == "varipipe" else
                "Varipipe: the DP alone (these CSVs have no default-search rows).\n")
    fig.text(0.5, 0.005, varipipe + "Baselines tuned per length: rows per micro-batch "
             "(packing, fixed-size, padding) or token budget (token-based) x recompute mode, "
             "the best predicted\ntokens/s that fits memory on every mini-batch; box: "
             "Varipipe's tokens/s over the best tuned baseline's (named); every method chooses "
             "among all schedules per mini-batch.", ha="center", fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 0.89))
    path = os.path.join(out, f"throughput_vs_length{suffix(key)}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_padding(rows, key, out, settings):
    best = chosen(rows)
    head = headline(rows)
    pairs = panels(rows)
    fig, axes = plt.subplots(2, len(pairs), figsize=(4.2 * len(pairs), 8), squeeze=False)
    for col, (model, mixture) in enumerate(pairs):
        lengths = sorted({int(r["max_len"]) for r in rows
                          if r["model"] == model and r["mixture"] == mixture})
        memory = next(r["memory_mib"] for r in rows if r["model"] == model)
        for m in drawn(rows):
            pts = [(L, best.get((model, mixture, str(L), memory, m))) for L in lengths]
            pts = [(L, r) for L, r in pts if r is not None and r["feasible"] == "1"]
            xs = [L for L, _ in pts]
            st = style(m, head)
            st["linewidth"] = min(st["linewidth"], 2.2)
            st["markersize"] = min(st["markersize"], 9)
            axes[0][col].plot(xs, [100 * float(r["padding_efficiency"]) for _, r in pts], **st)
            axes[1][col].plot(xs, [float(r["micro_batches"]) for _, r in pts], **st)
        for row in range(2):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths)
            ax.set_xticklabels([str(L) for L in lengths], fontsize=8)
            ax.grid(alpha=0.3)
            ax.set_xlabel("maximum sequence length")
        axes[0][col].set_title(f"{model}\n{MIXTURES[mixture]}", fontsize=10)
        axes[1][col].set_yscale("log")
    axes[0][0].set_ylabel("padding efficiency (%)")
    axes[1][0].set_ylabel("micro-batches per mini-batch (all replicas)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 6), fontsize=9,
               bbox_to_anchor=(0.5, 0.925))
    suptitle(fig, f"Padding efficiency and micro-batches of each method's tuned setting\n"
                 f"cost model: {cost_line(rows)}; {settings}", 10)
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    path = os.path.join(out, f"padding_and_micro_batches{suffix(key)}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_memory(rows, key, out, settings, comp):
    best = chosen(rows)
    head = headline(rows)
    pairs = panels(rows)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5), squeeze=False)
    for ax, (model, mixture) in zip(axes.flat, pairs):
        mems = sorted({int(r["memory_mib"]) for r in rows
                       if r["model"] == model and r["mixture"] == mixture})
        L = next(r["max_len"] for r in rows if r["model"] == model)
        ymax = 0
        for m in drawn(rows):
            xs, ys, bad = [], [], []
            for mem in mems:
                r = best.get((model, mixture, L, str(mem), m))
                if r is None:
                    continue
                if r["feasible"] == "1":
                    xs.append(mem / 1024)
                    ys.append(float(r["tokens_per_s"]))
                else:
                    bad.append(mem / 1024)
            ymax = max([ymax] + ys)
            st = style(m, head)
            ax.plot(xs, ys, **st)
            if bad:
                ax.plot(bad, [0] * len(bad), linestyle="none", marker="x", color=st["color"],
                        markersize=10, clip_on=False)
        texts = [f"{mem // 1024} GiB: {annotation(comp[(model, mixture, L, str(mem))]['head'])}"
                 for mem in mems if (model, mixture, L, str(mem)) in comp]
        ax.text(0.98, 0.02, "Varipipe / best baseline:\n" + "\n".join(texts),
                transform=ax.transAxes, fontsize=8, va="bottom", ha="right",
                multialignment="left",
                bbox=dict(boxstyle="round", facecolor="white", alpha=0.85), zorder=4)
        ax.set_ylim(0, ymax * 1.12 if ymax > 0 else 1)
        ax.set_xticks([m / 1024 for m in mems])
        ax.set_xlabel("device memory limit (GiB)")
        ax.set_ylabel("predicted real tokens / s")
        ax.set_title(f"{model}, {MIXTURES[mixture]}, max length {L}", fontsize=11)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(pairs):]:
        ax.axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 6), fontsize=9,
               bbox_to_anchor=(0.5, 0.925))
    suptitle(fig, "Real tokens/s vs device memory limit (x on the axis: no setting fits)\n"
                 f"cost model: {cost_line(rows)} (compute model unchanged, memory limit varied); "
                 f"baselines tuned per limit; {settings}", 10)
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    path = os.path.join(out, f"throughput_vs_memory{suffix(key)}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_planning(rows, key, out, settings, searcher):
    pairs = panels(rows)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5), squeeze=False)
    stats = {}
    for ax, (model, mixture) in zip(axes.flat, pairs):
        sel = [r for r in rows if r["model"] == model and r["mixture"] == mixture]
        lengths = sorted({int(r["max_len"]) for r in sel})
        plan = [[float(r["planning_ms"]) for r in sel if int(r["max_len"]) == L] for L in lengths]
        pred = [[float(r["predicted_iteration_ms"]) for r in sel if int(r["max_len"]) == L]
                for L in lengths]
        pos = list(range(len(lengths)))
        ax.boxplot(plan, positions=pos, widths=0.5, showfliers=True)
        ax.plot(pos, [statistics.median(p) for p in pred], marker="*", color="#d62728",
                markersize=12, linestyle="--", label="predicted iteration time (median)")
        ax.set_yscale("log")
        ax.set_xticks(pos)
        ax.set_xticklabels([str(L) for L in lengths])
        ax.set_xlabel("maximum sequence length")
        ax.set_ylabel("milliseconds (log scale)")
        ax.set_title(f"{model}, {MIXTURES[mixture]}", fontsize=11)
        ax.grid(alpha=0.3, which="both")
        ax.legend(loc="center right", fontsize=9)
        for L, p, q in zip(lengths, plan, pred):
            stats[(model, mixture, L)] = (statistics.median(p), max(p), statistics.median(q))
    for ax in list(axes.flat)[len(pairs):]:
        ax.axis("off")
    suptitle(fig, f"Planning time per iteration of {searcher} (boxes: distribution over "
                 "mini-batches, one thread, this 2-core machine)\nagainst the predicted "
                 f"iteration time it plans ahead of; cost model: {cost_line(rows)}; {settings}",
             10)
    fig.tight_layout(rect=(0, 0, 1, 0.91))
    path = os.path.join(out, f"planning_time{suffix(key)}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, stats


def plot_schedules(rows, out):
    by_cv = defaultdict(list)
    for r in rows:
        by_cv[float(r["cv"])].append(r)
    cvs = sorted(by_cv)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    ratio_mean = []
    for name, col, color in [("1F1B", "one_f_one_b_ms", "#1f77b4"),
                             ("adaptive", "adaptive_ms", "#d62728")]:
        mean, lo, hi = [], [], []
        for cv in cvs:
            v = [float(r[col]) / float(r["lower_bound_ms"]) for r in by_cv[cv]]
            mean.append(statistics.mean(v))
            lo.append(min(v))
            hi.append(max(v))
        axes[0].plot(cvs, mean, marker="o", color=color, label=f"{name} (mean)")
        axes[0].fill_between(cvs, lo, hi, color=color, alpha=0.15, label=f"{name} (min-max)")
    for cv in cvs:
        v = [float(r["one_f_one_b_ms"]) / float(r["adaptive_ms"]) for r in by_cv[cv]]
        ratio_mean.append(statistics.mean(v))
    axes[0].set_xlabel("coefficient of variation of micro-batch times")
    axes[0].set_ylabel("makespan / lower bound")
    axes[0].grid(alpha=0.3)
    axes[0].legend(fontsize=9)
    axes[1].plot(cvs, ratio_mean, marker="o", color="#d62728")
    axes[1].axhline(1, color="gray", linewidth=1)
    axes[1].set_xlabel("coefficient of variation of micro-batch times")
    axes[1].set_ylabel("1F1B makespan / adaptive makespan (mean)")
    axes[1].grid(alpha=0.3)
    n = len(by_cv[cvs[0]])
    suptitle(fig, "Adaptive schedule vs 1F1B as micro-batch times spread (DynaPipe Fig. 7)\n"
                 f"simulator, synthetic: pp = 4, 16 micro-batches, lognormal times (mean 10 ms), "
                 f"backward = 2 x forward, memory per micro-batch ~ time; adaptive limited to "
                 f"1F1B's peak per device; {n} draws per point", 10)
    fig.tight_layout(rect=(0, 0, 1, 0.84))
    path = os.path.join(out, "schedules.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, dict(zip(cvs, ratio_mean))


def plot_timeline(trace_path, info, out):
    with open(trace_path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    ops = [e for e in events if e.get("ph") == "X"]
    devices = sorted({e["pid"] for e in ops})
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.9 * len(devices)))
    colors = {"forward": "#1f77b4", "backward": "#ff7f0e", "comm": "#2ca02c"}
    end = max(e["ts"] + e["dur"] for e in ops) / 1000.0
    busy = defaultdict(float)
    for e in ops:
        d = e["pid"]
        y = len(devices) - 1 - devices.index(d)
        comm = e.get("tid") == 1
        cat = "comm" if comm else ("backward" if e.get("cat", "").startswith("b") or
                                   e["name"].startswith("B") else "forward")
        start, dur = e["ts"] / 1000.0, e["dur"] / 1000.0
        if comm:
            ax.broken_barh([(start, dur)], (y - 0.42, 0.18), facecolors=colors["comm"])
        else:
            busy[d] += dur
            ax.broken_barh([(start, dur)], (y - 0.2, 0.62), facecolors=colors[cat],
                           edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(devices)))
    ax.set_yticklabels([f"device {d}\nidle {100 * (1 - busy[d] / end):.0f}%"
                        for d in reversed(devices)], fontsize=9)
    ax.set_xlim(0, end)
    ax.set_xlabel("time (ms)")
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=colors["forward"], label="forward"),
                       Patch(color=colors["backward"], label="backward (incl. recomputation)"),
                       Patch(color=colors["comm"], label="transfer (to next/previous stage)"),
                       Patch(facecolor="white", edgecolor="gray", label="idle")],
              loc="upper center", bbox_to_anchor=(0.5, -0.1 if len(devices) > 4 else -0.22),
              ncol=4, fontsize=9)
    title = os.path.basename(trace_path)
    if info:
        title = (f'{info["model"]}, {MIXTURES[info["mixture"]]}, max length {info["max_len"]}: '
                 f'iteration 0 (replica 0), {info["schedule"]} schedule, recompute '
                 f'{info["recompute"]}, {info["micro_batches"]} micro-batches, predicted '
                 f'{float(info["predicted_iteration_ms"]):.0f} ms, bubble '
                 f'{100 * float(info["bubble_fraction"]):.0f}%\ncost model: {info["cost_model"]}; '
                 f'{int(info["memory_mib"]) // 1024} GiB per device; simulated timeline')
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    base = os.path.basename(trace_path).replace(".trace.json", "")
    path = os.path.join(out, f"timeline.{base}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def count_text(comps, what):
    """'16 of 20 cells (of the other 4: 2 below 1.00, nothing fits in 2)': how many cells have
    a ratio of at least 1 (Varipipe's printed tokens/s at least the best baseline's), and why
    not the rest."""
    ratios = [c["ratio"] for c in comps if c["ratio"] is not None]
    wins = sum(r >= 1 for r in ratios)
    text = f"{wins} of {len(comps)} {what}"
    rest = []
    if len(ratios) > wins:
        rest.append(f"{len(ratios) - wins} below 1.00")
    missing = Counter(c["why"] for c in comps if c["ratio"] is None)
    rest += [f"{why} in {n}" for why, n in sorted(missing.items())]
    if rest and wins < len(comps):
        text += f" (of the other {len(comps) - wins}: " + ", ".join(rest) + ")"
    return text


def ratio_range(comps):
    ratios = [c["ratio"] for c in comps if c["ratio"] is not None]
    if not ratios:
        return None
    return f"{fmt_ratio(min(ratios))} to {fmt_ratio(max(ratios))}"


def cell_tables(comp, x_name, x_of, dp_column):
    """Per (model, mixture): one row per cell, Varipipe against the best baseline, named."""
    lines = []
    by_panel = defaultdict(list)
    for cell, c in comp.items():
        by_panel[cell[:2]].append((cell, c))
    for model, mixture in panels([{"model": m, "mixture": x} for m, x in by_panel]):
        entries = sorted(by_panel[(model, mixture)], key=lambda e: (int(e[0][2]), int(e[0][3])))
        fixed = (f"{int(entries[0][0][3]) // 1024} GiB per device" if x_name == "max length"
                 else f"max length {entries[0][0][2]}")
        lines += [f"**{model_label(model)}, {MIXTURES.get(mixture, mixture)}** ({model}, {fixed}):",
                  ""]
        head = (f"| {x_name} | Varipipe tokens/s | best baseline (setting, recompute) | "
                "its tokens/s | Varipipe / best |")
        rule = "|---|---|---|---|---|"
        if dp_column:
            head += " DP alone / best |"
            rule += "---|"
        lines += [head, rule]
        for cell, c in entries:
            h = c["head"]
            v = h["row"]
            v_text = (fmt_tokens(v["tokens_per_s"]) if v is not None and v["feasible"] == "1"
                      else "does not fit" if v is not None else "-")
            b = h["best"]
            b_name, b_tokens = ((baseline_name(b), fmt_tokens(b["tokens_per_s"])) if b
                                else ("none fits", "-"))
            ratio = fmt_ratio3(h["ratio"]) if h["ratio"] is not None else h["why"]
            row = f"| {x_of(cell)} | {v_text} | {b_name} | {b_tokens} | {ratio} |"
            if dp_column:
                d = c.get("dp")
                row += (f' {fmt_ratio3(d["ratio"])} |' if d and d["ratio"] is not None else
                        f' {d["why"]} |' if d else " - |")
            lines.append(row)
        lines.append("")
    return lines


def write_page(page, out, figures, comp_len, comp_mem, head, plan_stats, sched, settings,
               cost_models, run_time):
    rel = os.path.relpath(out, os.path.dirname(os.path.abspath(page)))
    default = head == "varipipe"
    dp_column = default and any("dp" in c for c in list(comp_len.values()) +
                                list(comp_mem.values()))

    def img(path, alt):
        return f"![{alt}]({rel}/{os.path.basename(path)})"

    len_heads = [c["head"] for c in comp_len.values()]
    mem_heads = [c["head"] for c in comp_mem.values()]
    everything = len_heads + mem_heads
    headline_text = ("**Headline: Varipipe's predicted real tokens/s is at least the best tuned "
                     "baseline's (ratio >= 1.00, computed from the printed tokens/s) in " +
                     count_text(everything, "cells") + f"** ({len(len_heads)} cells of the "
                     "maximum-length sweep" + (f" and {len(mem_heads)} of the memory sweep"
                                               if mem_heads else "") + ", below).")
    if default:
        method_text = ("Varipipe is the planner's default search: per mini-batch it tries every "
                       "partition method (the dynamic program and each baseline, the baseline's "
                       "setting tuned on that mini-batch) with every schedule and keeps the best "
                       "plan; \"DP alone\" is the dynamic program by itself, drawn for reference. ")
    else:
        method_text = ("These CSVs have no `varipipe` rows (written before the planner's default "
                       "search was evaluated), so Varipipe below is the DP alone, choosing per "
                       "mini-batch. ")
    lines = ["# Evaluation in simulation", "",
             "Regenerated by `deploy/evaluate.sh` (" + run_time + "): the planner and "
             "simulator of this repository (`varipipe-evaluate`, `planner/tools/`) plan mini-batches "
             "of the synthetic mixtures (`docs/datasets.md`) for GPT-6.7B (pp = 4, dp = 2, A100-40GB, "
             "40 GiB per device) and T5-11B (pp = 8, A100-80GB, 80 GiB per device, targets a quarter "
             "of the maximum length), 65,536 tokens per global batch. Throughput is the planner's "
             "prediction (simulated makespan), not a measurement. "
             f"Cost models: {'; '.join(cost_models)}; measured ones are used from "
             "`deploy/cost-models/` when there are any (none yet). " + settings[:1].upper() +
             settings[1:] + ("." if settings else ""), "",
             method_text + "Baselines are tuned as a user would tune them: packing, fixed-size "
             "and padding try 1-64 rows per micro-batch, token-based budgets of 1-32 maximum "
             "lengths, each with every recompute mode (none, selective, full), and keep the one "
             "setting with the best predicted real tokens/s that fits memory on every "
             "mini-batch; each cell compares Varipipe against the best of these four tuned "
             "baselines. Every method chooses among the planner's schedules (GPipe, 1F1B, kFkB, "
             "adaptive, ZB-H1, adaptive zero-bubble) per mini-batch. The CSVs "
             "beside the plots list every setting tried and why each infeasible one does not "
             "fit.", "", headline_text, ""]

    # Throughput vs maximum length.
    lines += ["## Throughput vs maximum length", "", img(figures["throughput"], "throughput"), ""]
    lengths = sorted({int(c[2]) for c in comp_len})
    behind = [(model_label(c[0]), MIXTURES.get(c[1], c[1]), c[2], comp_len[c]["head"])
              for c in comp_len if comp_len[c]["head"]["ratio"] is not None
              and comp_len[c]["head"]["ratio"] < 1]
    behind_text = ("The best baseline is ahead (ratio below 1) at " +
                   ", ".join(f'{m} {x} {L} ({h["best"]["method"]}, {fmt_ratio3(h["ratio"])})'
                             for m, x, L, h in behind) + "." if behind else
                   "No tuned baseline is ahead of Varipipe anywhere in this grid.")
    # Against packing alone: does the advantage grow with the length in every panel?
    growth = []
    for model, mixture in panels([{"model": c[0], "mixture": c[1]} for c in comp_len]):
        pts = sorted((int(c[2]), v["packing"]["ratio"]) for c, v in comp_len.items()
                     if c[:2] == (model, mixture) and v["packing"]["ratio"] is not None)
        if len(pts) >= 2:
            growth.append(pts)
    packing_text = ""
    if growth and all(p[-1][1] > p[0][1] for p in growth):
        lo = [p[0][1] for p in growth]
        hi = [p[-1][1] for p in growth]
        packing_text = (" Against packing with full-row attention, Varipipe's advantage grows "
                        "with the length in every panel (Varipipe / packing "
                        f"{fmt_ratio(min(lo))} to {fmt_ratio(max(lo))} at the shortest length, "
                        f"{fmt_ratio(min(hi))} to {fmt_ratio(max(hi))} at the longest where both "
                        "fit), because its packed rows compute attention over the whole maximum "
                        "length while Varipipe's micro-batches need not.")
    varlen = [v["packing-varlen"]["ratio"] for v in comp_len.values()
              if "packing-varlen" in v and v["packing-varlen"]["ratio"] is not None]
    if varlen:
        packing_text += (" Packing with variable-length attention (each sample attends over "
                         "itself) closes much of that gap; Varipipe / it is "
                         f"{fmt_ratio(min(varlen))} to {fmt_ratio(max(varlen))}.")
    lines += [f"Predicted real tokens per second of each method's tuned setting as the maximum "
              f"length grows from {lengths[0]:,} to {lengths[-1]:,} tokens. Varipipe / best "
              f"baseline (below) is Varipipe's tokens/s over the best tuned baseline's in the "
              f"same cell, {ratio_range(len_heads) or 'nowhere both fit'} where both fit; it is "
              f"at least 1.00 in " + count_text(len_heads, "cells") + ". " + behind_text +
              packing_text, ""]
    lines += ["| model | mixture | " + " | ".join(str(L) for L in lengths) + " |",
              "|---|---|" + "---|" * len(lengths)]
    for model, mixture in panels([{"model": c[0], "mixture": c[1]} for c in comp_len]):
        row = []
        for L in lengths:
            h = next((v["head"] for c, v in comp_len.items()
                      if c[:2] == (model, mixture) and int(c[2]) == L), None)
            row.append("-" if h is None else
                       fmt_ratio3(h["ratio"]) if h["ratio"] is not None else h["why"])
        lines.append(f"| {model_label(model)} | {MIXTURES.get(mixture, mixture)} | " +
                     " | ".join(row) + " |")
    # Against each way of packing, per cell.
    lines += ["", "Varipipe / packing with full-row attention and / packing with "
              "variable-length attention, per cell:", "",
              "| model | mixture | " + " | ".join(str(L) for L in lengths) + " |",
              "|---|---|" + "---|" * len(lengths)]
    for model, mixture in panels([{"model": c[0], "mixture": c[1]} for c in comp_len]):
        row = []
        for L in lengths:
            v = next((v for c, v in comp_len.items()
                      if c[:2] == (model, mixture) and int(c[2]) == L), None)
            if v is None:
                row.append("-")
                continue
            parts = [fmt_ratio3(v[k]["ratio"]) if v[k]["ratio"] is not None else v[k]["why"]
                     for k in ("packing", "packing-varlen")]
            row.append(" / ".join(parts))
        lines.append(f"| {model_label(model)} | {MIXTURES.get(mixture, mixture)} | " +
                     " | ".join(row) + " |")
    lines += ["", "Per cell, the best tuned baseline named (method, tuned setting, recompute "
              "mode)" + (" and the DP alone against the same baseline" if dp_column else "") +
              ":", ""]
    lines += cell_tables(comp_len, "max length", lambda c: c[2], dp_column)
    nothing = sorted({(model_label(c[0]), MIXTURES.get(c[1], c[1]), int(c[2]))
                      for c, v in comp_len.items() if v["head"]["why"] == "nothing fits"})
    if nothing:
        why = ("GPT-6.7B on pp = 4 leaves about 13 GiB of activation room on the busiest device "
               "of an A100-40GB, and one 8,192-token sequence alone peaks above it even with "
               "full recomputation (the CSV names the sample and the bytes)."
               if all(m == "GPT-6.7B" and L == 8192 for m, _, L in nothing) else
               "the CSV names, per setting, the sample and the bytes that do not fit.")
        lines += ["Nothing fits at " + ", ".join(f"{m} {x} {L}" for m, x, L in nothing) + ": " +
                  why, ""]
    best_counts = Counter(h["best"]["method"] for h in len_heads if h["best"] is not None)
    if best_counts:
        text = ("Which baseline is best depends on the cell: " +
                ", ".join(f"{m} in {n}" for m, n in best_counts.most_common()) +
                f" of the {sum(best_counts.values())} cells where one fits; each is tuned on the "
                "same mini-batches it is measured on, a user's best case.")
        dps = [v["dp"] for v in comp_len.values() if "dp" in v]
        dp_ratios = [d["ratio"] for d in dps if d["ratio"] is not None]
        if default and dp_ratios:
            text += (" The DP alone (without the baselines' partitions) is "
                     f"{fmt_ratio(min(dp_ratios))} "
                     f"to {fmt_ratio(max(dp_ratios))} the best baseline and at least it in "
                     f"{sum(r >= 1 for r in dp_ratios)} of {len(dp_ratios)} cells where both "
                     "fit; the default search also tries each baseline's partition, its setting "
                     "tuned per mini-batch.")
        lines += [text, ""]

    lines += ["## Padding efficiency and micro-batches", "", img(figures["padding"], "padding"), "",
              "Padding efficiency (real tokens over the tokens computed, padding and packing's "
              "unused row ends included) and the number of micro-batches of each method's tuned "
              "setting. Packing fills its rows almost completely (T5 less, as targets are packed "
              "into rows a quarter as long), but every row costs attention over the full "
              "length, which the throughput plot shows; unsorted padding is worst at short "
              "lengths, and at long ones its tuned setting (and fixed-size's) is one or two "
              "samples per micro-batch: little padding, but hundreds of small micro-batches.", ""]
    if sched:
        cvs = sorted(sched)
        lines += ["## Adaptive schedule vs 1F1B", "", img(figures["schedules"], "schedules"), "",
                  "Simulated makespans of 1F1B and of the adaptive schedule (with its ordering "
                  "search, held to 1F1B's memory on each device) on synthetic pipelines whose "
                  "micro-batch times spread more and more. With equal micro-batches the two are "
                  f"equal ({sched[cvs[0]]:.2f}x at CV 0) and with a small spread the adaptive "
                  f"schedule can be slightly slower (1F1B / adaptive down to "
                  f"{min(sched.values()):.2f}x); from CV 0.4 on it wins, and at CV "
                  f"{cvs[-1]:.1f} 1F1B takes {sched[cvs[-1]]:.2f}x its time on average (up to "
                  f"{max(sched.values()):.2f}x).", ""]
    if "planning" in figures:
        lines += ["## Planning time per iteration", "", img(figures["planning"], "planning"), ""]
    worst = max(plan_stats.items(), key=lambda kv: kv[1][1]) if plan_stats else None
    if worst:
        (wm, wx, wl), (med, mx, pred) = worst
        ahead = [q / p for p, _, q in plan_stats.values() if p > 0]
        lo, hi = min(ahead), max(ahead)

        def times(v):
            return f"{v:,.0f}x" if v >= 10 else f"{v:.1f}x"
        keeps_up = ("so daemons planning ahead keep up with training" if lo > 1 else
                    "so where it is below 1x, one planning thread falls behind training")
        who = ("The planner's planning time per mini-batch with its default search (every "
               "partition method, each baseline's setting tuned per mini-batch, every schedule; "
               "one thread)" if default else "The DP's planning time per mini-batch (one thread)")
        lines += [f"{who} against the predicted iteration time the plan is made for: the "
                  f"median predicted iteration is {times(lo)} to {times(hi)} the median planning "
                  f"time, {keeps_up}. The slowest case is {wm} {MIXTURES[wx]} at {wl} tokens: "
                  f"median {med:.1f} ms, worst {mx:.1f} ms, against a predicted iteration of "
                  f"{pred / 1000:.1f} s (mini-batches without a plan that fits are left out, so "
                  f"GPT at 8,192 shows only those that fit).", ""]
    if "memory" in figures:
        mem_len = sorted({int(c[2]) for c in comp_mem})
        nothing_mem = defaultdict(list)
        for c, v in comp_mem.items():
            if v["head"]["why"] == "nothing fits":
                nothing_mem[model_label(c[0])].append(int(c[3]) // 1024)
        nothing_text = "".join(
            f", and nothing fits {m} at {', '.join(str(g) for g in sorted(set(gs)))} GiB"
            for m, gs in sorted(nothing_mem.items()))
        lines += ["## Throughput vs device memory", "", img(figures["memory"], "memory"), "",
                  f"Real tokens/s at maximum length {', '.join(f'{L:,}' for L in mem_len)} as "
                  "the memory limit per device changes (the compute model stays that of the "
                  "job's GPU). With less memory every method must use smaller micro-batches or "
                  f"recompute more{nothing_text}. Wherever Varipipe and a baseline fit, Varipipe "
                  f"/ best baseline is {ratio_range(mem_heads) or '-'}; it is at least 1.00 in " +
                  count_text(mem_heads, "cells") + ".", ""]
        lines += cell_tables(comp_mem, "memory (GiB)", lambda c: f"{int(c[3]) // 1024}",
                             dp_column)
    lines += ["## One iteration's timeline", ""]
    for path in figures["timelines"]:
        lines += [img(path, "timeline"), ""]
    lines += ["The simulated timeline of iteration 0 (data-parallel replica 0) as the planner "
              "plans it: per device, forwards, backwards and the transfers on its link, idle "
              "time white. The same trace opens in Perfetto (`docs/evaluation/traces/`).", ""]
    with open(page, "w") as f:
        f.write("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True,
                    help="where the CSVs (and traces/) are; the PNGs are written here")
    ap.add_argument("--page", help="write the Markdown page here")
    ap.add_argument("--settings", default="", help="the run's settings, for titles and the page")
    ap.add_argument("--run_time", default="a few minutes on 2 cores",
                    help="how long the run took, for the page")
    args = ap.parse_args()
    out = args.dir
    throughput = read_csv(os.path.join(out, "throughput.csv"))
    memory = read_csv(os.path.join(out, "memory.csv"))
    planning = read_csv(os.path.join(out, "planning.csv"))
    traces = read_csv(os.path.join(out, "trace.csv"))
    schedules = read_csv(os.path.join(out, "schedules.csv"))
    if not throughput:
        sys.exit(f"plot-evaluation: {out}/throughput.csv is missing or empty")
    written = []
    keys = sorted({cost_key(r["cost_model"]) for r in throughput},
                  key=lambda k: k != "analytic")
    figures_by_key = {}
    for key in keys:
        sel = lambda rows: [r for r in rows if cost_key(r["cost_model"]) == key]  # noqa: E731
        head = headline(sel(throughput))
        searcher = "the planner's default search" if head == "varipipe" else "the DP"
        figs = {"timelines": []}
        comp_len = comparisons(sel(throughput))
        figs["throughput"] = plot_throughput(sel(throughput), key, out, args.settings, comp_len)
        figs["padding"] = plot_padding(sel(throughput), key, out, args.settings)
        plan_stats = {}
        if sel(planning):
            figs["planning"], plan_stats = plot_planning(sel(planning), key, out, args.settings,
                                                         searcher)
        comp_mem = {}
        if sel(memory):
            comp_mem = comparisons(sel(memory))
            figs["memory"] = plot_memory(sel(memory), key, out, args.settings, comp_mem)
        figures_by_key[key] = (figs, comp_len, comp_mem, head, plan_stats)
        written += [v for k, v in figs.items() if k != "timelines"]
    sched = {}
    if schedules:
        path, sched = plot_schedules(schedules, out)
        written.append(path)
        for entry in figures_by_key.values():
            entry[0]["schedules"] = path
    trace_dir = os.path.join(out, "traces")
    for name in sorted(os.listdir(trace_dir)) if os.path.isdir(trace_dir) else []:
        if not name.endswith(".trace.json"):
            continue
        parts = name[:-len(".trace.json")].split(".")
        # MODEL.MIXTURE.TAG, where the model's name may hold dots itself.
        mix_at = next((k for k, p in enumerate(parts) if p in MIXTURES), None)
        if mix_at is None:
            continue
        stem, mixture, tag = ".".join(parts[:mix_at]), parts[mix_at], ".".join(parts[mix_at + 1:])
        kind = "T5" if stem.startswith("t5") else "GPT"
        info = next((r for r in traces if r["model"].startswith(kind) and r["mixture"] == mixture
                     and (cost_key(r["cost_model"]) == "analytic") == (tag == "analytic")), None)
        path = plot_timeline(os.path.join(trace_dir, name), info, out)
        written.append(path)
        key = "analytic" if tag == "analytic" else (cost_key(info["cost_model"]) if info else tag)
        if key in figures_by_key:
            figures_by_key[key][0]["timelines"].append(path)
    for path in written:
        print(f"plot-evaluation: wrote {path}")
    if args.page and "analytic" in figures_by_key:
        figs, comp_len, comp_mem, head, plan_stats = figures_by_key["analytic"]
        write_page(args.page, out, figs, comp_len, comp_mem, head, plan_stats, sched,
                   args.settings, sorted({r["cost_model"] for r in throughput}), args.run_time)
        print(f"plot-evaluation: wrote {args.page}" +
              ("" if head == "varipipe" else
               " (no varipipe rows: the DP alone stands for Varipipe)"))
        for sweep, comp in [("length", comp_len), ("memory", comp_mem)]:
            for cell, c in comp.items():
                h = c["head"]
                x = cell[2] if sweep == "length" else f"{int(cell[3]) // 1024} GiB"
                print(f"  Varipipe / best baseline {cell[0]} {cell[1]} {x}: " +
                      (f'{fmt_ratio3(h["ratio"])} vs {baseline_name(h["best"])}'
                       if h["ratio"] is not None else h["why"]))


if __name__ == "__main__":
    main()
