"""Flash checkpoints: round trips, re-partitioning, source choice, corruption, retention, shm."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from dlrover_kfp.core.partition import Partition
from dlrover_kfp.training import checkpoint as ck
from dlrover_kfp.training.checkpoint import (
    CheckpointBusyError,
    CheckpointChoice,
    CheckpointError,
    CheckpointWriteError,
    FlashCheckpointer,
    PartMeta,
    PartRecord,
    ShmSnapshot,
    StateSpec,
    cleanup_shm,
    commit,
    list_checkpoints,
    list_shm,
    load_checkpoint,
    prune_checkpoints,
    select_checkpoint,
)
from dlrover_kfp.training.checkpoint import persist as ck_persist
from dlrover_kfp.training.checkpoint import restore as ck_restore
from dlrover_kfp.training.checkpoint import shm as ck_shm
from dlrover_kfp.training.checkpoint.format import CheckpointCorruptError, parse_manifest
from tests.chaos.harness import SmallDisk, mounted_small_disk

F32 = npt.NDArray[np.float32]
ROWS, DIM, DENSE = 1000, 8, 37
TABLES = (600, 300, 100)


class Job:
    """A job's whole embedding state (by global id) and its split over ``num_ps`` PS."""

    def __init__(self, job_id: str, num_ps: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.job_id = job_id
        self.num_ps = num_ps
        self.weights = rng.standard_normal((ROWS, DIM), dtype=np.float32)
        self.accum = rng.random((ROWS, DIM), dtype=np.float32)
        self.dense = rng.standard_normal(DENSE, dtype=np.float32)
        self.dense_accum = rng.random(DENSE, dtype=np.float32)
        self.partition = Partition(ROWS, num_ps)

    def meta(self, k: int) -> PartMeta:
        return PartMeta(self.job_id, self.num_ps, k, ROWS, DIM, TABLES)

    def arrays(self, k: int) -> dict[str, Any]:
        gids = self.partition.gids_of(k)
        out: dict[str, Any] = {
            "weights": torch.from_numpy(self.weights[gids]),
            "accum": self.accum[gids],
        }
        if k == 0:
            out["dense"] = torch.from_numpy(self.dense.copy())
            out["dense_accum"] = self.dense_accum.copy()
        return out


@pytest.fixture
def shm_dir(tmp_path: Path) -> Path:
    """A private snapshot directory (the tests never touch the real /dev/shm)."""
    d = tmp_path / "shm"
    d.mkdir()
    return d


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "ckpt"


class Cluster:
    """One FlashCheckpointer per PS, as the PS processes would hold them."""

    def __init__(self, job: Job, root: Path, shm_dir: Path, generation: int = 0) -> None:
        self.job = job
        self.root = root
        self.cps = [
            FlashCheckpointer(
                root,
                job.meta(k),
                StateSpec.of(job.arrays(k)),
                shm_dir=shm_dir,
                generation=generation,
            )
            for k in range(job.num_ps)
        ]

    def save(self, step: int, extra: Mapping[str, Any] | None = None) -> list[PartRecord]:
        futures = [
            cp.save(step, self.job.arrays(k), extra=extra)[1] for k, cp in enumerate(self.cps)
        ]
        return [f.result(timeout=10) for f in futures]

    def checkpoint(self, step: int, keep: int = 3) -> Path:
        return commit(self.root, step, self.save(step, {"step": step}), {"step": step}, keep=keep)

    def close(self) -> None:
        for cp in self.cps:
            cp.close()


@pytest.fixture
def cluster2(root: Path, shm_dir: Path) -> Iterator[Cluster]:
    c = Cluster(Job("job-a", 2), root, shm_dir)
    yield c
    c.close()


def reassemble(parts: list[ck.RestoredPart]) -> tuple[F32, F32]:
    """Rows by global id from the restored parts of every new PS."""
    num_ps = parts[0].num_ps
    partition = Partition(ROWS, num_ps)
    weights = np.full((ROWS, DIM), np.nan, dtype=np.float32)
    accum = np.full((ROWS, DIM), np.nan, dtype=np.float32)
    for j, part in enumerate(parts):
        gids = partition.gids_of(j)
        weights[gids] = part.weights
        accum[gids] = part.accum
    return weights, accum


def test_round_trip_same_ps_count_from_disk(cluster2: Cluster, root: Path) -> None:
    cluster2.checkpoint(10)
    job = cluster2.job
    for k in range(2):
        part = load_checkpoint(root, num_ps=2, ps_index=k)  # no job_id: disk only
        assert part is not None
        assert (part.step, part.source, part.from_num_ps, part.verified) == (10, "disk", 2, True)
        assert part.extra == {"step": 10}
        assert part.table_sizes == TABLES
        gids = job.partition.gids_of(k)
        assert np.array_equal(part.weights, job.weights[gids])
        assert np.array_equal(part.accum, job.accum[gids])
        if k == 0:
            assert part.dense is not None and part.dense_accum is not None
            assert np.array_equal(part.dense, job.dense)
            assert np.array_equal(part.dense_accum, job.dense_accum)
        else:
            assert part.dense is None and part.dense_accum is None


def test_manifest_and_files_are_self_describing(cluster2: Cluster, root: Path) -> None:
    final = cluster2.checkpoint(7)
    assert final == root / "step-0000000007"
    assert sorted(p.name for p in final.iterdir()) == ["manifest.json", "ps-0.bin", "ps-1.bin"]
    choice = select_checkpoint(root)
    assert choice is not None and choice.source == "disk" and choice.num_ps == 2
    assert CheckpointChoice.from_dict(choice.to_dict()) == choice
    rec = cluster2.save(8)[1]
    assert PartRecord.from_dict(rec.to_dict()) == rec


@pytest.mark.parametrize("new_ps", [3, 1, 2, 4])
def test_repartition_onto_other_ps_counts(cluster2: Cluster, root: Path, new_ps: int) -> None:
    cluster2.checkpoint(5)
    choice = select_checkpoint(root)
    assert choice is not None
    parts = []
    for j in range(new_ps):
        part = load_checkpoint(root, num_ps=new_ps, ps_index=j, choice=choice)
        assert part is not None
        assert part.weights.shape == (Partition(ROWS, new_ps).rows_on(j), DIM)
        assert (part.num_ps, part.from_num_ps) == (new_ps, 2)
        assert (part.dense is not None) == (j == 0)
        parts.append(part)
    weights, accum = reassemble(parts)
    assert np.array_equal(weights, cluster2.job.weights)
    assert np.array_equal(accum, cluster2.job.accum)
    assert parts[0].dense is not None
    assert np.array_equal(parts[0].dense, cluster2.job.dense)


def test_repartition_from_three_to_two_via_shm(root: Path, shm_dir: Path) -> None:
    c = Cluster(Job("job-b", 3, seed=3), root, shm_dir)
    try:
        c.save(4)  # persisted, never committed: only shm has step 4
        parts = [
            load_checkpoint(root, num_ps=2, ps_index=j, job_id="job-b", shm_dir=shm_dir)
            for j in range(2)
        ]
    finally:
        c.close()
    assert all(p is not None and p.source == "shm" and p.step == 4 for p in parts)
    weights, accum = reassemble([p for p in parts if p is not None])
    assert np.array_equal(weights, c.job.weights)
    assert np.array_equal(accum, c.job.accum)


def test_restore_into_preallocated_tensors(cluster2: Cluster, root: Path) -> None:
    cluster2.checkpoint(3)
    rows = Partition(ROWS, 3).rows_on(1)
    weights, accum = torch.zeros(rows, DIM), torch.zeros(rows, DIM)
    part = load_checkpoint(root, num_ps=3, ps_index=1, out={"weights": weights, "accum": accum})
    assert part is not None
    gids = Partition(ROWS, 3).gids_of(1)
    assert np.array_equal(weights.numpy(), cluster2.job.weights[gids])
    assert np.shares_memory(part.accum, accum.numpy())
    with pytest.raises(ValueError, match="out"):
        load_checkpoint(root, num_ps=3, ps_index=1, out={"weights": torch.zeros(rows + 1, DIM)})


def test_prefers_shm_when_as_new_as_disk(cluster2: Cluster, root: Path, shm_dir: Path) -> None:
    cluster2.checkpoint(10)
    part = load_checkpoint(root, num_ps=2, ps_index=1, job_id="job-a", shm_dir=shm_dir)
    assert part is not None and (part.source, part.step, part.verified) == ("shm", 10, True)
    assert part.extra == {"step": 10}  # the snapshot's own extra


def test_prefers_newer_shm_over_older_disk(cluster2: Cluster, root: Path, shm_dir: Path) -> None:
    cluster2.checkpoint(10)
    cluster2.save(11)  # persisted but not committed
    part = load_checkpoint(root, num_ps=2, ps_index=0, job_id="job-a", shm_dir=shm_dir)
    assert part is not None and (part.source, part.step) == ("shm", 11)


def test_uses_disk_when_shm_is_older_or_absent(root: Path, shm_dir: Path) -> None:
    job = Job("job-c", 2)
    old = Cluster(job, root, shm_dir, generation=1)
    old.save(5)  # an old incarnation's snapshots, at step 5
    old.close()
    new = Cluster(job, root, shm_dir, generation=2)
    new.checkpoint(9)
    # A PS that died before the snapshot of step 9 left nothing newer: its new buffer is empty.
    ShmSnapshot(job.meta(0), 1 << 20, shm_dir=shm_dir, generation=3).close()
    new.close()
    for cp in new.cps:  # the step-9 snapshots are gone: only generation 1 (step 5) is left
        cp.shm.path.unlink()
    part = load_checkpoint(root, num_ps=2, ps_index=0, job_id="job-c", shm_dir=shm_dir)
    assert part is not None and (part.source, part.step) == ("disk", 9)
    cleanup_shm("job-c", shm_dir)
    part = load_checkpoint(root, num_ps=2, ps_index=0, job_id="job-c", shm_dir=shm_dir)
    assert part is not None and (part.source, part.step) == ("disk", 9)


def test_incomplete_shm_set_is_not_used(cluster2: Cluster, root: Path, shm_dir: Path) -> None:
    cluster2.checkpoint(10)
    cluster2.cps[0].save(11, cluster2.job.arrays(0))[1].result(timeout=10)  # PS 1 never did 11
    part = load_checkpoint(root, num_ps=2, ps_index=0, job_id="job-a", shm_dir=shm_dir)
    assert part is not None and (part.source, part.step) == ("disk", 10)


def test_snapshot_interrupted_mid_copy_is_invalid(
    cluster2: Cluster, root: Path, shm_dir: Path
) -> None:
    cluster2.save(3)
    bad: dict[str, Any] = dict(cluster2.job.arrays(1))
    bad["weights"] = torch.zeros(3, DIM, device="meta")  # not a CPU tensor: fails before copy
    with pytest.raises(ValueError):
        cluster2.cps[1].shm.snapshot(4, bad)

    class Boom(np.ndarray):
        """Raises when the copy reads it, as a crash mid-copy would stop the copy."""

    arrays = dict(cluster2.job.arrays(1))
    w = np.asarray(arrays["weights"])
    arrays["weights"] = w.view(Boom)
    original = np.copyto

    def exploding(dst: Any, src: Any, **kw: Any) -> None:
        if isinstance(src, Boom):
            raise RuntimeError("killed mid-copy")
        original(dst, src, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(np, "copyto", exploding)
        with pytest.raises(RuntimeError):
            cluster2.cps[1].shm.snapshot(4, arrays)
    assert cluster2.cps[1].shm.step is None
    with pytest.raises(CheckpointError, match="not complete"):
        ShmSnapshot.read(cluster2.cps[1].shm.path)
    # The set of step 3 lost its PS 1 part: nothing in shm is usable, and nothing is committed.
    assert load_checkpoint(root, num_ps=2, ps_index=0, job_id="job-a", shm_dir=shm_dir) is None


def flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def test_corrupt_checkpoint_falls_back_to_previous(
    cluster2: Cluster, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cluster2.checkpoint(10)
    cluster2.checkpoint(20)
    bad = root / "step-0000000020" / "ps-1.bin"
    flip_byte(bad, bad.stat().st_size // 2)
    with caplog.at_level(logging.WARNING, logger=ck.__name__):
        part = load_checkpoint(root, num_ps=2, ps_index=0)  # PS 0 verifies PS 1's part too
    assert part is not None and part.step == 10
    assert any(str(bad) in r.getMessage() and "crc32" in r.getMessage() for r in caplog.records)
    choice = select_checkpoint(root)
    assert choice is not None and choice.step == 10
    # A PS told to restore the bad checkpoint refuses instead of restoring torn state.
    bad_choice = ck_restore._disk_choice(root / "step-0000000020")
    with pytest.raises(CheckpointError, match="crc32"):
        load_checkpoint(root, num_ps=2, ps_index=1, choice=bad_choice)


def test_every_single_bit_flip_of_a_manifest_is_refused_and_an_older_one_used(
    cluster2: Cluster, root: Path
) -> None:
    """The manifest carries the sha256 of its content: each of its bits flipped in turn (the
    ledger in ``extra``, the parts' sizes and crc32s, the geometry, the whitespace) is refused,
    and the restore takes the older checkpoint. Exhaustive over every bit of the file."""
    for step, done in ((10, [0]), (20, [0, 1])):
        ledger = {"todo": [2], "done": done, "rows_done": 100 * len(done), "lease_s": 600.0}
        newest = commit(root, step, cluster2.save(step, {"step": step}), {"shards": ledger})
    path = newest / "manifest.json"
    raw = path.read_bytes()
    parse_manifest(raw, path)  # as written: accepted
    for offset in range(len(raw)):
        for bit in range(8):
            flipped = bytearray(raw)
            flipped[offset] ^= 1 << bit
            with pytest.raises(CheckpointCorruptError):
                parse_manifest(bytes(flipped), path)
    path.write_bytes(raw[:100] + bytes([raw[100] ^ 1]) + raw[101:])
    choice = select_checkpoint(root)
    assert choice is not None and choice.step == 10


def test_corrupt_header_and_truncation_are_detected(cluster2: Cluster, root: Path) -> None:
    cluster2.checkpoint(10)
    cluster2.checkpoint(20)
    flip_byte(root / "step-0000000020" / "ps-0.bin", 20)  # in the header
    part = load_checkpoint(root, num_ps=1, ps_index=0)
    assert part is not None and part.step == 10
    with (root / "step-0000000010" / "ps-1.bin").open("r+b") as f:
        f.truncate(5000)
    with pytest.raises(CheckpointError, match="no checkpoint verifies"):
        load_checkpoint(root, num_ps=1, ps_index=0)


def test_corrupt_shm_falls_back_to_disk(cluster2: Cluster, root: Path, shm_dir: Path) -> None:
    cluster2.checkpoint(10)
    path = cluster2.cps[0].shm.path
    flip_byte(path, 4096 + 100)  # inside ps-0's weights; the persister recorded the crc32
    part = load_checkpoint(root, num_ps=2, ps_index=0, job_id="job-a", shm_dir=shm_dir)
    assert part is not None and (part.source, part.step) == ("disk", 10)
    assert np.array_equal(part.weights, cluster2.job.weights[0::2])


def test_tmp_dirs_are_never_checkpoints(cluster2: Cluster, root: Path) -> None:
    cluster2.checkpoint(10)
    cluster2.save(20)  # step-20.tmp: parts, no manifest
    records = cluster2.save(30)
    (root / "step-0000000030.tmp" / "manifest.json").write_text("{}")  # crashed before rename
    assert list_checkpoints(root) == [10]
    part = load_checkpoint(root, num_ps=2, ps_index=0)
    assert part is not None and part.step == 10
    commit(root, 30, records)  # the real commit replaces the stray manifest
    assert list_checkpoints(root) == [30, 10]
    assert not (root / "step-0000000020.tmp").exists()  # stale once 30 is committed


def test_retention_keeps_last_k(cluster2: Cluster, root: Path) -> None:
    for step in range(1, 6):
        cluster2.checkpoint(step, keep=3)
    assert list_checkpoints(root) == [5, 4, 3]
    assert sorted(p.name for p in root.iterdir()) == [
        "step-0000000003",
        "step-0000000004",
        "step-0000000005",
    ]
    cluster2.save(6)
    prune_checkpoints(root, keep=1, all_tmp=True)
    assert sorted(p.name for p in root.iterdir()) == ["step-0000000005"]


def test_commit_checks_parts(cluster2: Cluster, root: Path) -> None:
    records = cluster2.save(4)
    with pytest.raises(CheckpointError, match="cover"):
        commit(root, 4, records[:1])
    with pytest.raises(CheckpointError, match="step"):
        commit(root, 5, records)
    assert list_checkpoints(root) == []
    commit(root, 4, records)
    assert commit(root, 4, cluster2.save(4)) == root / "step-0000000004"  # duplicate: kept
    assert list_checkpoints(root) == [4]


def test_no_checkpoint_is_none(root: Path, shm_dir: Path) -> None:
    assert load_checkpoint(root, num_ps=2, ps_index=0, job_id="nothing", shm_dir=shm_dir) is None
    assert select_checkpoint(root, job_id="nothing", shm_dir=shm_dir) is None


def test_persist_runs_in_background_with_back_pressure(
    root: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot returns while the persist is held; the next snapshot waits for it."""
    job = Job("job-bg", 1)
    gate, started = threading.Event(), threading.Event()
    original = ck_persist._persist_part

    def held(root_: Path, shm: ShmSnapshot, cur: Any) -> PartRecord:
        started.set()
        assert gate.wait(10)
        return original(root_, shm, cur)

    monkeypatch.setattr(ck_persist, "_persist_part", held)
    with FlashCheckpointer(
        root, job.meta(0), StateSpec.of(job.arrays(0)), shm_dir=shm_dir, generation=0
    ) as cp:
        stats, future = cp.save(1, job.arrays(0))
        assert started.wait(10)
        assert not future.done() and cp.busy  # training goes on while the persist is pending
        assert stats.nbytes == 2 * ROWS * DIM * 4 + 2 * DENSE * 4
        with pytest.raises(CheckpointBusyError):
            cp.shm.snapshot(2, job.arrays(0), timeout=0.01)
        second: Future[Any] = Future()

        def snap() -> None:
            second.set_result(cp.shm.snapshot(2, job.arrays(0)))

        t = threading.Thread(target=snap)
        t.start()
        assert not second.done()  # held back: the buffer is still being written out
        gate.set()
        record = future.result(timeout=10)
        t.join(10)
        assert second.result(timeout=0).step == 2 and record.step == 1
    assert (root / "step-0000000001.tmp" / "ps-0.bin").stat().st_size == record.nbytes


def test_buffer_grows_when_state_outgrows_it(
    root: Path, shm_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = Job("job-grow", 1)
    with FlashCheckpointer(root, job.meta(0), 8192, shm_dir=shm_dir, generation=0) as cp:
        with caplog.at_level(logging.WARNING, logger=ck.__name__):
            stats, future = cp.save(1, job.arrays(0))
        assert stats.grew and "outgrew" in caplog.text
        commit(root, 1, [future.result(timeout=10)])
    part = load_checkpoint(root, num_ps=1, ps_index=0, job_id="job-grow", shm_dir=shm_dir)
    assert part is not None and part.source == "shm"
    assert np.array_equal(part.weights, job.weights)


def test_read_snapshot_and_cleanup(cluster2: Cluster, shm_dir: Path) -> None:
    cluster2.save(6, {"shard": [1, 2]})
    path = cluster2.cps[1].shm.path
    info, arrays = ShmSnapshot.read(path)
    assert (info.step, info.meta.ps_index, info.verified, info.extra) == (
        6,
        1,
        True,
        {"shard": [1, 2]},
    )
    assert np.array_equal(arrays["weights"], cluster2.job.weights[1::2])
    other = Cluster(Job("job-other", 1), shm_dir.parent / "other", shm_dir)
    other.close()
    assert len(list_shm("job-a", shm_dir)) == 2
    removed = cleanup_shm("job-a", shm_dir)
    assert sorted(p.name for p in removed) == sorted(cp.shm.path.name for cp in cluster2.cps)
    assert not path.exists() and list_shm("job-a", shm_dir) == []
    assert len(list_shm("job-other", shm_dir)) == 1  # another job's files are not touched
    cleanup_shm("job-other", shm_dir)
    assert list(shm_dir.iterdir()) == []


def test_discard_older_generations(root: Path, shm_dir: Path) -> None:
    old = Cluster(Job("job-g", 3), root, shm_dir, generation=1)
    old.save(1)
    old.close()
    new = Cluster(Job("job-g", 2), root, shm_dir, generation=2)
    try:
        new.save(2)
        new.cps[0].shm.discard_older()  # PS 0: its own old part and ps-2 (gone after scale-in)
        names = sorted(p.name.split(".", 2)[2] for p in list_shm("job-g", shm_dir))
        assert names == ["g1.ps-1.snap", "g2.ps-0.snap", "g2.ps-1.snap"]
    finally:
        new.close()
        cleanup_shm("job-g", shm_dir)


def test_meta_and_spec_validation() -> None:
    with pytest.raises(ValueError):
        PartMeta("j", 2, 2, ROWS, DIM)
    with pytest.raises(ValueError):
        PartMeta("j", 2, 0, ROWS, DIM, (1, 2))
    meta = PartMeta("j", 3, 0, ROWS, DIM)
    spec = StateSpec.for_ps(meta, dense_size=DENSE)
    assert [a.name for a in spec.arrays] == ["weights", "accum", "dense", "dense_accum"]
    assert spec.arrays[0].shape == (334, DIM)
    assert spec.capacity() >= spec.nbytes and spec.capacity() % 4096 == 0
    assert [a.name for a in StateSpec.for_ps(PartMeta("j", 3, 1, ROWS, DIM), DENSE).arrays] == [
        "weights",
        "accum",
    ]


@pytest.mark.parametrize("chunk", [100, 16])
def test_repartition_across_chunk_boundaries(
    root: Path, shm_dir: Path, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 3 rows, and rows (32 B) bigger than the chunk, still restore every row."""
    c = Cluster(Job("job-chunk", 2, seed=5), root, shm_dir)
    try:
        c.checkpoint(1)
    finally:
        c.close()
    monkeypatch.setattr(ck_restore, "CHUNK", chunk)
    parts = [load_checkpoint(root, num_ps=3, ps_index=j) for j in range(3)]
    weights, accum = reassemble([p for p in parts if p is not None])
    assert np.array_equal(weights, c.job.weights) and np.array_equal(accum, c.job.accum)


def test_ps_server_adapters(root: Path, shm_dir: Path) -> None:
    """PsCheckpointer and restore_ps_state round-trip a real PsState, also onto 3 PS."""
    from dlrover_kfp.core.spec import ModelSpec  # noqa: PLC0415
    from dlrover_kfp.training.ps_state import PsConfig, PsState  # noqa: PLC0415

    model = ModelSpec(table_sizes=(40, 25), embedding_dim=4, bottom_mlp=(8, 4), top_mlp=(8, 1))
    states = [PsState(PsConfig(model, num_ps=2, ps_index=k, learning_rate=0.1)) for k in range(2)]
    for k, state in enumerate(states):
        slots = torch.arange(state.weights.shape[0])
        state.apply_sparse(slots, torch.full((len(slots), 4), float(k + 1)))
    cps = [ck.PsCheckpointer(root, "job-ps", k, s, shm_dir=shm_dir) for k, s in enumerate(states)]
    try:
        assert all(cp.status()["done"] is False for cp in cps)
        assert all(cp.snapshot(7, s) >= 0.0 for cp, s in zip(cps, states, strict=True))
        for cp in cps:
            cp.flash.persister.close()  # wait for the persist
        reports = [cp.status() for cp in cps]
        assert all(r["done"] and r["error"] is None and r["step"] == 7 for r in reports)
        commit(root, 7, [PartRecord.from_dict(r["part"]) for r in reports])
    finally:
        for cp in cps:
            cp.close()
    same = ck.restore_ps_state(root, PsConfig(model, 2, 0, 0.1), "job-ps", shm_dir=shm_dir)
    assert same is not None and same.dense is not None and states[0].dense is not None
    assert torch.equal(same.weights, states[0].weights) and torch.equal(same.dense, states[0].dense)
    by_gid = torch.empty(65, 4)
    by_gid[0::2], by_gid[1::2] = states[0].accum, states[1].accum
    for j in range(3):
        new = ck.restore_ps_state(root, PsConfig(model, 3, j, 0.1), "job-ps", shm_dir=shm_dir)
        assert new is not None and torch.equal(new.accum, by_gid[j::3])
    cleanup_shm("job-ps", shm_dir)


def test_split_copy_threads(root: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ck_shm, "_SPLIT_MIN", 0)
    job = Job("job-split", 1)
    with FlashCheckpointer(
        root,
        job.meta(0),
        StateSpec.of(job.arrays(0)),
        shm_dir=shm_dir,
        generation=0,
        copy_threads=3,
    ) as cp:
        cp.save(1, job.arrays(0))[1].result(timeout=10)
        _, arrays = ShmSnapshot.read(cp.shm.path)
    assert np.array_equal(arrays["weights"], job.weights)
    assert np.array_equal(arrays["dense_accum"], job.dense_accum)
    cleanup_shm("job-split", shm_dir)


# -- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A 4 MiB tmpfs (root only: the chaos suite's full disk) for the checkpoints."""
    yield from mounted_small_disk(tmp_path / "disk", 4)


def test_a_persist_on_a_full_disk_leaves_no_partial_files(
    small_disk: SmallDisk, shm_dir: Path
) -> None:
    root = small_disk.path / "ckpt"
    cluster = Cluster(Job("job-a", 2), root, shm_dir)
    try:
        cluster.checkpoint(10)
        free = small_disk.fill()
        futures = [cp.save(20, cluster.job.arrays(k))[1] for k, cp in enumerate(cluster.cps)]
        for future in futures:
            with pytest.raises(CheckpointWriteError, match="No space left on device"):
                future.result(timeout=10)
        # Each PS removed its half-written part, and the step's directory with the last one.
        assert sorted(p.name for p in root.iterdir()) == ["step-0000000010"]
        free()
        assert cluster.checkpoint(30) == root / "step-0000000030"
    finally:
        cluster.close()


def test_a_commit_on_a_full_disk_removes_its_step(small_disk: SmallDisk, shm_dir: Path) -> None:
    root = small_disk.path / "ckpt"
    cluster = Cluster(Job("job-a", 2), root, shm_dir)
    try:
        cluster.checkpoint(10)
        records = cluster.save(20)  # both parts on disk in step-20.tmp
        free = small_disk.fill()
        with pytest.raises(CheckpointWriteError, match="No space left on device"):
            commit(root, 20, records, {"step": 20})
        assert sorted(p.name for p in root.iterdir()) == ["step-0000000010"]
        assert list_checkpoints(root) == [10]
        free()
    finally:
        cluster.close()


def test_discard_unfinished_removes_only_that_step(cluster2: Cluster, root: Path) -> None:
    cluster2.checkpoint(10)
    cluster2.save(20)
    assert ck.discard_unfinished(root, 20)
    assert not ck.discard_unfinished(root, 20)  # nothing left to remove
    assert not ck.discard_unfinished(root, 10)  # a committed checkpoint is no .tmp
    assert sorted(p.name for p in root.iterdir()) == ["step-0000000010"]


def test_a_part_is_written_when_a_failed_siblings_cleanup_removes_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PS whose part failed removes the step's directory once it is empty; when that falls
    between another PS's mkdir and open, the other's part must still get its own outcome
    (seen on CI: "No such file or directory" instead of "No space left on device")."""
    step_dir = tmp_path / "step-0000000020.tmp"
    path = step_dir / "ps-1.bin"
    real_open = os.open
    raced: list[str] = []

    def open_after_a_siblings_cleanup(file: Any, flags: int, mode: int = 0o777) -> int:
        if not raced:
            raced.append(str(file))
            step_dir.rmdir()  # the sibling's _remove_partial, between our mkdir and open
        return real_open(file, flags, mode)

    monkeypatch.setattr(ck_persist.os, "open", open_after_a_siblings_cleanup)
    os.close(ck_persist._create_part(step_dir, path))
    assert raced == [str(path)]
    assert path.is_file()


def test_a_part_is_written_when_the_cleanup_falls_inside_mkdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same sibling's cleanup, inside ``mkdir(exist_ok=True)``: between its EEXIST and its
    check that the path is a directory, which then raises "File exists" (seen once in CI on a
    full disk, instead of "No space left on device")."""
    step_dir = tmp_path / "step-0000000020.tmp"
    step_dir.mkdir()
    path = step_dir / "ps-1.bin"
    real_mkdir = Path.mkdir
    raced: list[Path] = []

    def mkdir_during_a_siblings_cleanup(self: Path, *args: Any, **kwargs: Any) -> None:
        if self == step_dir and not raced:
            raced.append(self)
            step_dir.rmdir()  # the sibling's _remove_partial, after the EEXIST
            raise FileExistsError(17, "File exists", str(self))
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir_during_a_siblings_cleanup)
    os.close(ck_persist._create_part(step_dir, path))
    assert raced == [step_dir]
    assert path.is_file()
