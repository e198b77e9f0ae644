"""Static runs end to end: real PS and worker processes on the local backend.

These start real processes (a few seconds each): the job's arithmetic checked against the stock
in-process PyTorch trainer, real Criteo rows, checkpoints re-partitioned onto other PS counts,
and a pod killed for memory failing the run with a profile that says so.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch

from dlrover_kfp.backends import LocalBackend, PodPhase, PodSpec
from dlrover_kfp.core.documents import json_schema, load_text, parse, to_dict
from dlrover_kfp.core.partition import Partition
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.runtime.job import JobRun, RunResult, static_run
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.training.checkpoint import list_checkpoints, load_checkpoint
from dlrover_kfp.training.data import RowRange, split_ranges
from dlrover_kfp.training.datasets import open_dataset
from dlrover_kfp.training.reference import ReferenceTrainer

DATA = Path(__file__).resolve().parent.parent / "data"
SMALL_MODEL = (
    "{embedding_dim: 8, table_sizes: [1000, 50, 7, 3000], dense_features: 13, "
    "bottom_mlp: [16, 8], top_mlp: [16, 1]}"
)


def spec_of(text: str) -> JobSpec:
    return parse(JobSpec, load_text(text, "test"), "test")


def run_static(
    spec: JobSpec,
    tmp_path: Path,
    base_dir: Path | None = None,
    before: Callable[[JobRun[Any], LocalBackend], None] | None = None,
    **settings: object,
) -> RunResult:
    """``spec`` run on the local backend; ``before`` sees the run and its backend first."""
    options: dict[str, object] = {"checkpoint_interval_s": 0.0, "sample_interval_s": 0.2}
    options.update(settings)
    out = tmp_path / "out"
    with LocalBackend(out / "logs") as backend:
        run = static_run(
            spec,
            backend,
            RunOptions(
                output_dir=out,
                base_dir=base_dir or tmp_path,
                settings=RunSettings(**options),  # type: ignore[arg-type]
            ),
            progress=lambda line: None,
        )
        if before is not None:
            before(run, backend)
        result = run.run()
        if result.succeeded:  # every pod, PS included, ended on its own
            assert {s.reason for s in backend.statuses()} == {"Completed"}, backend.statuses()
        return result


def test_the_workers_start_beside_the_ps_not_after_them(tmp_path: Path) -> None:
    """The workers are launched once the PS pods run, before the PS serve: their start-up
    (the interpreter, torch: seconds) overlaps the PS's, and they wait for the PS set in their
    first request to the master."""
    spec = spec_of(
        f"""
name: overlap
model: {SMALL_MODEL}
data: {{format: synthetic, rows: 2400, seed: 5}}
training: {{batch_size: 256}}
resources:
  workers: {{count: 2, cpu: 0.5, memory: 1Gi}}
  ps: {{count: 2, cpu: 0.5, memory: 1Gi}}
"""
    )
    at_launch: dict[str, tuple[int, bool]] = {}  # pod -> (PS pods running, PS serving)

    def record_launches(run: JobRun[Any], backend: LocalBackend) -> None:
        launch = backend.launch

        def recording_launch(pod: PodSpec) -> None:
            ps = [s for s in backend.statuses() if s.role == "ps"]
            running = sum(1 for s in ps if s.phase is PodPhase.RUNNING)
            at_launch[pod.name] = (running, run.state.all_ps_registered)
            launch(pod)

        backend.launch = recording_launch  # type: ignore[method-assign]

    result = run_static(spec, tmp_path, before=record_launches)
    assert result.succeeded, result.profile.outcome.reason
    assert result.profile.outcome.samples_processed == 2160
    assert at_launch["overlap-ps-0"][0] == 0 and at_launch["overlap-ps-1"][0] == 1
    for worker in ("overlap-worker-0", "overlap-worker-1"):
        assert at_launch[worker] == (2, False), at_launch


def test_one_worker_one_ps_matches_the_in_process_reference(tmp_path: Path) -> None:
    """Synchronous 1 worker + 1 PS in processes == stock PyTorch in one process, to 1e-5."""
    spec = spec_of(
        f"""
name: sync-check
model: {SMALL_MODEL}
data: {{format: synthetic, rows: 2400, seed: 5}}
training: {{batch_size: 256, learning_rate: 0.05}}
resources:
  workers: {{count: 1, cpu: 1, memory: 2Gi}}
  ps: {{count: 1, cpu: 1, memory: 2Gi}}
