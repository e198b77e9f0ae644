"""Fit the simulator's ``trainer`` truth family to the trainer's measured resource curves.

    python benchmarks/fit_trainer_truth.py

Reads the runs named in dlrover_kfp/sim/cluster/trainer_fit.py (RUNS: the small model's grid
and its pods above one core; THREAD_RUNS: three models with one and two torch threads, written
by resource_curves.py), prints the fit and writes it to ``dlrover_kfp/sim/data/trainer_fit.json``,
which the synthetic trace reads.
"""

from __future__ import annotations

from pathlib import Path

from dlrover_kfp.files import write_atomic
from dlrover_kfp.sim.cluster.trainer_fit import (
    FIT_FILE,
    RUNS,
    THREAD_RUNS,
    Run,
    fit_files,
    measured_truth,
    read_runs,
    read_thread_scaling,
)

ROOT = Path(__file__).resolve().parent.parent


def _runs(name: str) -> list[Run]:
    return read_runs((ROOT / name).read_text(encoding="utf-8"), name)


def main() -> int:
    print("one torch thread against two (the step in one process, no quota):")
    text = (ROOT / THREAD_RUNS).read_text(encoding="utf-8")
    for t in read_thread_scaling(text, THREAD_RUNS):
        print(
            f"  {t.model:6s} {t.compute * 1e6:6.1f} µs/sample (core-seconds, one thread), "
            f"speed-up {t.speedup:.3f}, serial fraction {t.serial:.3f} ({t.rounds} rounds)"
        )
    fit = fit_files(ROOT)
    print("runs above one worker core, measured and fitted:")
    truth = measured_truth(fit)
    for name in RUNS:
        for r in _runs(name):
            if r.worker_cpu <= 1.0:
                continue
            x, wu, pu = truth.evaluate(r.workers, r.ps, r.worker_cpu, r.ps_cpu, r.batch)
            print(
                f"  {r.workers}w{r.ps}p@{r.worker_cpu:g}/{r.ps_cpu:g}: {r.throughput:8,.0f}/s "
                f"(fit {x:8,.0f}), worker cores {r.worker_used:.2f} (fit {wu:.2f}), "
                f"PS cores {r.ps_used:.2f} (fit {pu:.2f})"
            )
    print(fit.to_json(), end="")
    write_atomic(ROOT / "dlrover_kfp" / "sim" / "data" / FIT_FILE, fit.to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
