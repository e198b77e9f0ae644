"""The dense DLRM, its flat parameter layout, and the partition-free embedding initialisation."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from dlrover_kfp.core.partition import Partition, table_offsets
from dlrover_kfp.core.pod_env import POD_CPU_ENV
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training import memory
from dlrover_kfp.training import model as model_module
from dlrover_kfp.training.model import (
    DenseDLRM,
    FlatParameters,
    FullDLRM,
    dense_parameter_count,
    init_embedding_rows,
    init_embedding_slots,
    load_flat,
)
from dlrover_kfp.training.ps_state import PsConfig, PsState, startup_threads

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


def test_ps_state_is_the_same_whatever_the_pod_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PS builds its state with as many threads as its pod has CPUs; the rows do not change,
    and the accumulator starts at zero."""
    monkeypatch.setattr(model_module, "_INIT_PIECE_BYTES", 64 * SPEC.embedding_dim * 4)
    monkeypatch.delenv(POD_CPU_ENV, raising=False)
    one = PsState(PsConfig(SPEC, 3, 1, learning_rate=0.1, seed=2))
    monkeypatch.setenv(POD_CPU_ENV, "2.5")
    three = PsState(PsConfig(SPEC, 3, 1, learning_rate=0.1, seed=2))
    assert torch.equal(one.weights, three.weights)
    assert torch.count_nonzero(three.accum) == 0
    assert three.accum.shape == three.weights.shape
    assert three.weights.is_contiguous() and three.accum.is_contiguous()


CPU_TO_THREADS = {"1": 1, "0.5": 1, "2": 2, "2.5": 3, "64": 4, "0": 1, "-3": 1, "nan": 1}


def test_startup_threads_follow_the_pod_cpu() -> None:
    assert startup_threads({}) == 1  # unset: assume the cores are shared
    for value, threads in {**CPU_TO_THREADS, "inf": 1, "two": 1}.items():
        assert startup_threads({POD_CPU_ENV: value}) == threads, value


def test_init_does_not_depend_on_the_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    gids = np.arange(TOTAL_ROWS, dtype=np.int64)
    whole = init_embedding_rows(gids, SPEC, seed=3)
    # 7 elements a chunk: chunks of 1 row of 8 (dim 8 > 7), pieces of 3 rows.
    monkeypatch.setattr(model_module, "_INIT_CHUNK_ELEMS", 7)
    monkeypatch.setattr(model_module, "_INIT_PIECE_BYTES", 3 * SPEC.embedding_dim * 4)
    assert np.array_equal(init_embedding_rows(gids, SPEC, seed=3), whole)
    assert np.array_equal(init_embedding_slots(SPEC, 3, threads=3), whole)
    monkeypatch.setattr(model_module, "_INIT_CHUNK_ELEMS", 8 * 13)
    monkeypatch.setattr(model_module, "_INIT_PIECE_BYTES", 1 << 20)
    assert np.array_equal(init_embedding_rows(gids, SPEC, seed=3), whole)
    assert np.array_equal(init_embedding_slots(SPEC, 3), whole)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("num_ps", [1, 2, 3, 5])
def test_a_ps_computes_its_stripe_equal_to_the_whole(
    monkeypatch: pytest.MonkeyPatch, num_ps: int, threads: int
) -> None:
    """What a PS holds (its slots, computed alone, in pieces over threads, straight into
    populated memory) is exactly its rows of the model that one process computes."""
    whole = init_embedding_rows(np.arange(TOTAL_ROWS, dtype=np.int64), SPEC, seed=9)
    # Small pieces, so that the threads share many of them and pieces end mid-table.
    monkeypatch.setattr(model_module, "_INIT_PIECE_BYTES", 37 * SPEC.embedding_dim * 4)
    monkeypatch.setattr(model_module, "_INIT_CHUNK_ELEMS", 11 * SPEC.embedding_dim)
    part = Partition(TOTAL_ROWS, num_ps)
    for k in range(num_ps):
        rows = part.rows_on(k)
        out = memory.anonymous((rows, SPEC.embedding_dim), np.float32)
        got = init_embedding_slots(
            SPEC, 9, num_ps=num_ps, ps_index=k, out=out, threads=threads, populate=True
        )
        assert got is out
        assert np.array_equal(got, whole[part.gids_of(k)])
        # Any range of slots alone gives the same rows too.
        a, b = rows // 3, rows // 3 + 101
        sub = init_embedding_slots(SPEC, 9, num_ps=num_ps, ps_index=k, start=a, stop=b)
        assert np.array_equal(sub, whole[part.gids_of(k)[a:b]])