"""
    )
    result = run_static(spec, tmp_path, synchronous=True, shard_rows=512, eval_fraction=0.1)
    assert result.succeeded, result.profile.outcome.reason
    assert result.model_dir is not None
    trained = torch.load(result.model_dir / "model.pt")

    # The same shards in the same order (one worker leases them in order), cut the same way.
    dataset = open_dataset(spec.data, spec.model)
    shards, _ = split_ranges(dataset.source_rows, 512, 0.1)
    reference = ReferenceTrainer(spec.model, spec.training.learning_rate, seed=0)
    losses = []
    for shard in shards:
        batch = dataset.read(shard)
        for start in range(0, len(batch), 256):
            losses.append(reference.train_step(batch.slice(start, min(start + 256, len(batch)))))
    assert len(losses) == 9  # 2160 training rows: 4 shards of 512 (2 steps) + 112 rows (1)
    assert result.profile.samples[-1].global_step == len(losses)
    expected = reference.model.state_dict()
    assert set(trained) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(trained[name], value, atol=1e-5, rtol=1e-5, msg=name)
    # And training moved the model: the reference after 9 steps is far from its start.
    fresh = ReferenceTrainer(spec.model, 0.05, seed=0).model.state_dict()
    assert (trained["dense.top.0.weight"] - fresh["dense.top.0.weight"]).abs().max() > 1e-3


def test_real_criteo_rows_of_every_layout_train_and_bad_rows_are_counted(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for name in ("criteo_sample.csv", "criteo_kaggle_train.csv"):
        shutil.copy(DATA / name, data / name)
    # The released layout: tab separated, no header; with two malformed rows in it.
    rows = (DATA / "criteo_kaggle_test.csv").read_text().splitlines()
    tsv = [r.replace(",", "\t") for r in rows]
    tsv.insert(5, "1\tnot-a-number" + "\t" * 38)
    tsv.insert(9, "0\t1\t2")
    (data / "criteo_day.tsv").write_text("\n".join(tsv) + "\n")
    tables = ", ".join(["1000"] * 26)
    spec = spec_of(
        f"""
name: criteo-real
model: {{embedding_dim: 8, table_sizes: [{tables}], bottom_mlp: [16, 8], top_mlp: [16, 1]}}
data: {{format: criteo, path: "data/*"}}
training: {{batch_size: 64, epochs: 2}}
resources:
  workers: {{count: 2, cpu: 1, memory: 2Gi}}
  ps: {{count: 2, cpu: 1, memory: 2Gi}}
"""
    )
    result = run_static(spec, tmp_path, shard_rows=64)
    profile = result.profile
    assert result.succeeded, profile.outcome.reason
    assert profile.metrics.bad_rows == 2 * 2  # two bad rows, read once per epoch
    # Nothing stopped a worker: PS 0 applied every batch of every shard of both epochs once
    # (its tally counts a shard's rows as read, bad rows skipped; core/applied.py).
    assert profile.metrics.applied_twice == {}
    assert profile.metrics.eval_rows and profile.metrics.eval_rows >= 3
    assert profile.metrics.loss is not None and 0.0 < profile.metrics.loss < 1.5
    source_rows = open_dataset(spec.data, spec.model, tmp_path).source_rows
    assert len(source_rows) == 3
    assert profile.job.data.rows == sum(source_rows)
    train, _ = split_ranges(source_rows, 64, 0.1)
    # Every good training row, twice (two epochs); the two bad rows are in the training part.
    assert profile.outcome.samples_processed == 2 * (sum(r.rows for r in train) - 2)


def test_checkpoint_of_two_ps_restores_onto_three_and_one(tmp_path: Path) -> None:
    spec = spec_of(
        f"""
name: repartition
model: {SMALL_MODEL}
data: {{format: synthetic, rows: 3000, seed: 2}}
training: {{batch_size: 128}}
resources:
  workers: {{count: 1, cpu: 1, memory: 2Gi}}
  ps: {{count: 2, cpu: 1, memory: 2Gi}}
"""
    )
    result = run_static(spec, tmp_path, shard_rows=512)
    assert result.succeeded, result.profile.outcome.reason
    root = result.output_dir / "checkpoints"
    assert list_checkpoints(root)
    rows = sum(spec.model.table_sizes)

    def assemble(num_ps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        weights = np.zeros((rows, 8), np.float32)
        accum = np.zeros((rows, 8), np.float32)
        dense = np.zeros(0, np.float32)
        part = Partition(rows, num_ps)
        for k in range(num_ps):
            restored = load_checkpoint(root, num_ps=num_ps, ps_index=k)
            assert restored is not None and restored.from_num_ps == 2
            weights[part.gids_of(k)] = restored.weights
            accum[part.gids_of(k)] = restored.accum
            if k == 0:
                assert restored.dense is not None
                dense = np.asarray(restored.dense)
        return weights, accum, dense

    w2, a2, d2 = assemble(2)
    assert np.count_nonzero(a2) > 0  # training updated rows: the accumulators are not empty
    for num_ps in (3, 1):
        w, a, d = assemble(num_ps)
        np.testing.assert_array_equal(w, w2)
        np.testing.assert_array_equal(a, a2)
        np.testing.assert_array_equal(d, d2)


def test_a_pod_killed_for_memory_fails_the_run_and_the_profile_says_so(tmp_path: Path) -> None:
    # 4M rows x 16 x 4 B x 2 (weights + Adagrad) = 512 MiB of PS state in a 320 MiB pod.
    spec = spec_of(
        """
