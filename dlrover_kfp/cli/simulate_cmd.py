"""``dlrover-kfp simulate``: compare resource policies on a simulated cluster over a trace."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from dlrover_kfp.cli.common import HELP_FORMAT, positive_float
from dlrover_kfp.cli.progress import TerminalProgress
from dlrover_kfp.core.planner.settings import AutoScaleSettings, PlannerSettings
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.files import write_atomic
from dlrover_kfp.sim.cluster.engine import (
    CLUSTER_POD_START_S,
    LIVE_PS_MOVE_PAUSE_S,
    ClusterSettings,
    FaultSettings,
)
from dlrover_kfp.sim.cluster.results import aggregate, format_table
from dlrover_kfp.sim.cluster.runner import Comparison, compare, parse_policies
from dlrover_kfp.sim.cluster.trace import (
    FAMILIES,
    QUOTA_REGIMES,
    TraceJob,
    cluster_size_for,
    read_trace,
    synthetic_trace,
    write_trace,
)

DEFAULT_POLICIES = "manual,optimus,dlrover-oss,dlrover-kfp"

#: The table's first line: which quota regime its figures are from.
REGIME_LINES = {
    "headroom": "quota regime: headroom (each job's quota as the trace gives it)",
    "request": "quota regime: request (every policy held to the user's own request in CPU and "
    "memory, as manual is)",
}


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "simulate",
        help="compare manual, optimus, dlrover-oss and dlrover-kfp on a simulated cluster",
        description="Replay a job trace (or a synthetic one) on a simulated cluster once per "
        "policy and seed, and compare job completion time, completion rate and CPU and memory "
        "utilisation. Writes OUTPUT/results.json, OUTPUT/trace.jsonl (the trace of the first seed, "
        "its quotas as generated or read, whatever --quota) "
        "and the plots OUTPUT/jct_cdf.svg and OUTPUT/utilisation.svg (first seed), and prints "
        "the comparison table; progress goes to stderr.",
        epilog="Examples:\n  dlrover-kfp simulate --synthetic 500 --seeds 3 --output sim-out\n"
        "  dlrover-kfp simulate --synthetic 500 --quota request --output sim-request\n"
        "  dlrover-kfp simulate --trace jobs.jsonl --policies manual,dlrover-kfp --output out",
        formatter_class=HELP_FORMAT,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", metavar="FILE", help="a JSONL trace (docs/simulator.md)")
    source.add_argument("--synthetic", type=int, metavar="N", help="generate N synthetic jobs")
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds to run (default 1)")
    parser.add_argument(
        "--family",
        choices=FAMILIES,
        default="ps-contention",
        help="truth family of a synthetic trace (default ps-contention; docs/simulator.md)",
    )
    parser.add_argument(
        "--stragglers",
        choices=("pai", "off"),
        default="pai",
        help="workers' paces: as measured in the Alibaba PAI data (default), or all equal",
    )
    parser.add_argument(
        "--cluster-scale",
        type=positive_float,
        default=1.0,
        metavar="X",
        help="nodes = X times the size the trace is sized for (default 1; at least one node)",
    )
    parser.add_argument(
        "--quota",
        choices=QUOTA_REGIMES,
        default="headroom",
        help="each job's quota: as the trace gives it (headroom, default; synthetic traces "
        "1.5-3x the request), or the user's own request in CPU and memory, the resources manual "
        "runs with (request); docs/simulator.md",
    )
    parser.add_argument(
        "--relaunch-s",
        type=positive_float,
        default=FaultSettings().relaunch_s,
        metavar="S",
        help="seconds a pod relaunch (or a profiled configuration's pod start) pauses a job "
        f"(default {FaultSettings().relaunch_s:g}, DLRover-RM's ~3 minutes; docs/simulator.md)",
    )
    parser.add_argument(
        "--ps-resize-s",
        type=positive_float,
        default=FaultSettings().ps_resize_s,
        metavar="S",
        help="seconds an elastic resize that changes the PS (count, CPU or memory) pauses a job "
        f"(default {FaultSettings().ps_resize_s:g}: a stated cluster pod start of "
        f"{CLUSTER_POD_START_S:g} s plus the live PS move's measured pause, "
        f"{LIVE_PS_MOVE_PAUSE_S:g} s; docs/simulator.md). A resize of the workers alone "
        f"costs {FaultSettings().elastic_resize_s:g} s",
    )
    parser.add_argument(
        "--objective",
        choices=("cost", "fastest"),
        default=None,
        help="dlrover-kfp's planning objective (default: the planner's, "
        f"{AutoScaleSettings().objective}; docs/planner.md)",
    )
    parser.add_argument(
        "--throughput-floor",
        type=positive_float,
        default=None,
        metavar="F",
        help="the objective's floor, a share of the best throughput in (0, 1] (default: the "
        f"planner's, {AutoScaleSettings().throughput_floor:g})",
    )
    parser.add_argument(
        "--policies",
        default=DEFAULT_POLICIES,
        help=f"comma separated (default {DEFAULT_POLICIES}); also the references oracle-<a> "
        "(a in (0, 1]: oracle-0.9, oracle-0.7), which are handed each job's truth "
        "(docs/simulator.md, 'The oracle')",
    )
    parser.add_argument("--output", required=True, metavar="DIR", help="where results go")
    parser.set_defaults(func=_run)


def _cluster(jobs: list[TraceJob], scale: float) -> ClusterSettings:
    nodes, cpu, memory = cluster_size_for(jobs)
    nodes = max(1, round(nodes * scale))
    return ClusterSettings(nodes=nodes, node_cpu=cpu, node_memory_mb=memory)


def _planner(args: argparse.Namespace) -> PlannerSettings | None:
    """dlrover-kfp's settings with the objective flags applied; None: the defaults."""
    if args.objective is None and args.throughput_floor is None:
        return None
    if args.throughput_floor is not None and args.throughput_floor > 1:
        raise UserInputError(
            f"--throughput-floor: must be in (0, 1], got {args.throughput_floor:g}"
        )
    return PlannerSettings().with_objective(args.objective, args.throughput_floor)


