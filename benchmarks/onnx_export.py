"""What the ONNX export adds to the end of a run, against the ``model.pt`` write beside it.

The master exports at every run's end (``runtime/export.py`` ``save_model``), so the export must
stay cheap. For each model shape this builds a ``FullDLRM`` (tables initialised, as a trained
model's are: untouched pages would read as the zero page and flatter the timing) and times,
once each, ``torch.save`` of its state dict and ``save_onnx`` (graph, check, atomic renames).

    python benchmarks/onnx_export.py [small] [large] [medium]

* ``small``: examples/jobs/small.yaml (474k rows x 16, 30 MB of tables): one ``model.onnx``,
  the tables inline;
* ``large``: 10M rows x 32 (1.28 GB) and ``medium``: 26M rows x 32 (3.3 GB): the tables go to
  ``model.onnx.data``, written straight from the arrays.

Files go to a temporary directory under ``$TMPDIR`` (removed). Prints one line per shape.
"""

from __future__ import annotations

import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training.model import FullDLRM
from dlrover_kfp.training.onnx_model import dlrm_weights, save_onnx

# fmt: off
SMALL_TABLES = [1000, 500, 10000, 20000, 50, 300, 100000, 7, 4000, 100, 3000, 60000, 200,
                9000, 30, 1500, 80000, 12, 600, 70000, 2500, 400, 5000, 40000, 900, 15000]
# fmt: on
CASES = {
    "small": ModelSpec(
        embedding_dim=16, table_sizes=SMALL_TABLES, bottom_mlp=[64, 32, 16], top_mlp=[64, 32, 1]
    ),
    "large": ModelSpec(
        embedding_dim=32, table_sizes=[384_615] * 26, bottom_mlp=[64, 32], top_mlp=[64, 32, 1]
    ),
    "medium": ModelSpec(
        embedding_dim=32, table_sizes=[1_000_000] * 26, bottom_mlp=[64, 32], top_mlp=[64, 32, 1]
    ),
}


def measure(name: str, spec: ModelSpec) -> str:
    model = FullDLRM(spec, seed=0)
    out = Path(tempfile.mkdtemp(prefix="onnx-export-"))
    try:
        started = time.perf_counter()
        torch.save(model.state_dict(), out / "model.pt")
        pt_s = time.perf_counter() - started
        started = time.perf_counter()
        save_onnx(dlrm_weights(model), out)
        onnx_s = time.perf_counter() - started
        sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    finally:
        shutil.rmtree(out)
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    rows = sum(spec.table_sizes)
    return (
        f"{name}: {rows:,} rows x {spec.embedding_dim}: ONNX export {onnx_s:.2f} s, "
        f"model.pt {pt_s:.2f} s; files {sizes}; peak RSS so far {rss_gb:.2f} GB"
    )


def main(argv: list[str]) -> None:
    for name in argv or list(CASES):
        print(measure(name, CASES[name]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
