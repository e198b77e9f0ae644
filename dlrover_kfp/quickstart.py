"""The quickstart: scheduled retraining of a small CTR job, several rounds, trained for real.

Each round is one ``dlrover-kfp run`` of the same job on this machine
(:func:`~dlrover_kfp.runtime.launch.run_local`: the PS and workers are local processes, each
held to its CPU where the machine allows cgroups): Stage 1 plans its start from the history,
Stage 2 and Stage 3 resize it while it trains, and its profile goes to the history, so that the
next round warm-starts from what this one used. The job's own resources are a user's
under-provisioned guess (one worker and one PS of a quarter core each, under a 2-CPU quota):
with no similar job in the history, round 1 starts from that guess (a cold start) and Stage 2
has to grow it.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dlrover_kfp.core.documents import parse
from dlrover_kfp.core.plan import NodeGroup, Stage
from dlrover_kfp.core.profile import AppliedPlan, JobProfile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.core.summary import cpu_utilisation
from dlrover_kfp.runtime.job import Meter, RunResult, new_run_id
from dlrover_kfp.runtime.launch import run_local
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.training.data import split_ranges
from dlrover_kfp.training.datasets import open_dataset

#: Synthetic rows per round. On 2 cores: JCT 60-70 s from the guess (about 15 s of it starting
#: pods at a quarter core), 30-35 s warm-started; three rounds 2-3 minutes in all.
DEFAULT_ROWS = 1_000_000

#: The embedding tables of examples/ctr-local.yaml: 26 Criteo-like features, 7 to 100k rows.
TABLE_SIZES = (
    1000, 500, 10000, 20000, 50, 300, 100000, 7, 4000, 100, 3000, 60000, 200,
    9000, 30, 1500, 80000, 12, 600, 70000, 2500, 400, 5000, 40000, 900, 15000,
)  # fmt: skip

#: What a run writes in its directory; a round's directory is emptied of these before it runs
#: (a checkpoint left by an earlier quickstart would otherwise be restored as the newest).
RUN_OUTPUTS = ("profile.json", "model", "checkpoints", "logs")


def quickstart_spec(rows: int = DEFAULT_ROWS) -> JobSpec:
    """The job every round retrains: the ctr-local model on ``rows`` synthetic rows, with the
    user's under-provisioned guess (1 worker x 0.25 CPU + 1 PS x 0.25 CPU) under a 2-CPU
    quota."""
    return parse(
        JobSpec,
        {
            "name": "ctr-quickstart",
            "scenario": "ads-ctr-quickstart",
            "model": {
                "embedding_dim": 16,
                "table_sizes": list(TABLE_SIZES),
                "bottom_mlp": [64, 32, 16],
                "top_mlp": [64, 32, 1],
            },
            "data": {"format": "synthetic", "rows": rows, "seed": 1},
            "training": {"batch_size": 512, "epochs": 1, "learning_rate": 0.05},
            "resources": {
                "limits": {"cpu": 2, "memory": "12Gi"},
                "workers": {"count": 1, "cpu": 0.25, "memory": "2Gi"},
                "ps": {"count": 1, "cpu": 0.25, "memory": "2Gi"},
            },
        },
        "quickstart",
    )


def expected_samples(spec: JobSpec, settings: RunSettings) -> int:
    """Rows x epochs less the held-out rows: what a run must report, exactly."""
    dataset = open_dataset(spec.data, spec.model)
    train, _ = split_ranges(dataset.source_rows, settings.shard_rows, settings.eval_fraction)
    return sum(r.end - r.start for r in train) * spec.training.epochs


@dataclass(frozen=True, slots=True)
class RoundResult:
    round: int
    run_dir: Path
    result: RunResult
    expected_samples: int

    @property
    def profile(self) -> JobProfile:
        return self.result.profile

    @property
    def start(self) -> AppliedPlan:
        """The plan the round started with (Stage 1's)."""
        return self.profile.plans[0]

    @property
    def final(self) -> AppliedPlan:
        """The plan it ended with."""
        return self.profile.plans[-1]

    @property
    def resizes(self) -> list[AppliedPlan]:
        """The plans Stage 2 (auto-scale) and Stage 3 (post-scale) applied while it ran."""
        return [p for p in self.profile.plans if p.stage in (Stage.AUTO_SCALE, Stage.POST_SCALE)]

    @property
    def cpu_utilization(self) -> float:
        """CPU used / requested over the whole run, all pods together (0 without samples)."""
        return cpu_utilisation(self.profile) or 0.0

    @property
    def steady_throughput(self) -> float:
        """Median samples/s at the final plan, leaving out its first sample (pods starting)
        and the run's last (a partial window); all training samples when too few remain."""
        after = [
            s.throughput
            for s in self.profile.samples
            if s.time > self.final.time and s.throughput > 0
        ]
        if len(after) > 2:
            return statistics.median(after[1:-1])
        training = [s.throughput for s in self.profile.samples if s.throughput > 0]
        return statistics.median(training) if training else 0.0

    @property
    def succeeded(self) -> bool:
        return self.result.succeeded

    @property
    def exact(self) -> bool:
        return self.profile.outcome.samples_processed == self.expected_samples


def _clear_run_outputs(run_dir: Path) -> None:
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


class _Tagged:
    """Every line of a round starts with its tag; a bar (a :class:`Meter`) still advances."""

    def __init__(self, progress: Callable[[str], None], tag: str) -> None:
        self._progress, self._tag = progress, tag

    def __call__(self, line: str) -> None:
        self._progress(self._tag + line)

    def advance(self, done: int, total: int) -> None:
        if isinstance(self._progress, Meter):
            self._progress.advance(done, total)


def _tagged(progress: Callable[[str], None], tag: str) -> _Tagged:
    return _Tagged(progress, tag)


def run_quickstart(
    output_dir: Path,
    history_url: str,
    rounds: int,
    progress: Callable[[str], None],
    *,
    rows: int = DEFAULT_ROWS,
    settings: RunSettings | None = None,
    on_round: Callable[[RoundResult], None] | None = None,
) -> list[RoundResult]:
    """Run ``rounds`` rounds of :func:`quickstart_spec` (``rows`` rows), each in
    ``output_dir/round-N``, planned from and recorded in the history at ``history_url``.

    ``on_round`` is called with each round's result as soon as it ends. A failed round is
    recorded and reported like any other; the next round still runs."""
    spec = quickstart_spec(rows)
    settings = settings or RunSettings()
    expected = expected_samples(spec, settings)
    results = []
    for r in range(1, rounds + 1):
        run_dir = output_dir / f"round-{r}"
        _clear_run_outputs(run_dir)
        # unique across quickstarts started together into one history (runtime/job.py)
        base_id = new_run_id(spec.name, time.time())
        options = RunOptions(
            output_dir=run_dir,
            base_dir=output_dir,
            settings=settings,
            history_url=history_url,
            run_id=f"{base_id}-r{r}",
        )
        result = run_local(spec, options, progress=_tagged(progress, f"[round {r}/{rounds}] "))
        done = RoundResult(round=r, run_dir=run_dir, result=result, expected_samples=expected)
        if on_round is not None:
            on_round(done)
        results.append(done)
    return results


# -- reporting -------------------------------------------------------------------------------


def _shape(w: NodeGroup, p: NodeGroup) -> str:
    return f"{w.count}w x {w.cpu:g} + {p.count}ps x {p.cpu:g} = {w.total_cpu + p.total_cpu:g} CPU"


def _plan_line(label: str, plan: AppliedPlan) -> str:
    return f"  {label:<12} {_shape(plan.workers, plan.ps)}  [{plan.stage.value}] {plan.reason}"


def format_round(r: RoundResult, rounds: int) -> str:
    """One round's report: its plans with their reasons, JCT, throughput, CPU use, AUC."""
    p = r.profile
    auc = f"{p.metrics.auc:.3f}" if p.metrics.auc is not None else "-"
    samples = (
        f"{p.outcome.samples_processed:,} samples "
        f"({'exact' if r.exact else f'expected {r.expected_samples:,}'})"
    )
    status = p.outcome.status + (f" ({p.outcome.reason})" if p.outcome.reason else "")
    lines = [
        f"round {r.round}/{rounds}: {status} in {p.outcome.jct_seconds:.1f} s, {samples}",
        _plan_line("started with", r.start),
    ]
    for plan in r.resizes:
        lines.append(_plan_line(f"at {plan.time:.1f} s", plan))
    if not r.resizes:
        lines.append("  no resizes")
    lines.append(f"  {'ended with':<12} {_shape(r.final.workers, r.final.ps)}")
    lines.append(
        f"  steady {r.steady_throughput:,.0f} samples/s at the final plan; CPU used/requested "
        f"{r.cpu_utilization:.0%}; held-out AUC {auc}"
    )
    lines.append(f"  run directory: {r.run_dir} (profile.json, model/, logs/)")
    return "\n".join(lines)


def _cpu(plan: AppliedPlan) -> float:
    return plan.workers.total_cpu + plan.ps.total_cpu


def _compact(plan: AppliedPlan) -> str:
    return f"{plan.workers.count}x{plan.workers.cpu:g}+{plan.ps.count}x{plan.ps.cpu:g}"


def format_table(results: Sequence[RoundResult]) -> str:
    """The rounds side by side (shapes are workers x CPU + PS x CPU, then the total CPU)."""
    head = (
        f"{'round':>5}  {'status':<9}  {'start stage':<11}  {'starts with':<20}  "
        f"{'ends with':<20}  {'resizes':>7}  {'JCT s':>6}  {'samples/s':>9}  "
        f"{'CPU util':>8}  {'AUC':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        start = f"{_compact(r.start)} ({_cpu(r.start):g})"
        end = f"{_compact(r.final)} ({_cpu(r.final):g})"
        auc = f"{r.profile.metrics.auc:.3f}" if r.profile.metrics.auc is not None else "-"
        lines.append(
            f"{r.round:>5}  {r.profile.outcome.status:<9}  {r.start.stage.value:<11}  "
            f"{start:<20}  {end:<20}  {len(r.resizes):>7}  "
            f"{r.profile.outcome.jct_seconds:>6.1f}  {r.steady_throughput:>9,.0f}  "
            f"{r.cpu_utilization:>8.0%}  {auc:>5}"
        )
    return "\n".join(lines)


__all__ = [
    "DEFAULT_ROWS",
    "RoundResult",
    "expected_samples",
    "format_round",
    "format_table",
    "quickstart_spec",
    "run_quickstart",
]