name: oom
model: {embedding_dim: 16, table_sizes: [4000000], bottom_mlp: [16], top_mlp: [8, 1]}
data: {format: synthetic, rows: 4000}
training: {batch_size: 128}
resources:
  workers: {count: 1, cpu: 1, memory: 2Gi}
  ps: {count: 1, cpu: 1, memory: 320Mi}
"""
    )
    result = run_static(spec, tmp_path, startup_timeout_s=60.0)
    profile = result.profile
    assert profile.outcome.status == "failed"
    assert "oom-ps-0" in profile.outcome.reason
    assert "OOMKilled" in profile.outcome.reason
    written = json.loads((result.output_dir / "profile.json").read_text())
    assert written["outcome"]["status"] == "failed"


def test_profile_has_real_samples_and_validates_against_the_published_schema(
    tmp_path: Path,
) -> None:
    spec = spec_of(
        f"""
name: samples
model: {SMALL_MODEL}
data: {{format: synthetic, rows: 150000, seed: 1}}
training: {{batch_size: 256}}
resources:
  workers: {{count: 2, cpu: 0.5, memory: 2Gi}}
  ps: {{count: 1, cpu: 1.5, memory: 1Gi}}
"""
    )
    # Samples 0.6 s apart: the backend reports no usage over windows under 0.5 s (a CFS quota
    # of n periods can read (n+1)/n of itself). Workers of half a core, so that several samples
    # see each of them alive: at one core the two trained the 135,000 rows in under a second,
    # one sample saw them, and a CI run's one sample read a worker mid-exit (15 MB resident).
    result = run_static(
        spec, tmp_path, shard_rows=2048, sample_interval_s=0.6, checkpoint_interval_s=0.8
    )
    assert result.succeeded, result.profile.outcome.reason
    document = json.loads((result.output_dir / "profile.json").read_text())
    jsonschema.validate(document, json_schema(JobProfile))
    profile = result.profile
    assert profile.outcome.samples_processed == 135000
    busy = [s for s in profile.samples if s.throughput > 0]
    assert busy, "no sample saw training"
    nodes = [n for s in busy for n in s.nodes]
    assert {n.role for n in nodes} == {"worker", "ps"}
    assert {n.name for n in nodes} == {"samples-worker-0", "samples-worker-1", "samples-ps-0"}
    # A process with torch loaded reads its real resident memory: every PS (the workers start
    # once they registered) and every worker that trained. Its peak over the samples, not each
    # sample: RSS is read at an instant and throughput over a window, so the window that ends
    # as a finished worker exits pairs its training with a mid-teardown RSS (a CI run read 83 MB).
    loaded = {n.name for n in nodes if n.role == "ps" or (n.throughput or 0) > 0}
    peak = {name: max(n.memory_used_mb for n in nodes if n.name == name) for name in loaded}
    assert peak and all(mb > 100 for mb in peak.values()), peak
    # One measure per pod: the last sample, read as the pods exit, does not fill in a pod the
    # backend measured with the pod's own report (process RSS, which counts ~100 MiB of torch's
    # shared pages a cgroup's reading leaves out: 309 against 207 MiB, kept as the peak).
    *earlier, last = profile.samples
    for n in last.nodes:
        before = [m.memory_used_mb for s in earlier for m in s.nodes if m.name == n.name]
        assert not before or n.memory_used_mb <= 1.15 * max(before), (n, max(before))
    assert max(n.cpu_used for n in nodes if n.role == "worker") > 0.2
    assert all(n.cpu_requested == (1.5 if n.role == "ps" else 0.5) for n in nodes)
    assert max(n.throughput or 0 for n in nodes if n.role == "worker") > 0
    assert profile.plans[0].stage == "manual"
    assert to_dict(profile.plans[0].workers) == {"count": 2, "cpu": 0.5, "memory_mb": 2048}


@pytest.mark.parametrize("missing", ["workers", "ps"])
def test_a_static_run_needs_the_specs_own_resources(tmp_path: Path, missing: str) -> None:
    resources = {
        "workers": "  workers: {count: 1, cpu: 1, memory: 2Gi}\n",
        "ps": "  ps: {count: 1, cpu: 1, memory: 2Gi}\n",
    }
    del resources[missing]
    spec = spec_of(
        f"name: x\nmodel: {SMALL_MODEL}\ndata: {{format: synthetic, rows: 100}}\n"
        f"training: {{batch_size: 8}}\nresources:\n" + "".join(resources.values())
    )
    with LocalBackend(tmp_path / "logs") as backend, pytest.raises(ValueError) as err:
        static_run(spec, backend, RunOptions(output_dir=tmp_path / "o", base_dir=tmp_path))
    assert f"resources.{missing}" in str(err.value)
    assert backend.statuses() == []


def test_held_out_rows_are_never_trained(tmp_path: Path) -> None:
    spec = spec_of(
        f"name: x\nmodel: {SMALL_MODEL}\ndata: {{format: synthetic, rows: 1000}}\n"
        "training: {batch_size: 8}\nresources:\n"
        "  workers: {count: 1, cpu: 1, memory: 2Gi}\n  ps: {count: 1, cpu: 1, memory: 2Gi}\n"
    )
    with LocalBackend(tmp_path / "logs") as backend:
        settings = RunSettings(shard_rows=128, eval_fraction=0.2)
        run = static_run(
            spec,
            backend,
            RunOptions(output_dir=tmp_path / "o", base_dir=tmp_path, settings=settings),
        )
    trained = {(s, r) for s, a, b in run.ledger.ranges for r in range(a, b)}
    held_out = {(e.source, r) for e in run.eval_ranges for r in range(e.start, e.end)}
    assert len(held_out) == 200 and not trained & held_out
    assert len(trained) + len(held_out) == 1000
    assert run.eval_ranges == [RowRange(0, 800, 1000)]


def test_periodic_flash_checkpoints_commit_and_a_flipped_byte_falls_back(tmp_path: Path) -> None:
    spec = spec_of(
        f"""
