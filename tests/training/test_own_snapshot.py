"""A PS restarted in its pod restores its part of the committed step from its own snapshot.

Each PS pod has its own shared memory (a pod's ``/dev/shm``), so a restarted PS finds its own
part there and no other: :func:`own_snapshot` takes it when it is exactly the committed part,
and :func:`restore_own_part` falls back to the volume otherwise (a later snapshot begun, a
changed byte, a different PS count).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training import checkpoint as ck
from dlrover_kfp.training.checkpoint import PartRecord, commit, select_checkpoint
from dlrover_kfp.training.ps_state import PsConfig, PsState

MODEL = ModelSpec(table_sizes=(40, 25), embedding_dim=4, bottom_mlp=(8, 4), top_mlp=(8, 1))
JOB = "job-own"


def _states() -> list[PsState]:
    states = [PsState(PsConfig(MODEL, num_ps=2, ps_index=k, learning_rate=0.1)) for k in range(2)]
    for k, state in enumerate(states):
        slots = torch.arange(state.weights.shape[0])
        state.apply_sparse(slots, torch.full((len(slots), 4), float(k + 1)))
    return states


def _checkpoint(
    root: Path, pods: list[Path], states: list[PsState], steps: tuple[int, ...], *, last: bool
) -> ck.CheckpointChoice:
    """Each PS snapshots into its own pod's shm dir at each of ``steps`` (a row changed before
    each), every snapshot persisted; committed unless it is the last one and not ``last`` (a
    checkpoint cut short before its commit). Returns the committed checkpoint to restore."""
    cps = [ck.PsCheckpointer(root, JOB, k, s, shm_dir=pods[k]) for k, s in enumerate(states)]
    for step in steps:
        for cp, state in zip(cps, states, strict=True):
            state.apply_sparse(torch.tensor([0]), torch.ones(1, 4))
            cp.snapshot(step, state)
        records = []
        for cp in cps:
            while not cp.status()["done"]:
                time.sleep(0.01)
            records.append(PartRecord.from_dict(cp.status()["part"]))
        if last or step != steps[-1]:
            commit(root, step, records)
    for cp in cps:
        cp.close()
    choice = select_checkpoint(root)
    assert choice is not None and choice.source == "disk"
    return choice


def _restore(
    root: Path, pods: list[Path], choice: ck.CheckpointChoice, k: int
) -> tuple[PsState, bool]:
    """PS ``k``'s part of ``choice``, restored in its own pod, and whether from memory."""
    return ck.restore_own_part(root, PsConfig(MODEL, 2, k, 0.1), JOB, choice, shm_dir=pods[k])


@pytest.fixture
def pods(tmp_path: Path) -> list[Path]:
    dirs = [tmp_path / f"pod-{k}" for k in range(2)]
    for d in dirs:
        d.mkdir()
    return dirs


def test_the_committed_part_is_restored_from_the_pods_own_memory(
    tmp_path: Path, pods: list[Path]
) -> None:
    root, states = tmp_path / "ckpt", _states()
    choice = _checkpoint(root, pods, states, (7,), last=True)
    assert choice.step == 7
    # Another pod's memory holds no part of this PS.
    assert ck.own_snapshot(choice, 0, pods[1]) is None
    for k in range(2):
        own = ck.own_snapshot(choice, k, pods[k])
        assert own is not None and own.source == "shm"
        assert Path(own.parts[k].path).parent == pods[k]
        assert own.parts[1 - k] == choice.parts[1 - k]  # the other part: still the volume's
        state, from_memory = _restore(root, pods, choice, k)
        assert from_memory
        assert ck.list_shm(JOB, pods[k]) == []  # the new process allocates its own snapshot
        assert torch.equal(state.weights, states[k].weights)
        assert torch.equal(state.accum, states[k].accum)


def test_a_later_uncommitted_snapshot_sends_the_restore_to_the_volume(
    tmp_path: Path, pods: list[Path]
) -> None:
    root, states = tmp_path / "ckpt", _states()
    choice = _checkpoint(root, pods, states, (7, 9), last=False)  # 9: never committed
    assert choice.step == 7
    assert ck.own_snapshot(choice, 0, pods[0]) is None
    state, from_memory = _restore(root, pods, choice, 0)
    assert not from_memory
    assert ck.list_shm(JOB, pods[0]) == []  # a stale snapshot goes too
    assert not torch.equal(state.weights, states[0].weights)  # step 7's, not step 9's rows


def test_a_changed_byte_in_memory_fails_its_crc_and_the_volume_is_read(
    tmp_path: Path, pods: list[Path]
) -> None:
    root, states = tmp_path / "ckpt", _states()
    choice = _checkpoint(root, pods, states, (7,), last=True)
    own = ck.own_snapshot(choice, 0, pods[0])
    assert own is not None
    snap = Path(own.parts[0].path)
    data = bytearray(snap.read_bytes())
    data[own.parts[0].nbytes // 2] ^= 0xFF  # a byte of the arrays
    snap.write_bytes(bytes(data))
    state, from_memory = _restore(root, pods, choice, 0)
    assert not from_memory
    assert torch.equal(state.weights, states[0].weights)


def test_no_own_part_when_the_ps_count_changed(tmp_path: Path, pods: list[Path]) -> None:
    root, states = tmp_path / "ckpt", _states()
    choice = _checkpoint(root, pods, states, (7,), last=True)
    assert ck.own_snapshot(choice, 2, pods[0]) is None  # PS 2 of 3: every part is needed
