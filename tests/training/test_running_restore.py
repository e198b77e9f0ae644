"""A running PS rolls back to the committed checkpoint in place (the ``restore`` request).

When another PS of the job crashes, the master rolls every PS back to the last committed step;
the ones still running do it without a new process: the request holds the PS's gate, overwrites
its state's tensors with its part of that step (from its own snapshot buffer when it holds
exactly that part, else the volume) and keeps its buffer for the next checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.runtime.checkpoints import CheckpointCoordinator
from dlrover_kfp.training import checkpoint as ck
from dlrover_kfp.training.ps_server import RESTORE, PsService
from dlrover_kfp.training.ps_state import PsConfig, PsState
from dlrover_kfp.training.wire import Message, PeerInfo, Server, connect, new_secret

MODEL = ModelSpec(table_sizes=(40, 25), embedding_dim=4, bottom_mlp=(8, 4), top_mlp=(8, 1))
JOB = "job-running"
PEER = PeerInfo(id=1, address=("127.0.0.1", 1))


def _service(root: Path, pod: Path) -> PsService:
    """PS 0 of 1 (it holds the dense parameters too), trained a little, with its checkpointer."""
    state = PsState(PsConfig(MODEL, num_ps=1, ps_index=0, learning_rate=0.1))
    _train(state, 1.0)
    return PsService(state, ck.PsCheckpointer(root, JOB, 0, state, shm_dir=pod))


def _train(state: PsState, grad: float) -> None:
    """One update of every row and of the dense vector."""
    slots = torch.arange(state.weights.shape[0])
    state.apply_sparse(slots, torch.full((len(slots), 4), grad))
    assert state.dense is not None
    state.apply_dense(torch.full_like(state.dense, grad))


def _checkpoint(service: PsService, root: Path, step: int, *, commit: bool) -> None:
    """A checkpoint of ``step`` through the server's request, persisted; committed if asked."""
    service.handle(PEER, Message("checkpoint", {"step": step}, ()))
    assert service.checkpointer is not None
    while not (status := service.checkpointer.status())["done"]:
        time.sleep(0.01)
    if commit:
        ck.commit(root, step, [ck.PartRecord.from_dict(status["part"])])


def _copy(state: PsState) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in state.arrays().items()}


def _restore(service: PsService, root: Path) -> Message:
    choice = ck.select_checkpoint(root)
    assert choice is not None and choice.source == "disk"
    reply = service.handle(PEER, Message(RESTORE, {"choice": choice.to_dict()}, ()))
    assert reply is not None and reply.kind == "ok"
    return reply


@pytest.fixture
def ps(tmp_path: Path) -> Iterator[tuple[Path, PsService, dict[str, torch.Tensor]]]:
    """(the checkpoint root, a running PS with step 7 committed, its state at step 7)."""
    pod = tmp_path / "pod"
    pod.mkdir()
    root = tmp_path / "ckpt"
    service = _service(root, pod)
    _checkpoint(service, root, 7, commit=True)
    yield root, service, _copy(service.state)
    assert service.checkpointer is not None
    service.checkpointer.close()


def test_a_running_ps_restores_its_committed_part_from_its_own_buffer_in_place(
    ps: tuple[Path, PsService, dict[str, torch.Tensor]],
) -> None:
    root, service, committed = ps
    tensors = {name: t.data_ptr() for name, t in service.state.arrays().items()}
    buffer = ck.list_shm(JOB, root.parent / "pod")
    assert len(buffer) == 1
    _train(service.state, 3.0)  # trained on after the commit: to be taken back
    assert not torch.equal(service.state.weights, committed["weights"])

    reply = _restore(service, root)

    assert reply.meta["source"] == "memory"
    assert reply.meta["seconds"] >= 0
    for name, tensor in service.state.arrays().items():
        assert torch.equal(tensor, committed[name]), name  # exact rows and dense
        assert tensor.data_ptr() == tensors[name], name  # overwritten, not reallocated
    # The buffer stays the PS's own (same file, still mapped): the next checkpoint reuses it.
    assert ck.list_shm(JOB, root.parent / "pod") == buffer
    _train(service.state, 2.0)
    _checkpoint(service, root, 8, commit=True)
    assert ck.list_shm(JOB, root.parent / "pod") == buffer