name: periodic
model: {SMALL_MODEL}
data: {{format: synthetic, rows: 80000, seed: 3}}
training: {{batch_size: 256}}
resources:
  workers: {{count: 1, cpu: 1, memory: 2Gi}}
  ps: {{count: 2, cpu: 1, memory: 1Gi}}
"""
    )
    result = run_static(spec, tmp_path, shard_rows=2048, checkpoint_interval_s=0.3)
    assert result.succeeded, result.profile.outcome.reason
    root = result.output_dir / "checkpoints"
    steps = list_checkpoints(root)
    assert len(steps) >= 2, f"only {steps}: the run was too short for periodic checkpoints"
    newest, previous = steps[0], steps[1]
    # The final checkpoint: at the last global step, or one above when a periodic one was
    # already written as that step (a step's directory is written once).
    assert newest in (result.profile.samples[-1].global_step, steps[1] + 1)
    manifest = json.loads((root / f"step-{newest:010d}" / "manifest.json").read_text())
    assert manifest["extra"]["shards"]["epoch"] == 1  # the ledger: every shard done

    part = root / f"step-{newest:010d}" / "ps-1.bin"
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    part.write_bytes(bytes(raw))
    restored = load_checkpoint(root, num_ps=2, ps_index=0)
    assert restored is not None
    assert restored.step == previous


# 8 s: opt-in to hold the default suite under 10 minutes. That training learns is asserted by
# default in test_table_training.py (the same AUC from three readers) and test_elastic_run.py;
# this one checks the shipped example, examples/ctr-local.yaml (AUC >= 0.70 in one epoch).
@pytest.mark.long
def test_the_local_example_learns_the_planted_signal_in_one_epoch(tmp_path: Path) -> None:
    """200k synthetic rows, one epoch, 1 worker + 1 PS: held-out AUC >= 0.70 and loss falls."""
    example = Path(__file__).resolve().parents[2] / "examples" / "ctr-local.yaml"
    spec = parse(JobSpec, load_text(example.read_text(), str(example)), str(example))
    assert spec.data.rows == 200_000 and spec.training.epochs == 1
    result = run_static(spec, tmp_path, sample_interval_s=0.5)
    assert result.succeeded, result.profile.outcome.reason
    metrics = result.profile.metrics
    assert metrics.eval_rows == 20_000
    assert metrics.auc is not None and metrics.auc >= 0.70
    # Loss falls: the held-out loss beats the best constant predictor's (the base rate's).
    assert metrics.loss is not None and metrics.train_loss is not None
    base_rate = 0.25
    constant = -(base_rate * np.log(base_rate) + (1 - base_rate) * np.log(1 - base_rate))
    assert metrics.loss < constant - 0.05
    # and the training loss falls from the first samples to the last.
    curve = [s.loss for s in result.profile.samples if s.loss is not None]
    assert len(curve) >= 3
    assert curve[-1] < curve[0] - 0.02
