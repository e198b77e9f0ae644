"""The worker/PS arithmetic equals the stock in-process trainer, step by step.

The PS job splits one model over processes: the dense network on the worker (its parameters
pulled from PS 0), the embedding rows striped over ``P`` PS, Adagrad done on the PS. None of
that may change the numbers: after every step the loss, and after the run every parameter,
must equal what ``FullDLRM`` + ``torch.optim.Adagrad`` compute on the same batches.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlrover_kfp.core.partition import Partition
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training.data import RowRange, SyntheticCriteo
from dlrover_kfp.training.model import FlatParameters
from dlrover_kfp.training.ps_state import (
    ADAGRAD_EPS,
    DENSE_INITIAL_ACCUMULATOR,
    PsConfig,
    PsState,
)
from dlrover_kfp.training.reference import ReferenceTrainer
from dlrover_kfp.training.step import InProcessPs, WorkerModel

SPEC = ModelSpec(
    table_sizes=(1000, 50, 7, 3000),
    embedding_dim=8,
    dense_features=13,
    bottom_mlp=(16, 8),
    top_mlp=(16, 1),
)
TOTAL_ROWS = sum(SPEC.table_sizes)
LR = 0.05
SEED = 3
BATCH = 256
STEPS = 8


def make_states(num_ps: int, lr: float = LR, seed: int = SEED) -> list[PsState]:
    return [PsState(PsConfig(SPEC, num_ps, k, lr, seed)) for k in range(num_ps)]


def all_rows(states: list[PsState]) -> np.ndarray:
    """Every embedding row, put back in global-id order from the PS that own them."""
    part = states[0].config.partition
    out = np.full((TOTAL_ROWS, SPEC.embedding_dim), np.nan, dtype=np.float32)
    for k, state in enumerate(states):
        out[part.gids_of(k)] = state.weights.numpy()
    assert not np.isnan(out).any()
    return out


def reference_rows(trainer: ReferenceTrainer) -> np.ndarray:
    return torch.cat([t.weight.detach() for t in trainer.model.embedding_bags()]).numpy()


def reference_dense(trainer: ReferenceTrainer) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in trainer.model.dense.parameters()])


@pytest.mark.parametrize("num_ps", [1, 3])
def test_ps_training_equals_the_reference_step_by_step(num_ps: int) -> None:
    data = SyntheticCriteo(BATCH * STEPS, SPEC.table_sizes, SPEC.dense_features, seed=1)
    states = make_states(num_ps)
    # A different seed for the worker's own net: its values must come from PS 0, not from it.
    worker = WorkerModel(SPEC, InProcessPs(states), seed=SEED + 100)
    reference = ReferenceTrainer(SPEC, LR, seed=SEED)

    # Same starting point, built independently on each side.
    np.testing.assert_array_equal(all_rows(states), reference_rows(reference))
    assert states[0].dense is not None
    torch.testing.assert_close(states[0].dense, reference_dense(reference), rtol=0, atol=0)

    for step in range(STEPS):
        batch = data.read(RowRange(0, step * BATCH, (step + 1) * BATCH))
        ps_loss = worker.train_step(batch)
        ref_loss = reference.train_step(batch)
        assert abs(ps_loss - ref_loss) <= 1e-5, (step, ps_loss, ref_loss)

    rows, ref = all_rows(states), reference_rows(reference)
    # Training moved the rows it touched (the comparison below is not of untouched values).
    start = all_rows(make_states(num_ps))
    assert np.abs(rows - start).max() > 1e-3
    np.testing.assert_allclose(rows, ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(states[0].dense, reference_dense(reference), rtol=0, atol=1e-5)
    assert states[0].updates == STEPS
    # Every PS saw one push per step whose batch had ids of its rows.
    assert all(0 < s.updates <= STEPS for s in states)
    # The optimiser state matches too: torch's Adagrad "sum" is the PS accumulator.
    ref_accum = torch.cat(
        [reference.optimizer.state[t.weight]["sum"] for t in reference.model.embedding_bags()]
    ).numpy()
    part = Partition(TOTAL_ROWS, num_ps)
    for k, state in enumerate(states):
        np.testing.assert_allclose(
            state.accum.numpy(), ref_accum[part.gids_of(k)], rtol=1e-5, atol=1e-9
        )


def test_ps_that_get_no_ids_in_a_step_stay_in_step() -> None:
    """Tiny batches over 7 PS: most PS have no row of a batch and receive empty pushes."""
    data = SyntheticCriteo(3 * 6, SPEC.table_sizes, SPEC.dense_features, seed=5)
    states = make_states(7)
    worker = WorkerModel(SPEC, InProcessPs(states), seed=SEED)
    reference = ReferenceTrainer(SPEC, LR, seed=SEED)
    for step in range(6):
        batch = data.read(RowRange(0, 3 * step, 3 * step + 3))
        assert abs(worker.train_step(batch) - reference.train_step(batch)) <= 1e-5
    # 3 rows x 4 tables: at most 12 ids a step, so some PS sat out some steps.
    assert min(s.updates for s in states) < 6
    np.testing.assert_allclose(all_rows(states), reference_rows(reference), rtol=0, atol=1e-5)
    torch.testing.assert_close(states[0].dense, reference_dense(reference), rtol=0, atol=1e-5)


def test_predict_matches_the_reference() -> None:
    data = SyntheticCriteo(BATCH * 3, SPEC.table_sizes, SPEC.dense_features, seed=2)
    states = make_states(3)
    worker = WorkerModel(SPEC, InProcessPs(states), seed=SEED)
    reference = ReferenceTrainer(SPEC, LR, seed=SEED)
    for step in range(2):
        batch = data.read(RowRange(0, step * BATCH, (step + 1) * BATCH))
        worker.train_step(batch)
        reference.train_step(batch)
    held_out = data.read(RowRange(0, 2 * BATCH, 3 * BATCH))
    before = all_rows(states)
    probs = worker.predict(held_out)
    np.testing.assert_allclose(probs, reference.predict(held_out).numpy(), rtol=0, atol=1e-5)
    assert np.array_equal(all_rows(states), before)  # predicting updates nothing


# -------------------------------------------------------------------------- PsState Adagrad


def test_apply_sparse_equals_torch_adagrad_on_a_sparse_embedding() -> None:
    num_ps, dim = 2, SPEC.embedding_dim
    state = make_states(num_ps, lr=0.3)[1]
    rows = state.weights.shape[0]
    embedding = torch.nn.Embedding(rows, dim, sparse=True)
    with torch.no_grad():
        embedding.weight.copy_(state.weights)
    optimizer = torch.optim.Adagrad(embedding.parameters(), lr=0.3, eps=ADAGRAD_EPS)
    gen = torch.Generator().manual_seed(0)
    # Overlapping slot sets, so accumulated squares from earlier steps matter.
    for slots in ([0, 5, 17], [5, 1, rows - 1, 17], [17], [3, 0, 9, 5, 2]):
        index = torch.tensor(slots, dtype=torch.int64)
        grads = torch.randn(len(slots), dim, generator=gen) * 3
        state.apply_sparse(index, grads.clone())
        optimizer.zero_grad()
        embedding.weight.grad = torch.sparse_coo_tensor(
            index.unsqueeze(0), grads, (rows, dim)
        ).coalesce()
        optimizer.step()
        torch.testing.assert_close(state.weights, embedding.weight.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(state.accum, optimizer.state[embedding.weight]["sum"])
    assert state.updates == 4
    # Rows never pushed are untouched and have no accumulated squares.
    untouched = [i for i in range(rows) if i not in {0, 1, 2, 3, 5, 9, 17, rows - 1}]
    assert torch.count_nonzero(state.accum[untouched]) == 0


def test_apply_sparse_first_step_size_is_the_learning_rate() -> None:
    state = make_states(1, lr=0.25)[0]
    before = state.weights[[4, 8]].clone()
    grads = torch.tensor([[2.0] * 8, [-0.5] * 8])
    state.apply_sparse(torch.tensor([4, 8]), grads)
    # a = g², so the first step is lr·g/|g| = ±lr whatever the size of g.
    torch.testing.assert_close(state.weights[[4, 8]] - before, -0.25 * torch.sign(grads))
    torch.testing.assert_close(state.accum[[4, 8]], grads * grads)


def test_apply_dense_equals_torch_adagrad() -> None:
    state = make_states(2, lr=0.1)[0]
    assert state.dense is not None
    param = torch.nn.Parameter(state.dense.clone())
    optimizer = torch.optim.Adagrad(
        [param], lr=0.1, eps=ADAGRAD_EPS, initial_accumulator_value=DENSE_INITIAL_ACCUMULATOR
    )
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        grad = torch.randn(param.numel(), generator=gen)
        grad[::7] = 0.0  # parameters without gradient stay put
        state.apply_dense(grad)
        param.grad = grad.clone()
        optimizer.step()
    torch.testing.assert_close(state.dense, param.detach(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(state.dense_accum, optimizer.state[param]["sum"])


def test_the_first_dense_step_is_not_the_full_learning_rate() -> None:
    """From a zero accumulator every dense weight's first step would be ±lr whatever its
    gradient; asynchronous workers each took one on the same stale values and killed units
    (ps_state's docstring). From a_0 the step is lr·g/sqrt(a_0 + g²): small for small g."""
    state = make_states(1, lr=0.05)[0]
    assert state.dense is not None
    before = state.dense.clone()
    grad = torch.zeros_like(before)
    grad[:3] = torch.tensor([0.001, -0.01, 1.0])
    state.apply_dense(grad)
    expected = -0.05 * grad[:3] / torch.sqrt(DENSE_INITIAL_ACCUMULATOR + grad[:3] ** 2)
    torch.testing.assert_close(state.dense[:3] - before[:3], expected)
    assert float((state.dense[:2] - before[:2]).abs().max()) < 0.1 * 0.05


def test_only_ps_zero_holds_and_trains_the_dense_parameters() -> None:
    states = make_states(3)
    assert states[0].holds_dense
    assert states[0].dense is not None
    assert len(states[0].dense) == len(FlatParameters(WorkerModel(SPEC, InProcessPs(states)).net))
    for state in states[1:]:
        assert not state.holds_dense
        assert set(state.arrays()) == {"weights", "accum"}
        with pytest.raises(ValueError, match="does not hold the dense parameters"):
            state.apply_dense(torch.zeros(10))
    assert set(states[0].arrays()) == {"weights", "accum", "dense", "dense_accum"}


def test_state_of_the_wrong_shape_is_refused() -> None:
    config = PsConfig(SPEC, 3, 1, LR)
    rows = Partition(TOTAL_ROWS, 3).rows_on(1)
    with pytest.raises(ValueError, match="does not match the partition"):
        PsState(config, weights=torch.zeros(rows + 1, SPEC.embedding_dim))
    with pytest.raises(ValueError, match="does not match the partition"):
        PsState(
            config,
            weights=torch.zeros(rows, SPEC.embedding_dim),
            accum=torch.zeros(rows, SPEC.embedding_dim + 1),
        )
