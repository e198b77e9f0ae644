"""The planner's objective frontier: median JCT against CPU utilisation, per objective setting.

    python benchmarks/objective_frontier.py [--jobs 500] [--seeds 1] [--stragglers pai]
        [--families ps-contention,roofline,trainer] [--output docs/results]

For every truth family and seed: one synthetic trace on its cluster; manual, optimus and
dlrover-oss once; dlrover-kfp once per objective setting in :data:`SETTINGS` (the "fastest"
objective at two floors, the "cost" objective at four). Prints one line per run and the mean
over seeds per family, and writes OUTPUT/frontier.json and OUTPUT/frontier.svg (one panel per
family; a curve per objective, a point per peer). docs/results.md reads the default objective
off this frontier by the rule its section states.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import cast

from dlrover_kfp.core.planner.settings import Objective, PlannerSettings
from dlrover_kfp.files import write_atomic
from dlrover_kfp.report.plots import frontier_svg
from dlrover_kfp.sim.cluster.engine import ClusterSettings, FaultSettings
from dlrover_kfp.sim.cluster.runner import run_policy
from dlrover_kfp.sim.cluster.trace import FAMILIES, cluster_size_for, synthetic_trace

#: (objective, throughput floor) of the dlrover-kfp runs.
SETTINGS = (
    ("fastest", 0.97),
    ("fastest", 0.85),
    ("cost", 0.9),
    ("cost", 0.8),
    ("cost", 0.7),
    ("cost", 0.6),
)
PEERS = ("manual", "optimus", "dlrover-oss")


def _one(task: tuple[str, int, int, bool, str, str | None, float | None]) -> dict[str, object]:
    family, seed, jobs_n, stragglers, policy, objective, floor = task
    jobs = synthetic_trace(jobs_n, seed, family=family)
    nodes, cpu, memory = cluster_size_for(jobs)
    cluster = ClusterSettings(nodes=nodes, node_cpu=cpu, node_memory_mb=memory)
    planner = None
    if objective is not None:
        planner = PlannerSettings().with_objective(cast(Objective, objective), floor)
    summary, _, _ = run_policy(
        policy, jobs, cluster, FaultSettings(stragglers=stragglers), seed, planner
    )
    label = policy if objective is None else f"{policy} {objective} {floor:g}"
    return {
        "family": family,
        "seed": seed,
        "label": label,
        "policy": policy,
        "objective": objective,
        "floor": floor,
        "median_jct_min": (summary.median_jct or 0.0) / 60,
        "cpu_utilization": summary.cpu_utilization,
        "memory_utilization": summary.memory_utilization,
        "completion_rate": summary.completion_rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--stragglers", choices=("pai", "off"), default="pai")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--output", default="docs/results")
    args = parser.parse_args()
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    tasks: list[tuple[str, int, int, bool, str, str | None, float | None]] = []
    for family in families:
        for seed in range(args.seeds):
            pai = args.stragglers == "pai"
            tasks += [(family, seed, args.jobs, pai, p, None, None) for p in PEERS]
            tasks += [(family, seed, args.jobs, pai, "dlrover-kfp", o, f) for o, f in SETTINGS]
    began = time.perf_counter()
    rows: list[dict[str, object]] = []
    with ProcessPoolExecutor(args.processes) as pool:
        for row in pool.map(_one, tasks):
            rows.append(row)
            print(
                f"{row['family']:<14} seed {row['seed']} {row['label']:<24} "
                f"median JCT {row['median_jct_min']:6.1f} min  "
                f"CPU {100 * float(row['cpu_utilization']):5.1f}%  "  # type: ignore[arg-type]
                f"completion {100 * float(row['completion_rate']):5.1f}%",  # type: ignore[arg-type]
                flush=True,
            )
    means: dict[str, dict[str, dict[str, float]]] = {}
    for family in families:
        labels = dict.fromkeys(str(r["label"]) for r in rows if r["family"] == family)
        for label in labels:
            mine = [r for r in rows if r["family"] == family and r["label"] == label]
            means.setdefault(family, {})[label] = {
                key: statistics.fmean(float(r[key]) for r in mine)  # type: ignore[arg-type]
                for key in (
                    "median_jct_min",
                    "cpu_utilization",
                    "memory_utilization",
                    "completion_rate",
                )
            }
    print(f"\nmean over {args.seeds} seeds, {args.jobs} jobs, stragglers {args.stragglers}:")
    for family, labels in means.items():
        manual = labels["manual"]
        for label, m in labels.items():
            jct = 100 * (m["median_jct_min"] / manual["median_jct_min"] - 1)
            cpu = 100 * (m["cpu_utilization"] - manual["cpu_utilization"])
            print(
                f"{family:<14} {label:<24} median JCT {m['median_jct_min']:6.1f} min "
                f"({jct:+5.1f}%)  CPU {100 * m['cpu_utilization']:5.1f}% ({cpu:+5.1f} pts)"
            )
    elapsed = time.perf_counter() - began
    print(f"{len(tasks)} runs in {elapsed:.0f}s")
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"frontier-{args.stragglers}"
    document = {
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs",
        "command": "python benchmarks/objective_frontier.py "
        f"--jobs {args.jobs} --seeds {args.seeds} --stragglers {args.stragglers}",
        "settings": [list(s) for s in SETTINGS],
        "runs": rows,
        "means": means,
    }
    write_atomic(out / f"{stem}.json", json.dumps(document, indent=2) + "\n")
    write_atomic(
        out / f"{stem}.svg",
        frontier_svg(
            means,
            title=f"Median JCT against CPU utilisation ({args.jobs} jobs x {args.seeds} "
            f"seeds, stragglers {args.stragglers})",
        ),
    )
    print(f"wrote {out / (stem + '.json')} and {out / (stem + '.svg')}")


if __name__ == "__main__":
    main()