def test_init_across_32_bit_counter_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Models with more than 2^32 elements start a new block of keys every floor(2^32 / d)
    rows; the fast and the general path cut blocks at the same rows."""
    plain = init_embedding_rows(np.arange(TOTAL_ROWS, dtype=np.int64), SPEC, seed=4)
    monkeypatch.setattr(model_module, "_rows_per_block", lambda dim: 97)
    gids = np.arange(TOTAL_ROWS, dtype=np.int64)
    whole = init_embedding_rows(gids, SPEC, seed=4)
    assert not np.array_equal(whole[97:], plain[97:])  # new keys from row 97 on
    assert np.array_equal(whole[:97], plain[:97])
    for num_ps in (1, 3):
        part = Partition(TOTAL_ROWS, num_ps)
        for k in range(num_ps):
            got = init_embedding_slots(SPEC, 4, num_ps=num_ps, ps_index=k, threads=2)
            assert np.array_equal(got, whole[part.gids_of(k)])
    # Blocks are independent: no row repeats another row's values.
    assert len(np.unique(whole, axis=0)) == TOTAL_ROWS


def test_init_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="out of range"):
        init_embedding_slots(SPEC, 0, num_ps=2, ps_index=2)
    with pytest.raises(ValueError, match="out of range"):
        init_embedding_slots(SPEC, 0, start=5, stop=TOTAL_ROWS + 1)
    with pytest.raises(ValueError, match="C-contiguous float32"):
        init_embedding_slots(SPEC, 0, out=np.empty((TOTAL_ROWS, 8), dtype=np.float64))
    with pytest.raises(ValueError, match="global ids"):
        init_embedding_rows(np.array([TOTAL_ROWS], dtype=np.int64), SPEC, 0)
    assert init_embedding_slots(SPEC, 0, start=3, stop=3).shape == (0, SPEC.embedding_dim)


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
        if block.size >= 8000:
            # Uniform on [-b, b]: sd b/sqrt(3); ten equal bins hold a tenth each (a bin of 800+
            # values has a binomial sd under 11%, so 25% is > 2 sd for the smallest).
            assert float(block.std()) == pytest.approx(bound / math.sqrt(3), rel=0.05)
            counts, _ = np.histogram(block, bins=10, range=(-bound, bound))
            assert np.all(np.abs(counts / block.size - 0.1) < 0.025), counts
    # Across every element of the model: no bias towards either sign, nor between columns.
    assert abs(float(np.mean(rows > 0)) - 0.5) < 0.01
    row_bounds = np.repeat(np.sqrt(1.0 / np.asarray(SPEC.table_sizes)), SPEC.table_sizes)
    scaled = rows / row_bounds[:, None].astype(np.float32)
    assert np.all(np.abs(scaled.mean(axis=0)) < 0.05)
    # Neighbouring elements (counters c and c + 1) are uncorrelated.
    flat = scaled.reshape(-1)
    assert abs(float(np.corrcoef(flat[:-1], flat[1:])[0, 1])) < 0.03


def test_init_is_deterministic_per_seed_and_differs_across_seeds() -> None:
    gids = np.arange(0, TOTAL_ROWS, 3, dtype=np.int64)
    a = init_embedding_rows(gids, SPEC, seed=11)
    assert np.array_equal(a, init_embedding_rows(gids, SPEC, seed=11))
    b = init_embedding_rows(gids, SPEC, seed=12)
    assert np.mean(a == b) < 0.01
    assert not np.array_equal(init_embedding_rows(gids, SPEC, seed=0), a)
    # Negative and 64-bit seeds are fine and distinct.
    c = init_embedding_rows(gids, SPEC, seed=-1)
    d = init_embedding_rows(gids, SPEC, seed=2**64 - 1)
    assert np.array_equal(c, d)  # the same seed modulo 2^64
    assert np.mean(c == a) < 0.01


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