def _simulate(
    args: argparse.Namespace,
    policies: list[str],
    faults: FaultSettings,
    progress: TerminalProgress,
) -> list[Comparison]:
    """Every seed, every policy: one comparison per seed."""
    # matplotlib takes ~0.6 s to import: only this command pays for it, not every command
    from dlrover_kfp.sim.cluster.plots import write_plots  # noqa: PLC0415

    out = Path(args.output)
    runs: list[Comparison] = []
    began = time.monotonic()
    total = args.seeds * len(policies)
    finished = 0

    def done(line: str) -> None:
        nonlocal finished
        finished += 1
        progress(f"  {line} ({time.monotonic() - began:.0f}s)")
        progress.advance(finished, total)

    progress.advance(0, total)
    for seed in range(args.seed, args.seed + args.seeds):
        if args.trace:
            jobs = read_trace(args.trace)
            if not jobs:
                raise UserInputError(f"{args.trace}: the trace holds no jobs")
        else:
            jobs = synthetic_trace(args.synthetic, seed, family=args.family)
        cluster = _cluster(jobs, args.cluster_scale)
        progress(
            f"seed {seed}: {len(jobs)} jobs on {cluster.nodes} nodes x "
            f"{cluster.node_cpu:g} cpu / {cluster.node_memory_mb // 1024} GiB; "
            f"policies {', '.join(policies)}; quota {args.quota}"
        )
        runs.append(
            compare(
                jobs,
                policies,
                cluster,
                faults,
                seed,
                progress=done,
                planner=_planner(args),
                quota=args.quota,
            )
        )
        if seed == args.seed:
            out.mkdir(parents=True, exist_ok=True)
            write_trace(out / "trace.jsonl", jobs, description=f"seed {seed}")
            first = runs[-1]
            write_plots(out, first.jct_minutes, first.utilisation, label=f"seed {seed}")
    return runs


def _run(args: argparse.Namespace) -> int:
    policies = parse_policies(args.policies)
    if args.seeds < 1:
        raise UserInputError(f"--seeds: must be at least 1, got {args.seeds}")
    if args.synthetic is not None and args.synthetic < 1:
        raise UserInputError(f"--synthetic: must be at least 1, got {args.synthetic}")
    out = Path(args.output)
    faults = FaultSettings(
        stragglers=args.stragglers == "pai",
        relaunch_s=args.relaunch_s,
        ps_resize_s=args.ps_resize_s,
    )
    _planner(args)  # a bad floor fails before anything runs
    with TerminalProgress("policies simulated") as progress:
        runs = _simulate(args, policies, faults, progress)
    table = aggregate([r.summaries for r in runs])
    document = {
        "policies": {
            p: {m: s.to_dict() for m, s in metrics.items()} for p, metrics in table.items()
        },
        "per_seed": [
            {"seed": r.seed, "summaries": [s.to_dict() for s in r.summaries]} for r in runs
        ],
        "source": args.trace or f"synthetic {args.synthetic} jobs ({args.family})",
        "cluster_scale": args.cluster_scale,
        "quota": args.quota,
        "planner": {
            "objective": (args.objective or AutoScaleSettings().objective),
            "throughput_floor": (args.throughput_floor or AutoScaleSettings().throughput_floor),
        },
        "seeds": list(range(args.seed, args.seed + args.seeds)),
        "faults": {k: getattr(faults, k) for k in faults.__dataclass_fields__},
        "prices": _prices(faults),
    }
    write_atomic(out / "results.json", json.dumps(document, indent=2) + "\n")
    print(REGIME_LINES[args.quota])
    print(_price_line(faults))
    print(format_table(table))
    for line in _never_started_lines(runs):
        print(line, file=sys.stderr)
    print(f"wrote {out / 'results.json'}", file=sys.stderr)
    return 0


def _prices(faults: FaultSettings) -> dict[str, Any]:
    """What each pause cost the jobs, and where the PS-changing resize's price came from."""
    default = FaultSettings().ps_resize_s
    return {
        "ps_resize_s": faults.ps_resize_s,
        "ps_resize_s_from": (
            f"default: {CLUSTER_POD_START_S:g} s cluster pod start (stated) + "
            f"{LIVE_PS_MOVE_PAUSE_S:g} s live PS move pause (measured, benchmarks/ps_move_pause.py)"
            if faults.ps_resize_s == default
            else "--ps-resize-s"
        ),
        "elastic_resize_s": faults.elastic_resize_s,
        "relaunch_s": faults.relaunch_s,
        "restart_resize_s": faults.restart_resize_s,
        "restart_s": faults.restart_s,
    }


def _price_line(faults: FaultSettings) -> str:
    return (
        f"prices: elastic resize changing the PS {faults.ps_resize_s:g} s, of the workers alone "
        f"{faults.elastic_resize_s:g} s; pod relaunch {faults.relaunch_s:g} s; "
        f"checkpoint-and-restart resize {faults.restart_resize_s:g} s"
    )


def _never_started_lines(runs: list[Comparison]) -> list[str]:
    """A line per seed and policy with jobs that never started: their pods fit no empty node of
    the cluster (the simulation runs every other job to its end; they count as not completed)."""
    return [
        f"seed {run.seed}: {s.policy}: {s.never_started} of {s.jobs} jobs never started "
        "(their pods do not fit the empty cluster; counted as not completed)"
        for run in runs
        for s in run.summaries
        if s.never_started
    ]
