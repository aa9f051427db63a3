#!/usr/bin/env python3
"""Draws a training run from rank 0's --metrics_jsonl: loss and real tokens/s per iteration.

Usage: deploy/plot-run.py METRICS_JSONL OUT_PNG [--title TEXT]

Needs Debian's python3-matplotlib (deploy/install-deps.sh); when the python3
found first lacks it, the script runs itself again with /usr/bin/python3.
"""
import argparse
import json
import os
import sys

try:
    import matplotlib
except ImportError:
    if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    sys.exit("plot-run: python3-matplotlib is missing (deploy/install-deps.sh installs it)")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("metrics")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    rows = []
    with open(args.metrics) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"plot-run: {args.metrics}:{number}: not JSON ({e})")
    if not rows:
        sys.exit(f"plot-run: {args.metrics}: no iterations")
    rows.sort(key=lambda r: r["iteration"])
    it = [r["iteration"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    top.plot(it, [r["loss"] for r in rows], marker="o", markersize=3, color="#d62728")
    top.set_ylabel("loss")
    top.grid(alpha=0.3)
    bottom.plot(it, [r["real_tokens_per_s"] for r in rows], marker="o", markersize=3,
                color="#1f77b4", label="real tokens/s")
    bottom.set_ylabel("real tokens / s")
    bottom.set_xlabel("iteration")
    bottom.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    bottom.grid(alpha=0.3)
    if len(rows) > 1:
        mean = sum(r["real_tokens_per_s"] for r in rows[1:]) / (len(rows) - 1)
        bottom.axhline(mean, color="gray", linestyle="--", linewidth=1,
                       label=f"mean after iteration {it[0]}: {mean:.0f}")
    bottom.legend(fontsize=9)
    eff = [r.get("padding_efficiency", 0) for r in rows]
    title = args.title or os.path.basename(os.path.dirname(os.path.abspath(args.metrics)))
    fig.suptitle(f"{title}: {len(rows)} iterations, loss {rows[0]['loss']:.3f} -> "
                 f"{rows[-1]['loss']:.3f}, padding efficiency {100 * sum(eff) / len(eff):.1f}% "
                 f"(mean)", fontsize=11)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)


if __name__ == "__main__":
    main()