def test_a_snapshot_of_a_later_step_is_refused_and_the_volume_restored(
    ps: tuple[Path, PsService, dict[str, torch.Tensor]],
) -> None:
    root, service, committed = ps
    _train(service.state, 3.0)
    _checkpoint(service, root, 9, commit=False)  # a checkpoint the crash cut short
    _train(service.state, 5.0)

    reply = _restore(service, root)

    assert reply.meta["source"] == "volume"
    for name, tensor in service.state.arrays().items():
        assert torch.equal(tensor, committed[name]), name  # step 7's, not step 9's


def test_without_a_committed_checkpoint_the_state_starts_over(
    ps: tuple[Path, PsService, dict[str, torch.Tensor]],
) -> None:
    _, service, _ = ps
    initial = PsState(service.state.config)
    reply = service.handle(PEER, Message(RESTORE, {"choice": None}, ()))
    assert reply is not None and reply.meta["source"] == "start"
    for name, tensor in service.state.arrays().items():
        assert torch.equal(tensor, initial.arrays()[name]), name


def test_the_coordinator_rolls_the_running_ps_back_and_restarts_one_that_cannot(
    tmp_path: Path,
) -> None:
    """After a crash the coordinator rolls a running PS (ps-1) back in its process to the last
    committed step, after a checkpoint begun since; a PS that fails its restore (here one
    started without a checkpoint directory, in ps-0's place) is asked to restart in its pod."""
    root, secret = tmp_path / "ckpt", new_secret()
    states = [PsState(PsConfig(MODEL, num_ps=2, ps_index=k, learning_rate=0.1)) for k in range(2)]
    services = []
    for k, state in enumerate(states):
        pod = tmp_path / f"pod-{k}"
        pod.mkdir()
        services.append(PsService(state, ck.PsCheckpointer(root, JOB, k, state, shm_dir=pod)))
    services.append(PsService(PsState(states[1].config), None))  # cannot restore anything
    servers = []
    for service in services:
        server = Server(("127.0.0.1", 0), secret, service.handle, threaded=True)
        service.server = server
        server.serve_in_thread(name="ps")
        servers.append(server)
    coordinator = CheckpointCoordinator(root, [s.address for s in servers[:2]], secret)
    try:
        for state in states:
            _train_rows(state, 1.0)
        coordinator.checkpoint(7, extra={})
        committed = _copy(states[1])
        _train_rows(states[1], 3.0)
        _checkpoint(services[1], root, 8, commit=False)  # begun, cut short by the crash
        # The restore-refusing PS stands in for ps-0's place in the coordinator's list.
        coordinator.connections[0].close()
        coordinator.connections[0] = connect(servers[2].address, secret, timeout=5.0)

        choice, rolled = coordinator.roll_back({0, 1})

        assert choice is not None and choice.step == 7
        assert set(rolled) == {1} and rolled[1][0] == "volume"  # its buffer holds step 8
        for name, tensor in states[1].arrays().items():
            assert torch.equal(tensor, committed[name]), name
        assert services[2].restart_asked  # restarts and restores as a restarted PS does
        assert not services[1].restart_asked
    finally:
        coordinator.close()
        for server in servers:
            server.stop()
            server.close()
        for service in services[:2]:
            assert service.checkpointer is not None
            service.checkpointer.close()


def _train_rows(state: PsState, grad: float) -> None:
    slots = torch.arange(state.weights.shape[0])
    state.apply_sparse(slots, torch.full((len(slots), 4), grad))
