#!/usr/bin/env python3
"""Draws the evaluation's CSVs (deploy/evaluate.sh) as PNGs and writes the page.

Usage: deploy/plot-evaluation.py --dir DIR [--page FILE] [--settings TEXT]

Reads DIR/{throughput,memory,planning,trace,schedules}.csv and DIR/traces/*.json,
writes DIR/*.png (one set per cost model: the analytic one without suffix,
measured ones with the cost model's name) and, with --page, the Markdown page
that shows every plot with what it shows and the headline numbers.
"""
import argparse
import csv
import json
import math
import os
import re
import statistics
import sys
import textwrap
from collections import defaultdict

try:
    import matplotlib
except ImportError:
    # Debian's python3 has python3-matplotlib; another python3 may come first.
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    sys.exit("plot-evaluation: python3-matplotlib is missing (deploy/install-deps.sh installs it)")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METHODS = ["dp", "packing", "token-based", "fixed-size", "padding"]
LABELS = {
    "dp": "Varipipe (DP)",
    "packing": "packing (no cross-contamination)",
    "token-based": "token-based",
    "fixed-size": "fixed-size (sorted)",
    "padding": "padding",
}
COLORS = {
    "dp": "#d62728",
    "packing": "#1f77b4",
    "token-based": "#2ca02c",
    "fixed-size": "#9467bd",
    "padding": "#7f7f7f",
}
MARKERS = {"dp": "o", "packing": "s", "token-based": "^", "fixed-size": "D", "padding": "v"}
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
                  key=lambda p: (not p[0].startswith("GPT"), p[1] != "flan"))
    return seen


def chosen(rows):
    """{(model, mixture, x, method): row} of each method's tuned setting."""
    out = {}
    for r in rows:
        if r["chosen"] == "1":
            out[(r["model"], r["mixture"], r["max_len"], r["memory_mib"], r["method"])] = r
    return out


def cost_line(rows):
    return "; ".join(sorted({r["cost_model"] for r in rows}))


def fmt_ratio(r):
    """Two decimals, three when that hides which side wins."""
    return f"{r:.3f}x" if abs(r - 1) < 0.005 else f"{r:.2f}x"


def fmt_tokens(v):
    return f"{v / 1000:.1f}k" if v < 1e6 else f"{v / 1e6:.2f}M"


def setting_text(r):
    if r["method"] == "dp":
        return "per mini-batch"
    return f'{r["setting"]}, {r["recompute"]}'


