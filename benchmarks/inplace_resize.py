"""The quickstart's round 1 with in-place CPU resizes against replacements, JCT side by side.

    python benchmarks/inplace_resize.py [--rows 1000000] [--repeat 1] [--output-dir DIR]

Runs the quickstart's job (dlrover_kfp/quickstart.py: the ctr-local model from the user's
under-provisioned guess, 1 worker x 0.25 CPU + 1 PS x 0.25 CPU under a 2-CPU quota, a cold
start from an empty history) on the local backend twice, one run after the other, ``--repeat``
times alternating which goes first:

* **in place**: the local backend as it is; a worker whose CPU changes keeps its process, its
  group's quota is rewritten (and the planner prices such a change as nearly free);
* **replaced**: the same backend refusing every resize, so that the job master replaces the
  worker (stop, start at the new size, shards leased again) and prices CPU changes as
  replacements for the rest of the run, as it does on a cluster without in-place resize.

Prints, per run, JCT, the plans, the resize events (in place, or refused and replaced), and
whether the samples processed are exact; then the median JCT of each side and their ratio
(replaced / in place). CPU limits are enforced where the machine allows cgroups (the profile
says which); without them a resize changes only the record.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from dlrover_kfp.backends import LocalBackend, ResizeOutcome
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.history import resolve_history_url
from dlrover_kfp.quickstart import DEFAULT_ROWS, expected_samples, quickstart_spec
from dlrover_kfp.runtime.launch import run_job
from dlrover_kfp.runtime.options import RunOptions, RunSettings


class ReplacingBackend(LocalBackend):
    """The local backend on a cluster without in-place resize: every resize refused, as a
    Kubernetes API without the ``resize`` subresource answers (the pod left as it was)."""

    def resize(
        self, name: str, cpu: float, memory_mb: int, timeout_s: float = 30.0
    ) -> ResizeOutcome:
        return ResizeOutcome(in_place=False, reason="this benchmark's backend resizes nothing")


def one_run(side: str, rows: int, out: Path, settings: RunSettings, t0: float) -> JobProfile:
    """Round 1 of the quickstart on ``side``'s backend, in ``out`` (emptied first)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    job = quickstart_spec(rows)
    options = RunOptions(
        output_dir=out,
        base_dir=out,
        settings=settings,
        history_url=resolve_history_url(str(out / "history.db"), {}),  # empty: a cold start
        run_id=f"{job.name}-{side.replace(' ', '-')}",
    )
    backend_type = LocalBackend if side == "in place" else ReplacingBackend
    with backend_type(out / "logs") as backend:
        result = run_job(
            job,
            backend,
            options,
            progress=lambda line: print(f"{time.monotonic() - t0:7.1f}s [{side}] {line}"),
        )
    return result.profile


def core_seconds(p: JobProfile) -> tuple[float, float]:
    """(requested, used) core-seconds over the run's samples: what each side was given and
    used, so that a shorter JCT is not read as a win bought with more CPU unsaid. Each sample
    stands for the interval since the one before it."""
    requested = used = 0.0
    for before, sample in zip(p.samples, p.samples[1:], strict=False):
        dt = sample.time - before.time
        requested += dt * sum(n.cpu_requested for n in sample.nodes)
        used += dt * sum(n.cpu_used for n in sample.nodes)
    return requested, used


def report(side: str, p: JobProfile, expected: int) -> None:
    exact = "exact" if p.outcome.samples_processed == expected else f"expected {expected:,}"
    requested, used = core_seconds(p)
    print(
        f"\n[{side}] {p.outcome.status} JCT {p.outcome.jct_seconds:.1f}s, "
        f"{p.outcome.samples_processed:,} samples ({exact}); {requested:.0f} core-s requested, "
        f"{used:.0f} used; limits: {p.limits.detail if p.limits else '-'}"
    )
    for a in p.plans:
        print(
            f"  {a.time:6.1f}s {a.stage.value:<11} {a.workers.count}w x {a.workers.cpu:g} + "
            f"{a.ps.count}ps x {a.ps.cpu:g}: {a.reason}"
        )
    resizes = [e for e in p.events if "in-place resize" in e.detail or "in place to" in e.detail]
    for e in resizes:
        print(f"  {e.time:6.1f}s {e.detail}")
    if not resizes:
        print("  no worker CPU change")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--repeat", type=int, default=1, help="pairs of runs, order alternating")
    parser.add_argument("--output-dir", help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    if args.rows <= 0 or args.repeat <= 0:
        parser.error("--rows and --repeat must be positive")
    root = Path(args.output_dir) if args.output_dir else Path(tempfile.mkdtemp())
    settings = RunSettings()
    expected = expected_samples(quickstart_spec(args.rows), settings)
    jct: dict[str, list[float]] = {"in place": [], "replaced": []}
    t0 = time.monotonic()
    for k in range(args.repeat):
        order = ["in place", "replaced"] if k % 2 == 0 else ["replaced", "in place"]
        for side in order:
            p = one_run(side, args.rows, root / f"{k}-{side.replace(' ', '-')}", settings, t0)
            report(side, p, expected)
            jct[side].append(p.outcome.jct_seconds)
    a, b = statistics.median(jct["in place"]), statistics.median(jct["replaced"])
    print(
        f"\nJCT median of {args.repeat}: in place {a:.1f}s, replaced {b:.1f}s; "
        f"replaced / in place = {b / a:.2f}"
    )


if __name__ == "__main__":
    main()
