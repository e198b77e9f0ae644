"""An elastic run on this machine from an under-provisioned guess (issue 9's first figure).

    python benchmarks/elastic_local.py [--rows 3500000] [--quota 2] [--start 1x0.25,1x0.25]
                                       [--output-dir DIR]

Starts the ctr-local model (examples/ctr-local.yaml's shape) at ``--start`` (workers x CPU,
PS x CPU; default 1 worker x 0.25 CPU + 1 PS x 0.25 CPU, an under-provisioned guess; an
over-provisioned one such as ``1x1,1x1`` shows the give-back) under a quota of ``--quota``
CPU, and lets the job master plan (Stage 2 every 10 s, the local planner settings of
``dlrover-kfp run``). Prints the plan timeline with its reasons, the samples/s timeline, the
steady samples/s before the first step and after the last one (the ratio), CPU requested and
used at the start and at the end, whether ``samples_processed`` equals rows x epochs minus
the held-out rows, and issue 30's live checks: the progress at every step, the steps after 80%
of it, the role shapes re-entered, every event. CPU limits are enforced where the machine
allows cgroups (the profile says which).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.profile import AppliedPlan, JobProfile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.planning import local_planner_settings
from dlrover_kfp.runtime.elastic import elastic_run
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.training.data import split_ranges
from dlrover_kfp.training.datasets import open_dataset

TABLES = (
    "[1000, 500, 10000, 20000, 50, 300, 100000, 7, 4000, 100, 3000, 60000, 200, 9000, 30, "
    "1500, 80000, 12, 600, 70000, 2500, 400, 5000, 40000, 900, 15000]"
)


def spec(rows: int, quota: float, start: str, max_workers: int, max_ps: int) -> JobSpec:
    (w, w_cpu), (p, p_cpu) = (part.split("x") for part in start.split(","))
    text = f"""
name: elastic-local
model: {{embedding_dim: 16, table_sizes: {TABLES}, bottom_mlp: [64, 32, 16], top_mlp: [64, 32, 1]}}
data: {{format: synthetic, rows: {rows}, seed: 1}}
training: {{batch_size: 512, epochs: 1, learning_rate: 0.05}}
resources:
  limits: {{cpu: {quota}, memory: 12Gi}}
  workers: {{count: {w}, cpu: {w_cpu}, memory: 2Gi}}
  ps: {{count: {p}, cpu: {p_cpu}, memory: 2Gi}}
