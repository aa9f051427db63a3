#!/usr/bin/env python3
"""The long-tail evaluation of context parallelism (docs/evaluation.md,
"Context parallelism on a long tail").

A Llama-3-8B-like job (deploy/configs/llama-3-8b.json) on the long-tail
mixture (docs/datasets.md: median about 1,500 tokens, a tail to 64k) on 8 and
16 GPUs of 80 GiB (the H100 analytic model), 4 pipeline stages, 32k tokens
per GPU and global batch. For each GPU count it plans, with varipipe-plan:

  - no context parallelism (context 1, the GPUs as data-parallel replicas),
    where it fits;
  - static context parallelism (context_split ALWAYS: every micro-batch split,
    with one recompute mode for the iteration, planner.uniform_recompute, as
    Megatron-LM, torchtitan and DeepSpeed Ulysses run it) at the smallest
    context degree c in {2, 4, 8} that fits the longest sample;
  - at the same c (the same layout: pipeline 4, data GPUs / 4c), each of the
    per-micro-batch choices on its own and together: every micro-batch split
    but each with its own recompute mode (ALWAYS); split or whole per
    micro-batch with one recompute mode (PER_MICRO_BATCH, uniform); and
    both (PER_MICRO_BATCH, the default);
  - a bound: static and the default again with every split micro-batch
    priced ideally (varipipe-plan --ideal_context_split: each lane takes
    exactly 1/c of the micro-batch's time on one device, and nothing is
    transferred). No split costs less, so a plan priced this way bounds
    what any split-or-whole choice can gain over splitting everything
    (up to the planner's search, which is the same for every row);

and writes each one's predicted real tokens/s (real tokens of the mini-batch
over its predicted iteration, mean over the mini-batches) to a CSV and an SVG
bar chart (hand-written: no plotting library needed).

Usage: deploy/long_tail_eval.py [--build DIR] [--iterations N] [--out DIR] [--gpus 8,16]
         [--intra_node_gbps G [--intra_node_latency_us U]]
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def job_config(base, gpus, context, policy, uniform, tokens_per_gpu, intra_node=None):
    config = json.loads(json.dumps(base))
    config["job_id"] = "llama-3-8b-long-tail-%dgpu" % gpus
    config["model"]["max_position_embeddings"] = 65536
    p = {"pipeline": 4, "data": gpus // (4 * context)}
    if context > 1:
        p["context"] = context
        p["context_split"] = policy
    config["parallelism"] = p
    config["cluster"]["device_memory_limit_mib"] = 80 * 1024
    config["cluster"]["hardware"] = "h100-80gb"
    config["data"] = {
        "format": "SYNTHETIC",
        "synthetic_mixture": "LONG_TAIL",
        "synthetic_num_samples": 20000,
        "tokens_per_global_batch": tokens_per_gpu * gpus,
        "max_sequence_length": 65536,
        "seed": 42,
    }
    config["training"] = {"iterations": 100, "zero_stage": 1}
    config.setdefault("planner", {})["uniform_recompute"] = uniform
    if intra_node is not None:
        # (GB/s, us): the links inside a node, the context groups' included.
        config["cluster"]["intra_node_bandwidth_gbps"] = intra_node[0]
        config["cluster"]["intra_node_latency_us"] = intra_node[1]
    return config


def plan(binary, config, iterations, scratch, extra_args=()):
    """Mean predicted real tokens/s and split micro-batches, or the error."""
    path = os.path.join(scratch, "job.json")
    with open(path, "w") as f:
        json.dump(config, f)
    run = subprocess.run(
        [binary, "--config", path, "--iterations", str(iterations), "--json",
         "--log_level=error"] + list(extra_args),
        capture_output=True, text=True)
    reports = []
    for line in run.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            reports.append(json.loads(line))
    failed = [r for r in reports if not r.get("ok")]
    if run.returncode != 0 or failed or not reports:
        error = failed[0].get("error", "") if failed else run.stderr.strip()
        return {"ok": False, "error": error.splitlines()[0] if error else "no plan"}
    tokens = [r["real_tokens"] / (r["predicted_iteration_ms"] / 1e3) for r in reports]
    return {
        "ok": True,
        "tokens_per_second": sum(tokens) / len(tokens),
        "iteration_ms": sum(r["predicted_iteration_ms"] for r in reports) / len(reports),
        "split": sum(r.get("split_micro_batches", 0) for r in reports),
        "raised": sum(r.get("raised_recompute_micro_batches", 0) for r in reports),
        "micro_batches": sum(r["micro_batches"] for r in reports),
        "recompute": ",".join(sorted({r["recompute"] for r in reports})),
        "peak_gib": max(max(r["peak_activation_bytes_per_rank"]) for r in reports) / 2**30,
    }


def svg_bars(rows, path):
    """Grouped bars: per GPU count, tokens/s of each variant."""
    colors = {"no context parallelism": "#9e9e9e", "static": "#e07b39",
              "static, own modes": "#f2b38a", "per micro-batch, one mode": "#9cc3ea",
              "per micro-batch": "#3a7dc9", "static, larger c": "#b5531c",
              "per micro-batch, larger c": "#1f4f8a",
              "static, ideal split": "#f7d9c4",
              "per micro-batch, ideal split": "#c9dcf2"}
    groups = sorted({r["gpus"] for r in rows})
    variants = list(colors)
    top = max([r["tokens_per_second"] for r in rows if r["ok"]] + [1])
    width, height, left, bottom, plot_h = 900, 420, 70, 100, 250
    group_w = (width - left - 20) / max(1, len(groups))
    bar_w = group_w / (len(variants) + 1)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="12">' % (width, height),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="20" font-size="14">Llama-3-8B-like, long-tail mixture, '
           'predicted real tokens/s</text>' % left]
    y0 = height - bottom
    for k in range(6):
        value = top * k / 5
        y = y0 - plot_h * k / 5
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>' %
                   (left, width - 20, y, y))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%.0fk</text>' %
                   (left - 6, y + 4, value / 1e3))
    for g, gpus in enumerate(groups):
        x0 = left + g * group_w + bar_w / 2
        for v, variant in enumerate(variants):
            match = [r for r in rows if r["gpus"] == gpus and r["variant"] == variant]
            x = x0 + v * bar_w
            if not match:
                continue
            if not match[0]["ok"]:
                out.append('<text x="%.1f" y="%.1f" text-anchor="middle" '
                           'font-size="10">does not fit</text>' % (x + bar_w / 2, y0 - 6))
                continue
            r = match[0]
            h = plot_h * r["tokens_per_second"] / top
            out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>' %
                       (x, y0 - h, bar_w * 0.9, h, colors[variant]))
            label = "%.0fk" % (r["tokens_per_second"] / 1e3)
            if r["context"] > 1:
                label += " c%d" % r["context"]
            out.append('<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%s</text>' %
                       (x + bar_w * 0.45, y0 - h - 4, label))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%d GPUs</text>' %
                   (left + g * group_w + group_w / 2, y0 + 20, gpus))
    for v, variant in enumerate(variants):
        x = left + (v % 3) * 230
        y = height - 58 + (v // 3) * 18
        out.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/>' %
                   (x, y - 10, colors[variant]))
        out.append('<text x="%d" y="%d">%s</text>' % (x + 16, y, variant))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "evaluation"))
    parser.add_argument("--gpus", default="8,16")
    parser.add_argument("--tokens_per_gpu", type=int, default=65536,
                        help="global batch tokens per GPU")
    parser.add_argument("--intra_node_gbps", type=float, default=None,
                        help="links inside a node, context groups' included (default: the "
                        "config's, 150 GB/s)")
    parser.add_argument("--intra_node_latency_us", type=float, default=None,
                        help="with --intra_node_gbps (default: the config's, 10 us)")
    args = parser.parse_args()
    binary = os.path.join(args.build, "bin", "varipipe-plan")
    with open(os.path.join(ROOT, "deploy", "configs", "llama-3-8b.json")) as f:
        base = json.load(f)
    intra_node = None
    if args.intra_node_gbps is not None:
        intra_node = (args.intra_node_gbps,
                      10.0 if args.intra_node_latency_us is None else args.intra_node_latency_us)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for gpus in [int(g) for g in args.gpus.split(",")]:
            def record(variant, context, policy, uniform, ideal=False):
                result = plan(binary, job_config(base, gpus, context, policy, uniform,
                                                 args.tokens_per_gpu, intra_node),
                              args.iterations, scratch,
                              ["--ideal_context_split"] if ideal else [])
                row = {"gpus": gpus, "variant": variant, "context": context,
                       "tokens_per_second": 0.0}
                row.update(result)
                rows.append(row)
                print("%2d GPUs, %-26s c=%d: %s" % (
                    gpus, variant, context,
                    "%.0f real tokens/s (%s, %d of %d micro-batches split, %d raised)" % (
                        row["tokens_per_second"], row["recompute"], row["split"],
                        row["micro_batches"], row["raised"]) if row["ok"]
                    else "no plan: " + row["error"]),
                    file=sys.stderr)
                return row
            record("no context parallelism", 1, None, False)
            static = None
            for c in (2, 4, 8):
                if 4 * c > gpus:
                    break
                static = record("static", c, "ALWAYS", True)
                if static["ok"]:
                    break
            if static is not None:
                c = static["context"]
                record("static, own modes", c, "ALWAYS", False)
                record("per micro-batch, one mode", c, "PER_MICRO_BATCH", True)
                record("per micro-batch", c, "PER_MICRO_BATCH", False)
                # The bound on what any split-or-whole choice can gain
                # (the docstring's).
                record("static, ideal split", c, "ALWAYS", True, True)
                record("per micro-batch, ideal split", c, "PER_MICRO_BATCH", False, True)
                # Larger degrees, as --search_parallelism would weigh them:
                # both policies, so that what the degree gains and what the
                # per-micro-batch choice gains stay apart.
                for larger in (4, 8):
                    if larger <= c or 4 * larger > gpus:
                        continue
                    record("static, larger c", larger, "ALWAYS", True)
                    record("per micro-batch, larger c", larger, "PER_MICRO_BATCH", False)
    os.makedirs(args.out, exist_ok=True)
    fields = ["gpus", "variant", "context", "ok", "tokens_per_second", "iteration_ms", "split",
              "raised", "micro_batches", "recompute", "peak_gib", "error"]
    with open(os.path.join(args.out, "long_tail.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: r.get(k, "") for k in fields})
    svg_bars(rows, os.path.join(args.out, "long_tail.svg"))
    for gpus in sorted({r["gpus"] for r in rows}):
        mine = [r for r in rows if r["gpus"] == gpus and r["ok"]]
        static = [r for r in mine if r["variant"] in ("static", "static, larger c")]
        if not static:
            continue
        smallest = min(static, key=lambda r: r["context"])
        for r in mine:
            if r["variant"] in ("per micro-batch", "per micro-batch, larger c"):
                same = [s for s in static if s["context"] == r["context"]]
                print("%d GPUs: per micro-batch at c=%d / static at the smallest c=%d = %.2fx%s" %
                      (gpus, r["context"], smallest["context"],
                       r["tokens_per_second"] / smallest["tokens_per_second"],
                       " (/ static at c=%d: %.2fx)" % (r["context"], r["tokens_per_second"] /
                                                       same[0]["tokens_per_second"])
                       if same else ""))


        bound = [r for r in mine if r["variant"] == "per micro-batch, ideal split"]
        ideal_static = [r for r in mine if r["variant"] == "static, ideal split"]
        if bound and ideal_static:
            print("%d GPUs: with ideal splits, static at c=%d gains %.1f%% (what splitting "
                  "costs it) and per micro-batch reaches %.2fx static (the bound)" %
                  (gpus, smallest["context"],
                   100 * (ideal_static[0]["tokens_per_second"] /
                          smallest["tokens_per_second"] - 1),
                   bound[0]["tokens_per_second"] / smallest["tokens_per_second"]))


if __name__ == "__main__":
    main()
