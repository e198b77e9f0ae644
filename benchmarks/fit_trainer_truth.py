"""Fit the simulator's ``trainer`` truth family to the trainer's measured resource curves.

    python benchmarks/fit_trainer_truth.py [RUNS_CSV]

Reads ``benchmarks/data/resource_curves_small.runs.csv`` (written by resource_curves.py),
prints the fit and writes it to ``dlrover_kfp/sim/data/trainer_fit.json``, which the synthetic
trace reads (see dlrover_kfp/sim/cluster/trainer_fit.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from dlrover_kfp.files import write_atomic
from dlrover_kfp.sim.cluster.trainer_fit import FIT_FILE, fit_trainer, read_runs

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = "benchmarks/data/resource_curves_small.runs.csv"


def main() -> int:
    source = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    runs = read_runs((ROOT / source).read_text(encoding="utf-8"), source)
    fit = fit_trainer(runs, source)
    print(fit.to_json(), end="")
    write_atomic(ROOT / "dlrover_kfp" / "sim" / "data" / FIT_FILE, fit.to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
