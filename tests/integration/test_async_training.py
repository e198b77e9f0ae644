"""Asynchronous (pipelined, Hogwild) training against synchronous training on the same data,
with real PS and worker processes under enforced CPU limits.

The asynchronous mode trades exactness for speed in two ways (dlrover_kfp/training/step.py and
ps_server.py): a worker's lookup runs one step ahead of its own last push, and concurrent pushes
update shared rows without locks. Neither may cost the model much: on the same data, the
asynchronous run's held-out log-loss must stay within LOSS_TOLERANCE of the synchronous run's,
and its AUC within AUC_TOLERANCE. Measured here with 2 workers (0.5 core) + 2 PS (0.25 core),
two rounds each: async loss 0.4458 and 0.4509 against sync 0.4421 and 0.4433, AUC 0.808-0.810
against 0.811-0.812. The job's requests (1.5 cores) fit the machine, so the quotas, not the
machine, are what bind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.backends import cgroups as cg
from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.runtime.job import static_run
from dlrover_kfp.runtime.options import RunOptions, RunSettings

#: The held-out log-loss of the asynchronous run may exceed the synchronous one by this much
#: (about 3% of it); the spread between two synchronous runs here is ~0.003.
LOSS_TOLERANCE = 0.015
AUC_TOLERANCE = 0.015

SPEC = """
name: async-check
model: {embedding_dim: 8, table_sizes: [1000, 50, 7, 3000, 20000, 500], dense_features: 13,
        bottom_mlp: [16, 8], top_mlp: [16, 1]}
data: {format: synthetic, rows: 60000, seed: 3}
training: {batch_size: 128, learning_rate: 0.05}
resources:
  workers: {count: 2, cpu: 0.5, memory: 2Gi}
  ps: {count: 2, cpu: 0.25, memory: 2Gi}
"""


def train(tmp_path: Path, *, synchronous: bool) -> JobProfile:
    spec = parse(JobSpec, load_text(SPEC, "test"), "test")
    out = tmp_path / ("sync" if synchronous else "async")
    with LocalBackend(out / "logs") as backend:
        settings = RunSettings(
            synchronous=synchronous,
            checkpoint_interval_s=0.0,
            shard_rows=2048,
            sample_interval_s=2.0,
        )
        options = RunOptions(output_dir=out, base_dir=tmp_path, settings=settings)
        result = static_run(spec, backend, options, progress=lambda line: None).run()
    assert result.succeeded, result.profile.outcome.reason
    return result.profile


@pytest.mark.slow
@pytest.mark.long  # 23 s: the suite's 10 minutes are spent on the elastic scenarios
def test_asynchronous_training_ends_within_tolerance_of_synchronous(tmp_path: Path) -> None:
    sync = train(tmp_path, synchronous=True)
    asyn = train(tmp_path, synchronous=False)

    assert sync.metrics.loss is not None and asyn.metrics.loss is not None
    assert sync.metrics.auc is not None and asyn.metrics.auc is not None
    assert sync.outcome.samples_processed == asyn.outcome.samples_processed == 54_000
    assert asyn.metrics.loss <= sync.metrics.loss + LOSS_TOLERANCE, (asyn.metrics, sync.metrics)
    assert asyn.metrics.auc >= sync.metrics.auc - AUC_TOLERANCE, (asyn.metrics, sync.metrics)
    # Both learned the planted signal (a model that knows nothing scores AUC 0.5).
    assert min(sync.metrics.auc, asyn.metrics.auc) > 0.75

    # Under enforced limits no pod used more than its request over a sampling window.
    if isinstance(cg.detect(), str):
        pytest.skip(f"CPU limits cannot be enforced here: {cg.detect()}")
    for profile in (sync, asyn):
        assert profile.limits is not None and profile.limits.cpu, profile.limits
        nodes = [n for s in profile.samples for n in s.nodes]
        assert nodes
        over = [(n.name, n.cpu_used) for n in nodes if n.cpu_used > 1.1 * n.cpu_requested]
        assert not over, over
        # The limit was binding: the PS, whose two clients keep them busy, used nearly all they
        # were given; without a quota they would have taken more.
        busy = [n.cpu_used / n.cpu_requested for s in profile.samples for n in s.nodes]
        assert max(busy) >= 0.9, busy