def plot_throughput(rows, key, out, settings):
    best = chosen(rows)
    pairs = panels(rows)
    fig, axes = plt.subplots(2, 2, figsize=(14, 10.5), squeeze=False)
    notes = {}
    for ax, (model, mixture) in zip(axes.flat, pairs):
        lengths = sorted({int(r["max_len"]) for r in rows
                          if r["model"] == model and r["mixture"] == mixture})
        memory = next(r["memory_mib"] for r in rows if r["model"] == model)
        ymax = 0
        for m in METHODS:
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
            ax.plot(xs, ys, marker=MARKERS[m], color=COLORS[m], label=LABELS[m],
                    linewidth=2.2 if m == "dp" else 1.4)
            if bad:
                ax.plot(bad, [0] * len(bad), linestyle="none", marker="x", color=COLORS[m],
                        markersize=10, clip_on=False)
        # DP over packing per length, and where packing wins.
        texts = []
        for L in lengths:
            d = best.get((model, mixture, str(L), memory, "dp"))
            p = best.get((model, mixture, str(L), memory, "packing"))
            t = best.get((model, mixture, str(L), memory, "token-based"))
            if not (d and p):
                continue
            if d["feasible"] == "1" and p["feasible"] == "1":
                ratio = float(d["tokens_per_s"]) / float(p["tokens_per_s"])
                notes[(model, mixture, L)] = ratio
                texts.append(f"{L}: {fmt_ratio(ratio)}" + (" (packing wins)" if ratio < 1 else ""))
            else:
                why = ("nothing fits" if d["feasible"] != "1" and p["feasible"] != "1" else
                       "DP does not fit" if d["feasible"] != "1" else "packing does not fit")
                notes[(model, mixture, L)] = why
                texts.append(f"{L}: {why}")
            if t and d["feasible"] == "1" and t["feasible"] == "1":
                notes[("token", model, mixture, L)] = (float(d["tokens_per_s"]) /
                                                       float(t["tokens_per_s"]))
        ax.text(0.02, 0.02, "DP / packing:\n" + "\n".join(texts), transform=ax.transAxes,
                fontsize=9, va="bottom", ha="left",
                bbox=dict(boxstyle="round", facecolor="white", alpha=0.85))
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
    fig.legend(handles, labels, loc="upper center", ncol=5, fontsize=10,
               bbox_to_anchor=(0.5, 0.93))
    suptitle(fig, "Real tokens/s vs maximum length (x on the axis: no setting fits memory)\n"
                 f"cost model: {cost_line(rows)}; 65,536 tokens per global batch; "
                 f"{settings}", 11)
    fig.text(0.5, 0.005, "Baselines tuned per length: rows per micro-batch (packing, fixed-size, "
             "padding) or token budget (token-based) x recompute mode,\nthe best predicted "
             "tokens/s that fits memory on every mini-batch; all methods use the adaptive and "
             "1F1B schedules.", ha="center", fontsize=9)
    fig.tight_layout(rect=(0, 0.035, 1, 0.89))
    path = os.path.join(out, f"throughput_vs_length{suffix(key)}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, notes


def plot_padding(rows, key, out, settings):
    best = chosen(rows)
    pairs = panels(rows)
    fig, axes = plt.subplots(2, len(pairs), figsize=(4.2 * len(pairs), 8), squeeze=False)
    for col, (model, mixture) in enumerate(pairs):
        lengths = sorted({int(r["max_len"]) for r in rows
                          if r["model"] == model and r["mixture"] == mixture})
        memory = next(r["memory_mib"] for r in rows if r["model"] == model)
        for m in METHODS:
            pts = [(L, best.get((model, mixture, str(L), memory, m))) for L in lengths]
            pts = [(L, r) for L, r in pts if r is not None and r["feasible"] == "1"]
            xs = [L for L, _ in pts]
            axes[0][col].plot(xs, [100 * float(r["padding_efficiency"]) for _, r in pts],
                              marker=MARKERS[m], color=COLORS[m], label=LABELS[m])
            axes[1][col].plot(xs, [float(r["micro_batches"]) for _, r in pts],
                              marker=MARKERS[m], color=COLORS[m], label=LABELS[m])
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
    fig.legend(handles, labels, loc="upper center", ncol=5, fontsize=9,
               bbox_to_anchor=(0.5, 0.925))
    suptitle(fig, f"Padding efficiency and micro-batches of each method's tuned setting\n"
                 f"cost model: {cost_line(rows)}; {settings}", 10)
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    path = os.path.join(out, f"padding_and_micro_batches{suffix(key)}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_memory(rows, key, out, settings):
    best = chosen(rows)
    pairs = panels(rows)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5), squeeze=False)
    ratios = {}
    for ax, (model, mixture) in zip(axes.flat, pairs):
        mems = sorted({int(r["memory_mib"]) for r in rows
                       if r["model"] == model and r["mixture"] == mixture})
        L = next(r["max_len"] for r in rows if r["model"] == model)
        for m in METHODS:
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
            ax.plot(xs, ys, marker=MARKERS[m], color=COLORS[m], label=LABELS[m],
                    linewidth=2.2 if m == "dp" else 1.4)
            if bad:
                ax.plot(bad, [0] * len(bad), linestyle="none", marker="x", color=COLORS[m],
                        markersize=10, clip_on=False)
        for mem in mems:
            d = best.get((model, mixture, L, str(mem), "dp"))
            p = best.get((model, mixture, L, str(mem), "packing"))
            t = best.get((model, mixture, L, str(mem), "token-based"))
            if d and p and d["feasible"] == "1" and p["feasible"] == "1":
                ratios[("packing", model, mixture, mem)] = (float(d["tokens_per_s"]) /
                                                            float(p["tokens_per_s"]))
            if d and t and d["feasible"] == "1" and t["feasible"] == "1":
                ratios[("token", model, mixture, mem)] = (float(d["tokens_per_s"]) /
                                                          float(t["tokens_per_s"]))
        ax.set_ylim(bottom=0)
        ax.set_xticks([m / 1024 for m in mems])
        ax.set_xlabel("device memory limit (GiB)")
        ax.set_ylabel("predicted real tokens / s")
        ax.set_title(f"{model}, {MIXTURES[mixture]}, max length {L}", fontsize=11)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(pairs):]:
        ax.axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=5, fontsize=10,
               bbox_to_anchor=(0.5, 0.925))
    suptitle(fig, "Real tokens/s vs device memory limit (x on the axis: no setting fits)\n"
                 f"cost model: {cost_line(rows)} (compute model unchanged, memory limit varied); "
                 f"baselines tuned per limit; {settings}", 10)
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    path = os.path.join(out, f"throughput_vs_memory{suffix(key)}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, ratios


def plot_planning(rows, key, out, settings):
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
    suptitle(fig, "Planning time per iteration (boxes: distribution over mini-batches, one "
                 "thread, this 2-core machine)\nagainst the predicted iteration time it "
                 f"plans ahead of; cost model: {cost_line(rows)}; {settings}", 10)
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


def memory_text(notes):
    pack = [v for k, v in notes.items() if k[:2] == ("memory", "packing")]
    token = [v for k, v in notes.items() if k[:2] == ("memory", "token")]
    if not pack:
        return "no limit lets both the DP and packing fit."
    text = (f"wherever both fit, the DP's throughput is {fmt_ratio(min(pack))} to "
            f"{fmt_ratio(max(pack))} packing's")
    if token:
        text += (f", and {fmt_ratio(min(token))} to {fmt_ratio(max(token))} the tuned "
                 f"token-based baseline's (which leads on T5 with more memory)")
    return text + "."


def write_page(page, out, figures, notes, plan_stats, sched, settings, cost_models, run_time):
    rel = os.path.relpath(out, os.path.dirname(page))

    def img(path, alt):
        return f"![{alt}]({rel}/{os.path.basename(path)})"

    def ratio(model_prefix, mixture, L):
        for k, r in notes.items():
            if len(k) == 3 and k[0].startswith(model_prefix) and k[1] == mixture and k[2] == L:
                return fmt_ratio(r) if isinstance(r, float) else r
        return "-"

    lines = ["# Evaluation in simulation", "",
             "Regenerated by `deploy/evaluate.sh` (" + run_time + "): the planner and "
             "simulator of this repository (`varipipe-evaluate`, `planner/tools/`) plan mini-batches "
             "of the synthetic mixtures (`docs/datasets.md`) for GPT-6.7B (pp = 4, dp = 2, A100-40GB, "
             "40 GiB per device) and T5-11B (pp = 8, A100-80GB, 80 GiB per device, targets a quarter "
             "of the maximum length), 65,536 tokens per global batch. Throughput is the planner's "
             "prediction (simulated makespan), not a measurement. "
             f"Cost models: {'; '.join(cost_models)}; measured ones are used from "
             "`deploy/cost-models/` when there are any (none yet). " + settings[:1].upper() +
             settings[1:] + ".", "",
             "Baselines are tuned as a user would tune them: packing, fixed-size and padding try "
             "1-64 rows per micro-batch, token-based budgets of 1-32 maximum lengths, each with "
             "every recompute mode (none, selective, full), and keep the setting with the best "
             "predicted real tokens/s that fits memory on every mini-batch; the DP chooses per "
             "mini-batch. Every method uses the planner's schedules (adaptive and 1F1B), so the "
             "throughput plots compare micro-batching alone. The CSVs beside the plots list every "
             "setting tried and why each infeasible one does not fit.", ""]
    lines += ["## Throughput vs maximum length", "", img(figures["throughput"], "throughput"), ""]
    rows = []
    for model, label in [("GPT", "GPT-6.7B"), ("T5", "T5-11B")]:
        for mixture in ["flan", "documents"]:
            rows.append(f"| {label} | {MIXTURES[mixture]} | "
                        + " | ".join(ratio(model, mixture, L) for L in
                                     [512, 1024, 2048, 4096, 8192]) + " |")
    wins = sorted({(k[0].split()[0], MIXTURES[k[1]], k[2]) for k, r in notes.items()
                   if len(k) == 3 and isinstance(r, float) and r < 1})
    token = {k[1:]: r for k, r in notes.items() if len(k) == 4}
    token_wins = sorted((r, k) for k, r in token.items() if r < 1)
    nothing = sorted({(k[0].split()[0], MIXTURES[k[1]], k[2]) for k, r in notes.items()
                      if len(k) == 3 and r == "nothing fits"})
    win_text = ("Packing wins (ratio below 1) at " +
                ", ".join(f"{m} {x} {L}" for m, x, L in wins) + ".") if wins else \
        "Packing wins nowhere in this grid."
    lines += ["Predicted real tokens per second of each method's tuned setting as the maximum "
              "length grows from 512 to 8,192 tokens: the DP's advantage over packing "
              "(DP / packing below) grows with the length, because packed rows compute attention "
              "over the whole maximum length while the DP pads each micro-batch only to its own "
              "longest sample. " + win_text, "",
              "| model | mixture | 512 | 1024 | 2048 | 4096 | 8192 |", "|---|---|---|---|---|---|---|"]
    lines += rows + [""]
    if nothing:
        lines += ["Nothing fits at " + ", ".join(f"{m} {x} {L}" for m, x, L in nothing) +
                  ": GPT-6.7B on pp = 4 leaves about 13 GiB of activation room on the busiest "
                  "device of an A100-40GB, and one 8,192-token sequence alone peaks above it even "
                  "with full recomputation (the CSV names the sample and the bytes).", ""]
    if token:
        lines += [f"Token-based micro-batching, tuned on the same mini-batches it is measured on, "
                  f"is the strongest baseline: it is within {100 * (max(abs(1 - r) for r in token.values())):.0f}% "
                  f"of the DP everywhere and ahead of it in {len(token_wins)} of {len(token)} "
                  f"cells (by at most {100 * (1 / min(token.values()) - 1):.0f}%), because the "
                  f"DP minimises its own objective (DynaPipe's balance of the sum and maximum "
                  f"micro-batch times) rather than the simulated makespan; the DP needs no "
                  f"budget chosen per length and dataset.", ""]
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
    lines += ["## Planning time per iteration", "", img(figures["planning"], "planning"), ""]
    worst = max(plan_stats.items(), key=lambda kv: kv[1][1]) if plan_stats else None
    if worst:
        (wm, wx, wl), (med, mx, pred) = worst
        lines += [f"The DP's planning time per mini-batch (one thread) against the predicted "
                  f"iteration time the plan is made for: the median planning time is two to three "
                  f"orders of magnitude shorter, so daemons planning ahead keep up with training. The "
                  f"slowest case is {wm} {MIXTURES[wx]} at {wl} tokens: median {med:.1f} ms, "
                  f"worst {mx:.1f} ms, against a predicted iteration of {pred / 1000:.1f} s "
                  f"(mini-batches without a plan that fits are left out, so GPT at 8,192 shows "
                  f"only those that fit).", ""]
    lines += ["## Throughput vs device memory", "", img(figures["memory"], "memory"), "",
              "Real tokens/s at maximum length 2,048 as the memory limit per device changes "
              "(the compute model stays that of the job's GPU). With less memory every method "
              "must use smaller micro-batches or recompute more, and below 32 GiB nothing fits "
              "GPT-6.7B; " + memory_text(notes), ""]
    lines += ["## One iteration's timeline", ""]
    for path in figures["timelines"]:
        lines += [img(path, "timeline"), ""]
    lines += ["The simulated timeline of iteration 0 (data-parallel replica 0) as the DP plans "
              "it: per device, forwards, backwards and the transfers on its link, idle time "
              "white. The same trace opens in Perfetto (`docs/evaluation/traces/`).", ""]
    with open(page, "w") as f:
        f.write("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--page")
    ap.add_argument("--settings", default="")
    ap.add_argument("--run_time", default="a few minutes on 2 cores")
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
        figs = {"timelines": []}
        figs["throughput"], notes = plot_throughput(sel(throughput), key, out, args.settings)
        figs["padding"] = plot_padding(sel(throughput), key, out, args.settings)
        plan_stats = {}
        if sel(planning):
            figs["planning"], plan_stats = plot_planning(sel(planning), key, out, args.settings)
        if sel(memory):
            figs["memory"], notes_memory = plot_memory(sel(memory), key, out, args.settings)
            notes.update({("memory",) + k: v for k, v in notes_memory.items()})
        figures_by_key[key] = (figs, notes, plan_stats)
        written += [v for k, v in figs.items() if k != "timelines"]
    sched = {}
    if schedules:
        path, sched = plot_schedules(schedules, out)
        written.append(path)
        for figs, _, _ in figures_by_key.values():
            figs["schedules"] = path
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
        figs, notes, plan_stats = figures_by_key["analytic"]
        write_page(args.page, out, figs, notes, plan_stats, sched, args.settings,
                   sorted({r["cost_model"] for r in throughput}), args.run_time)
        print(f"plot-evaluation: wrote {args.page}")
        for k, r in sorted(notes.items(), key=str):
            if len(k) == 3:
                print(f"  DP / packing {k[0]} {k[1]} {k[2]}: " +
                      (f"{r:.2f}x" if isinstance(r, float) else r))


if __name__ == "__main__":
    main()
