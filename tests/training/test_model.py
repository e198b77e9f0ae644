"""The dense DLRM, its flat parameter layout, and the partition-free embedding initialisation."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from dlrover_kfp.core.partition import Partition, table_offsets
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training import model as model_module
from dlrover_kfp.training.model import (
    DenseDLRM,
    FlatParameters,
    FullDLRM,
    dense_parameter_count,
    init_embedding_rows,
    load_flat,
)
from dlrover_kfp.training.ps_state import PsConfig, PsState

SPEC = ModelSpec(
    table_sizes=(1000, 50, 7, 3000),
    embedding_dim=8,
    dense_features=5,
    bottom_mlp=(16, 8),
    top_mlp=(16, 1),
)
TOTAL_ROWS = sum(SPEC.table_sizes)


def inputs(batch: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    dense = torch.randn(batch, SPEC.dense_features, generator=gen)
    emb = torch.randn(batch, len(SPEC.table_sizes), SPEC.embedding_dim, generator=gen)
    return dense, emb


# --------------------------------------------------------------------------- FlatParameters


def test_flat_parameters_hold_the_module_values_in_order() -> None:
    net = DenseDLRM(SPEC, seed=1)
    expected = torch.cat([p.detach().reshape(-1).clone() for p in net.parameters()])
    flat = FlatParameters(net)
    assert len(flat) == expected.numel() == dense_parameter_count(SPEC)
    assert torch.equal(flat.values, expected)
    assert torch.count_nonzero(flat.grad) == 0


def test_parameters_are_views_of_the_flat_vector() -> None:
    net = DenseDLRM(SPEC, seed=1)
    flat = FlatParameters(net)
    dense, emb = inputs()
    before = net(dense, emb).detach().clone()

    flat.values.mul_(0.5)
    params = list(net.parameters())
    first = params[0]
    assert first.data_ptr() == flat.values.data_ptr()
    assert torch.equal(first.reshape(-1), flat.values[: first.numel()])
    assert not torch.equal(net(dense, emb), before)  # the module computes with the new values

    # And the other way round: writing a parameter in place writes the flat vector.
    last = params[-1]
    with torch.no_grad():
        last.fill_(3.25)
    assert torch.all(flat.values[-last.numel() :] == 3.25)


def test_backward_accumulates_into_flat_grad_like_a_plain_module() -> None:
    plain = DenseDLRM(SPEC, seed=2)
    flat_net = copy.deepcopy(plain)
    flat = FlatParameters(flat_net)
    dense, emb = inputs(batch=9, seed=5)

    plain(dense, emb).square().sum().backward()
    flat.zero_grad()
    flat_net(dense, emb).square().sum().backward()

    expected = torch.cat([p.grad.reshape(-1) for p in plain.parameters() if p.grad is not None])
    assert expected.numel() == len(flat)
    torch.testing.assert_close(flat.grad, expected, rtol=1e-6, atol=1e-7)
    assert torch.count_nonzero(flat.grad) > 0
    # The module's .grad tensors are the flat gradient's views, not copies.
    for p in flat_net.parameters():
        assert p.grad is not None
        assert p.grad.untyped_storage().data_ptr() == flat.grad.untyped_storage().data_ptr()

    # Without zero_grad a second pass accumulates (as autograd does); zero_grad clears it.
    flat_net(dense, emb).square().sum().backward()
    torch.testing.assert_close(flat.grad, 2 * expected, rtol=1e-6, atol=1e-7)
    flat.zero_grad()
    assert torch.count_nonzero(flat.grad) == 0
    assert all(
        p.grad is not None and torch.count_nonzero(p.grad) == 0 for p in flat_net.parameters()
    )


@pytest.mark.parametrize("as_numpy", [True, False])
def test_load_copies_the_values(as_numpy: bool) -> None:
    net = DenseDLRM(SPEC, seed=0)
    flat = FlatParameters(net)
    values = torch.arange(len(flat), dtype=torch.float32) / len(flat)
    source: np.ndarray | torch.Tensor = values.numpy().copy() if as_numpy else values.clone()
    flat.load(source)
    assert torch.equal(flat.values, values)
    assert torch.equal(next(net.parameters()).reshape(-1), values[: next(net.parameters()).numel()])
    source[:] = -1.0  # the source is not aliased
    assert torch.equal(flat.values, values)


def test_load_flat_is_the_inverse_of_the_flat_layout() -> None:
    trained = DenseDLRM(SPEC, seed=3)
    flat = FlatParameters(trained)
    other = DenseDLRM(SPEC, seed=4)
    assert not torch.equal(FlatParameters(copy.deepcopy(other)).values, flat.values)
    load_flat(other, flat.values)
    for a, b in zip(trained.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    dense, emb = inputs()
    assert torch.equal(trained(dense, emb), other(dense, emb))


@pytest.mark.parametrize("delta", [1, -1])
def test_load_flat_refuses_a_vector_of_the_wrong_size(delta: int) -> None:
    net = DenseDLRM(SPEC)
    n = dense_parameter_count(SPEC)
    with pytest.raises(ValueError, match="flat vector"):
        load_flat(net, torch.zeros(n + delta))


# ----------------------------------------------------------------------- embedding init


def reassembled(num_ps: int, seed: int) -> np.ndarray:
    """Initial rows built PS by PS (each PS its own gids) and put back in gid order."""
    part = Partition(TOTAL_ROWS, num_ps)
    out = np.full((TOTAL_ROWS, SPEC.embedding_dim), np.nan, dtype=np.float32)
    for k in range(num_ps):
        out[part.gids_of(k)] = init_embedding_rows(part.gids_of(k), SPEC, seed)
    return out


def test_init_is_the_same_whatever_the_partition() -> None:
    whole = init_embedding_rows(np.arange(TOTAL_ROWS, dtype=np.int64), SPEC, seed=7)
    assert whole.dtype == np.float32
    assert whole.shape == (TOTAL_ROWS, SPEC.embedding_dim)
    for num_ps in (1, 2, 3, 5):
        assert np.array_equal(reassembled(num_ps, seed=7), whole)
    # The PS states built from a config hold exactly those rows at their slots.
    for num_ps in (2, 3):
        part = Partition(TOTAL_ROWS, num_ps)
        for k in range(num_ps):
            state = PsState(PsConfig(SPEC, num_ps, k, learning_rate=0.1, seed=7))
            assert np.array_equal(state.weights.numpy(), whole[part.gids_of(k)])
    # Any subset, in any order, gives the same row for the same gid.
    rng = np.random.default_rng(0)
    picked = rng.permutation(TOTAL_ROWS)[:300].astype(np.int64)
    assert np.array_equal(init_embedding_rows(picked, SPEC, seed=7), whole[picked])


def test_init_does_not_depend_on_the_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    gids = np.arange(TOTAL_ROWS, dtype=np.int64)
    whole = init_embedding_rows(gids, SPEC, seed=3)
    monkeypatch.setattr(model_module, "_INIT_CHUNK_ROWS", 7)
    assert np.array_equal(init_embedding_rows(gids, SPEC, seed=3), whole)


def test_init_lies_within_each_tables_bound() -> None:
    rows = init_embedding_rows(np.arange(TOTAL_ROWS, dtype=np.int64), SPEC, seed=0)
    offsets = table_offsets(SPEC.table_sizes)
    for t, n in enumerate(SPEC.table_sizes):
        block = rows[offsets[t] : offsets[t] + n]
        bound = math.sqrt(1.0 / n)
        assert np.all(np.abs(block) <= bound), t
        # Uniform over the whole interval, not squeezed into a corner of it.
        assert block.max() > 0.8 * bound
        assert block.min() < -0.8 * bound
        assert abs(float(block.mean())) < 0.15 * bound
        assert len(np.unique(block)) > 0.9 * block.size


def test_init_is_deterministic_per_seed_and_differs_across_seeds() -> None:
    gids = np.arange(0, TOTAL_ROWS, 3, dtype=np.int64)
    a = init_embedding_rows(gids, SPEC, seed=11)
    assert np.array_equal(a, init_embedding_rows(gids, SPEC, seed=11))
    b = init_embedding_rows(gids, SPEC, seed=12)
    assert np.mean(a == b) < 0.01
    assert not np.array_equal(init_embedding_rows(gids, SPEC, seed=0), a)


def test_full_model_starts_from_the_same_rows() -> None:
    full = FullDLRM(SPEC, seed=5)
    offsets = table_offsets(SPEC.table_sizes)
    for t, table in enumerate(full.embedding_bags()):
        gids = np.arange(SPEC.table_sizes[t], dtype=np.int64) + offsets[t]
        assert np.array_equal(table.weight.detach().numpy(), init_embedding_rows(gids, SPEC, 5))
    # Its dense part is the same DenseDLRM the workers and PS 0 build from the seed.
    assert torch.equal(
        FlatParameters(copy.deepcopy(full.dense)).values,
        FlatParameters(DenseDLRM(SPEC, seed=5)).values,
    )


# ------------------------------------------------------------------------------- DenseDLRM


def test_dense_dlrm_shapes_and_interaction() -> None:
    net = DenseDLRM(SPEC, seed=0)
    tables = len(SPEC.table_sizes)
    n_inter = tables * (tables + 1) // 2  # pairs among T tables and the bottom MLP output
    first_top = net.top[0]
    assert isinstance(first_top, torch.nn.Linear)
    assert first_top.in_features == SPEC.embedding_dim + n_inter

    captured: list[torch.Tensor] = []
    net.top.register_forward_hook(lambda _m, args, _out: captured.append(args[0]))
    dense, emb = inputs(batch=4)
    out = net(dense, emb)
    assert out.shape == (4,)

    (top_in,) = captured
    assert top_in.shape == (4, SPEC.embedding_dim + n_inter)
    z0 = net.bottom(dense)
    assert torch.allclose(top_in[:, : SPEC.embedding_dim], z0)
    z = [z0, *emb.unbind(1)]
    pairs = [(z[i] * z[j]).sum(1) for i in range(tables + 1) for j in range(i)]
    assert len(pairs) == n_inter
    torch.testing.assert_close(top_in[:, SPEC.embedding_dim :], torch.stack(pairs, dim=1))


def test_dense_dlrm_is_deterministic_per_seed() -> None:
    a = FlatParameters(DenseDLRM(SPEC, seed=9)).values
    assert torch.equal(a, FlatParameters(DenseDLRM(SPEC, seed=9)).values)
    assert not torch.equal(a, FlatParameters(DenseDLRM(SPEC, seed=10)).values)