elastic: {{max_workers: {max_workers}, max_ps: {max_ps}}}
"""
    return parse(JobSpec, load_text(text, "benchmark"), "benchmark")


def user_plan(job: JobSpec, reason: str) -> ResourcePlan:
    """The pods the spec asks for, as the plan a run starts from."""
    return ResourcePlan(
        workers=job.resources.workers.to_group(),  # type: ignore[union-attr]
        ps=job.resources.ps.to_group(),  # type: ignore[union-attr]
        stage=Stage.MANUAL,
        reason=reason,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=3_500_000)
    parser.add_argument("--quota", type=float, default=2.0)
    parser.add_argument("--start", default="1x0.25,1x0.25", help="WxCPU,PxCPU to start from")
    parser.add_argument("--max-workers", type=int, default=32, help="the job's elastic bound")
    parser.add_argument("--max-ps", type=int, default=15, help="the job's elastic bound")
    parser.add_argument("--output-dir", help="keep the run here (default: a temporary folder)")
    parser.add_argument(
        "--objective", choices=("fastest", "cost"), help="the planner's objective (settings.py)"
    )
    parser.add_argument("--floor", type=float, help="the planner's throughput floor")
    args = parser.parse_args()
    planner = local_planner_settings()
    auto = planner.auto_scale
    planner = dataclasses.replace(
        planner,
        auto_scale=dataclasses.replace(
            auto,
            objective=args.objective or auto.objective,
            throughput_floor=args.floor or auto.throughput_floor,
        ),
    )
    job = spec(args.rows, args.quota, args.start, args.max_workers, args.max_ps)
    settings = RunSettings(sample_interval_s=2.0, checkpoint_interval_s=0.0)
    plan = user_plan(job, f"the user's guess ({args.start})")
    print(f"machine: {platform.platform()}, {platform.processor() or platform.machine()}")
    out = Path(args.output_dir) if args.output_dir else Path(tempfile.mkdtemp()) / "run"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.monotonic()
    with LocalBackend(out / "logs") as backend:
        options = RunOptions(
            output_dir=out, base_dir=Path.cwd(), settings=settings, planner=planner
        )
        run = elastic_run(
            job,
            backend,
            options,
            plan=plan,
            progress=lambda line: print(f"{time.monotonic() - t0:6.1f}s {line}", flush=True),
        )
        result = run.run()
    p = result.profile
    dataset = open_dataset(job.data, job.model)
    train, _ = split_ranges(dataset.source_rows, settings.shard_rows, settings.eval_fraction)
    expected = sum(r.end - r.start for r in train) * job.training.epochs
    print(f"\nlimits: {p.limits.detail if p.limits else '-'}")
    print(f"outcome: {p.outcome.status} {p.outcome.reason} JCT {p.outcome.jct_seconds:.1f}s")
    print(
        f"samples_processed {p.outcome.samples_processed:,} (rows x epochs - held out: "
        f"{expected:,}) {'EXACT' if p.outcome.samples_processed == expected else 'MISMATCH'}"
    )
    print("plans:")
    for a in p.plans:
        print(
            f"  {a.time:6.1f}s {a.stage.value:<11} {a.workers.count}w x {a.workers.cpu:g} + "
            f"{a.ps.count}ps x {a.ps.cpu:g}: {a.reason}"
        )
    print("samples/s:", " ".join(f"{s.time:.0f}s:{s.throughput:.0f}" for s in p.samples))
    steps = [a for a in p.plans if a.stage is Stage.AUTO_SCALE]
    if steps:
        before = [s.throughput for s in p.samples if s.time < steps[0].time and s.throughput]
        after = [s.throughput for s in p.samples if s.time > steps[-1].time + 4][:-1]
        if before[1:] and after:
            start, end = statistics.median(before[1:]), statistics.median(after)
            print(
                f"steady samples/s: {start:,.0f} at the start, {end:,.0f} at the end: "
                f"x{end / start:.2f}"
            )
    # CPU: requested vs used per sample, over the samples with training in them.
    busy = [s for s in p.samples if s.throughput > 0 and s.nodes]
    if busy:
        first, last = busy[: max(1, len(busy) // 5)], busy[-max(1, len(busy) // 5) :]
        fifths: list[tuple[float, float, float]] = []
        for label, part in (("first fifth", first), ("last fifth", last)):
            req = statistics.fmean(sum(n.cpu_requested for n in s.nodes) for s in part)
            used = statistics.fmean(sum(n.cpu_used for n in s.nodes) for s in part)
            x = statistics.fmean(s.throughput for s in part)
            print(
                f"{label}: CPU requested {req:.2f}, used {used:.2f}, idle {req - used:.2f}; "
                f"{x:,.0f} samples/s"
            )
            fifths.append((req, used, x))
        # What was given back: the CPU of the final plan against the first; what was idle: the
        # first plan's CPU less what its pods used (the first fifth, when all of them ran).
        (_, used0, x0), (_, _, x1) = fifths
        cpu0 = p.plans[0].workers.total_cpu + p.plans[0].ps.total_cpu
        cpu1 = p.plans[-1].workers.total_cpu + p.plans[-1].ps.total_cpu
        if cpu0 > used0:
            print(
                f"idle CPU given back: {(cpu0 - cpu1) / (cpu0 - used0):.0%} (plan {cpu0:g} -> "
                f"{cpu1:g} cores, {cpu0 - used0:.2f} idle at the start); "
                f"throughput kept: {x1 / x0:.0%}"
            )
    print(f"held-out AUC {p.metrics.auc}")
    print(f"samples applied twice (by cause): {p.metrics.applied_twice}")
    late_and_reentered(p)


def late_and_reentered(p: JobProfile) -> None:
    """Issue 30's live checks: the job's progress at every plan applied after the first (its
    global step then over its last: steps are batches of one size), the resizes after 80% of
    it, and every role shape (count x CPU per pod) re-entered after the job had left it.

    A plan that changes no pod (Stage 3 moving a straggler's shards to faster workers) is not a
    resize and is counted apart; a shape re-entered by a rollback (the move measured worse than
    the shape it left: the hold rule lets such a measurement undo it) is named as one."""
    final = max((s.global_step for s in p.samples), default=0) or 1

    def progress(a: AppliedPlan) -> float:
        return max((s.global_step for s in p.samples if s.time <= a.time), default=0) / final

    def pods(a: AppliedPlan) -> tuple[NodeGroup, NodeGroup]:
        return (a.workers, a.ps)

    print("steps (progress when applied):")
    for a in p.plans[1:]:
        print(f"  {a.time:6.1f}s {100 * progress(a):5.1f}% {a.stage.value}: {a.reason}")
    late = [
        (a, pods(a) != pods(before))
        for before, a in itertools.pairwise(p.plans)
        if progress(a) > 0.8
    ]
    print(
        f"resizes after 80% progress: {sum(changed for _, changed in late)}; "
        f"plans after 80% that changed no pod: {sum(not changed for _, changed in late)}"
    )
    for role in ("workers", "ps"):
        shapes = [((getattr(a, role).count, getattr(a, role).cpu), a) for a in p.plans]
        runs = [x for i, x in enumerate(shapes) if i == 0 or shapes[i - 1][0] != x[0]]
        again = [
            f"{shape}{' (rollback)' if a.reason.startswith('rollback') else ''}"
            for i, (shape, a) in enumerate(runs)
            if shape in [r[0] for r in runs[:i]]
        ]
        print(
            f"{role} shapes in order: {[r[0] for r in runs]}; "
            f"re-entered: {', '.join(again) or 'none'}"
        )
    for e in p.events:
        print(f"  event {e.time:6.1f}s {e.kind}{' ' + e.node if e.node else ''}: {e.detail}")


if __name__ == "__main__":
    main()
