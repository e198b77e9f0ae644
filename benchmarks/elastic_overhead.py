"""What the elastic job master costs a job that needs no change: elastic against static, same shape.

    python benchmarks/elastic_overhead.py [--rows 2500000] [--rounds 3]

Runs the ctr-local model at 1 worker x 1 CPU + 1 PS x 0.5 CPU (quota 2 CPU) alternately as a
static run and as an elastic run whose planner never finds a reason to change it (Stage 2 asks
for more samples than the job has; Stage 3 sees nothing unstable), ``--rounds`` times each,
and compares the steady samples/s (the median of the samples between the first quarter and the
last sample of each run). The difference is the elastic loop itself: a Stage 2 and a Stage 3
decision after every runtime sample, and the bookkeeping around them. Issue 9's bound: at most
5% slower. Ratios are taken within one run of this script (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import tempfile
import time
from pathlib import Path

import elastic_local  # the benchmark job, beside this script

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.core.plan import ResourcePlan, Stage
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.planning import local_planner_settings
from dlrover_kfp.runtime.elastic import ElasticPolicy
from dlrover_kfp.runtime.job import JobRun, static_run
from dlrover_kfp.runtime.options import RunOptions, RunSettings


def spec(rows: int) -> JobSpec:
    """elastic_local.py's job (one definition of the benchmark model) at 1w x 1 + 1ps x 0.5."""
    return elastic_local.spec(rows, quota=2.0, start="1x1,1x0.5")


def steady(profile: JobProfile) -> float:
    busy = [s.throughput for s in profile.samples if s.throughput > 0]
    return statistics.median(busy[len(busy) // 4 : -1] or busy)


class TimedElasticPolicy(ElasticPolicy):
    """The elastic policy, adding up the wall time of its decisions (Stage 2 + Stage 3)."""

    decide_s = 0.0
    decisions = 0

    def decide(self, t: float) -> None:
        start = time.perf_counter()
        super().decide(t)
        self.decide_s += time.perf_counter() - start
        self.decisions += 1


def one(job: JobSpec, elastic: bool, out: Path) -> tuple[JobProfile, float, int]:
    settings = RunSettings(sample_interval_s=2.0, checkpoint_interval_s=0.0)
    if not elastic:
        options = RunOptions(output_dir=out, base_dir=Path.cwd(), settings=settings)
        with LocalBackend(out / "logs") as backend:
            result = static_run(job, backend, options, progress=lambda line: None).run()
        assert result.succeeded, result.profile.outcome.reason
        return result.profile, 0.0, 0
    planner = local_planner_settings()
    planner = dataclasses.replace(
        planner, auto_scale=dataclasses.replace(planner.auto_scale, min_samples=10**6)
    )
    plan = ResourcePlan(
        workers=job.resources.workers.to_group(),  # type: ignore[union-attr]
        ps=job.resources.ps.to_group(),  # type: ignore[union-attr]
        stage=Stage.MANUAL,
        reason="the same shape as the static run",
    )
    with LocalBackend(out / "logs") as backend:
        options = RunOptions(output_dir=out, base_dir=Path.cwd(), settings=settings)
        run = JobRun(
            job,
            backend,
            options,
            groups=(plan.workers, plan.ps),
            policy=lambda run: TimedElasticPolicy(run, plan=plan, planner=planner),
            progress=lambda line: None,
        )
        result = run.run()
    assert result.succeeded, result.profile.outcome.reason
    changes = [p for p in result.profile.plans if p.stage is not Stage.MANUAL]
    assert not changes, f"the elastic run changed its shape: {changes}"
    return result.profile, run.policy.decide_s, run.policy.decisions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_500_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {platform.processor() or platform.machine()}")
    job = spec(args.rows)
    rates: dict[bool, list[float]] = {False: [], True: []}
    jcts: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            for elastic in (False, True):
                profile, decide_s, decisions = one(job, elastic, Path(tmp) / f"{k}-{elastic}")
                rates[elastic].append(steady(profile))
                jcts[elastic].append(profile.outcome.jct_seconds)
                spent = (
                    f", {decisions} decisions took {decide_s * 1000:.0f} ms in all"
                    if elastic
                    else ""
                )
                print(
                    f"round {k + 1} {'elastic' if elastic else 'static '}: "
                    f"{rates[elastic][-1]:,.0f} samples/s steady, JCT "
                    f"{profile.outcome.jct_seconds:.1f}s{spent}",
                    flush=True,
                )
    static, elastic_ = statistics.median(rates[False]), statistics.median(rates[True])
    ratios = [e / s for s, e in zip(rates[False], rates[True], strict=True)]
    print(
        f"median steady samples/s: static {static:,.0f}, elastic {elastic_:,.0f}; "
        f"elastic / static per round {', '.join(f'{r:.3f}' for r in ratios)} "
        f"(median {statistics.median(ratios):.3f}; bound >= 0.95)"
    )
    jct_ratios = [e / s for s, e in zip(jcts[False], jcts[True], strict=True)]
    print(
        f"JCT elastic / static per round {', '.join(f'{r:.3f}' for r in jct_ratios)} "
        f"(median {statistics.median(jct_ratios):.3f}; bound <= 1/0.95 = 1.053)"
    )


if __name__ == "__main__":
    main()
