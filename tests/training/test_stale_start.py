"""Asynchronous workers must not kill the model in its first steps (the "stalled start").

With ``W`` asynchronous workers each dense gradient the PS apply was computed on parameters
about ``W`` updates old. From a zero Adagrad accumulator the first steps were ±lr whatever the
gradient, and several such steps on the same stale values pushed whole ReLU units below zero
for good: real two-worker runs of the ctr-local model ended at AUC 0.61-0.73 (one worker:
0.814) about one time in four, four-worker runs one time in two (docs/training.md).

Real runs are not deterministic (the staleness depends on the scheduler), so the guard replays
the same arithmetic in one process with a *fixed* staleness: batch ``i`` is computed on the
parameters looked up after the pushes of batches ``0 .. i-S-1`` and pushed at its turn,
through the product's own :class:`WorkerModel` and :class:`PsState`. With staleness 2 this
reproduces a real two-worker stall on seed 0 without the dense initial accumulator (AUC 0.767
against 0.814 at staleness 0); the figures in the test's comment were measured here.
"""

from __future__ import annotations

import collections
from pathlib import Path

import torch

from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.training.data import RowRange, SyntheticCriteo
from dlrover_kfp.training.metrics import roc_auc
from dlrover_kfp.training.ps_state import PsConfig, PsState
from dlrover_kfp.training.step import InProcessPs, WorkerModel

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ctr-local.yaml"
#: examples/ctr-local.yaml: its model, batch size and learning rate
JOB = parse(JobSpec, load_text(EXAMPLE.read_text(), str(EXAMPLE)), str(EXAMPLE))
SPEC = JOB.model
ROWS = 300_000
TRAIN = ROWS - ROWS // 10
BATCH = JOB.training.batch_size
LR = JOB.training.learning_rate
#: A run "stalls" when its AUC is this far below the synchronous run's (the benchmark's rule).
STALL_MARGIN = 0.02
#: The replay at staleness 0 (one worker, synchronous), seed 0, as measured: 0.8135.
SYNC_AUC = 0.8135


def train_with_staleness(staleness: int, seed: int) -> tuple[float, int]:
    """(held-out AUC, dead units at the bottom MLP's output) after one epoch in which every
    batch is computed on parameters ``staleness`` pushes old."""
    torch.set_num_threads(1)
    data = SyntheticCriteo(ROWS, SPEC.table_sizes, SPEC.dense_features, seed=1)
    state = PsState(PsConfig(SPEC, 1, 0, LR, seed))
    worker = WorkerModel(SPEC, InProcessPs([state]), seed=seed)
    batches = [data.read(RowRange(0, s, min(s + BATCH, TRAIN))) for s in range(0, TRAIN, BATCH)]
    # InProcessPs answers a lookup when it is sent: sending batch i+S's lookup before batch
    # i's push makes it see exactly the pushes of batches 0 .. i-1.
    pending = collections.deque(worker._begin(b, with_dense=True) for b in batches[: staleness + 1])
    for i in range(len(batches)):
        step = pending.popleft()
        rows = step.pending.wait()
        if i + staleness + 1 < len(batches):
            pending.append(worker._begin(batches[i + staleness + 1], with_dense=True))
        worker._compute(step, rows)
    held_out = data.read(RowRange(0, TRAIN, ROWS))
    auc = roc_auc(held_out.labels, worker.predict(held_out))
    assert auc is not None
    with torch.no_grad():
        z0 = worker.net.bottom(torch.from_numpy(held_out.dense[:4096]))
    return auc, int((z0.abs().amax(dim=0) == 0).sum())


def test_two_workers_staleness_does_not_stall_the_model() -> None:
    # Measured (AUC, dead units of 16): staleness 0: 0.8135, 0; staleness 2, seed 0: 0.8087, 1
    # (with a zero dense accumulator: 0.8144 and a stall at 0.7671). The synchronous replay is
    # deterministic and not rerun here (5 s of the suite's 10 minutes): the floor is its AUC
    # less the stall margin.
    stale_auc, dead = train_with_staleness(2, seed=0)
    assert stale_auc >= SYNC_AUC - STALL_MARGIN, stale_auc
    assert dead <= 8, dead
