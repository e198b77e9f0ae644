"""A hot PS: no action against live migration against stop-and-restart, side by side in one run.

    python benchmarks/hot_ps.py [--rows 1500000] [--start 2x0.5,1x0.25] [--quota 2]
                                [--hog [--hog-after 8]] [--repeats 1]

The same job runs three times back to back (the order rotates with ``--repeats``), each from
the same pods. By default the PS is hot by its own load: two workers at 0.5 CPU need more than
the PS's 0.25 (about 5 µs of PS CPU per sample, benchmarks/resource_curves.py), so its cgroup
runs at its quota, which is how the planner recognises a hot PS (Stage 3: CPU used / requested
above 80% for 3 samples). With ``--hog``, ``--hog-after`` seconds after the first trained
shard a busy loop (one process spinning in Python) is also put into the last PS's cgroup: a
noisy neighbour that takes the PS's CPU share, as a contended node does to a pod; it lives as
long as the pod it was put in.

* ``none``: Stage 3's hot-PS rule is turned off; the job runs on with the hot PS.
* ``live``: Stage 3 moves the hot PS to a new pod with twice the CPU (with more than one PS,
  all move, one after the other: a job's PS share one size) while training goes on; the
  workers pause only for the switch.
* ``restart``: the same decision applied stop-and-restart: workers stopped, checkpoint, PS
  restarted from it, workers restarted.

Stage 2 is off in all three (the comparison is about the hot PS alone). Printed per arm: JCT,
``samples_processed`` against rows x epochs minus the held-out rows, the pauses, the longest
gap between two shard reports after training began (the time samples/s stayed at zero), and
the events; then JCT ratios (live / none, live / restart) per repeat and their median.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.planning import local_planner_settings
from dlrover_kfp.runtime.elastic import ElasticPolicy, elastic_run
from dlrover_kfp.runtime.job import JobRun
from dlrover_kfp.runtime.options import Migration, RunOptions, RunSettings
from dlrover_kfp.training.data import split_ranges
from dlrover_kfp.training.datasets import open_dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from elastic_local import spec, user_plan  # the same ctr-local job


def hog_the_ps(
    run: JobRun[ElasticPolicy], backend: LocalBackend, after_s: float, log: dict
) -> None:
    """``after_s`` after the first trained shard, start a busy loop inside the last PS's pod
    (``exec_in``: in its cgroups, sharing its CPU quota); it ends with that pod."""
    name = f"{run.spec.name}-ps-{run.ps.count - 1}"
    while not (run.samples and any(s.throughput > 0 for s in run.samples)):
        time.sleep(0.1)
    time.sleep(after_s)
    if not backend.cpu_enforced:
        log["hog"] = "no cgroups: a busy loop would not share the PS's quota; nothing done"
        return
    hog = backend.exec_in(name, (sys.executable, "-c", "while True: pass"))
    log["hog"] = f"busy loop {hog.pid} in pod {name}"
    log["hog_at"] = time.monotonic() - run.start


def planner_for(arm: str) -> PlannerSettings:
    base = local_planner_settings()
    # Stage 2 off in every arm (it never has enough samples): this compares what happens to a
    # hot PS, nothing else.
    planner = dataclasses.replace(
        base, auto_scale=dataclasses.replace(base.auto_scale, min_samples=10**9)
    )
    if arm == "none":
        planner = dataclasses.replace(
            planner,
            post_scale=dataclasses.replace(planner.post_scale, hot_ps_utilization=1e9),
        )
    return planner


def run_arm(arm: str, args: argparse.Namespace, root: Path) -> dict:
    job = spec(args.rows, args.quota, args.start)
    settings = RunSettings(sample_interval_s=2.0, checkpoint_interval_s=0.0)
    plan = user_plan(job, f"the user's resources ({args.start})")
    out = root / arm
    shutil.rmtree(out, ignore_errors=True)
    log: dict = {}
    migration: Migration = "restart" if arm == "restart" else "live"
    t0 = time.monotonic()
    with LocalBackend(out / "logs") as backend:
        options = RunOptions(
            output_dir=out,
            base_dir=Path.cwd(),
            settings=settings,
            planner=planner_for(arm),
            migration=migration,
        )
        run = elastic_run(
            job,
            backend,
            options,
            plan=plan,
            progress=lambda line: print(f"  [{arm}] {time.monotonic() - t0:6.1f}s {line}"),
        )
        if args.hog:
            threading.Thread(
                target=hog_the_ps, args=(run, backend, args.hog_after, log), daemon=True
            ).start()
        result = run.run()
    p = result.profile
    dataset = open_dataset(job.data, job.model)
    train, _ = split_ranges(dataset.source_rows, settings.shard_rows, settings.eval_fraction)
    expected = sum(r.end - r.start for r in train) * job.training.epochs
    return {
        "arm": arm,
        "status": p.outcome.status,
        "jct": p.outcome.jct_seconds,
        "exact": p.outcome.samples_processed == expected,
        "samples": p.outcome.samples_processed,
        "expected": expected,
        "pauses": list(run.policy.ps_pauses),
        "longest_gap": run.state.longest_report_gap_s,
        "hog": log.get("hog", "-"),
        "hog_at": log.get("hog_at"),
        "events": [(e.time, e.kind, e.detail) for e in p.events],
        "auc": p.metrics.auc,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_500_000)
    parser.add_argument("--quota", type=float, default=2.0)
    parser.add_argument("--start", default="2x0.5,1x0.25", help="WxCPU,PxCPU")
    parser.add_argument("--hog", action="store_true", help="a busy loop in the last PS's cgroup")
    parser.add_argument("--hog-after", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--output-dir", help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    root = Path(args.output_dir) if args.output_dir else Path(tempfile.mkdtemp())
    arms = ["none", "live", "restart"]
    ratios: dict[str, list[float]] = {"live/none": [], "live/restart": [], "restart/none": []}
    for repeat in range(args.repeats):
        order = arms[repeat % 3 :] + arms[: repeat % 3]
        results = {arm: run_arm(arm, args, root / f"r{repeat}") for arm in order}
        print(f"\nrepeat {repeat} (order {', '.join(order)}):")
        for arm in arms:
            r = results[arm]
            print(
                f"  {arm:<8} {r['status']} JCT {r['jct']:6.1f}s  samples {r['samples']:,} "
                f"{'EXACT' if r['exact'] else 'MISMATCH vs ' + format(r['expected'], ',')}  "
                f"pauses {', '.join(f'{x:.2f}s' for x in r['pauses']) or '-'}  "
                f"longest gap between reports {r['longest_gap']:.2f}s  AUC {r['auc']}"
            )
            if args.hog:
                print(f"           hog: {r['hog']} at {r['hog_at'] or 0:.1f}s")
            for t, kind, detail in r["events"]:
                print(f"           {t:6.1f}s {kind}: {detail}")
        jct = {arm: results[arm]["jct"] for arm in arms}
        for key, values in ratios.items():
            a, b = key.split("/")
            values.append(jct[a] / jct[b])
    print("\nJCT ratios (median over repeats, each from one repeat's three runs):")
    for key, values in ratios.items():
        median = statistics.median(values)
        each = ", ".join(f"{v:.3f}" for v in values)
        print(f"  {key:<13} {median:.3f} ({each}): {100 * (median - 1):+.1f}%")


if __name__ == "__main__":
    main()
