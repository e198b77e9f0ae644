"""The simulator's hidden job truths: equations, usage bounds, memory curve, contract, speed."""

from __future__ import annotations

import itertools
import math
import time

import pytest

from dlrover_kfp.core.documents import parse, to_dict
from dlrover_kfp.core.footprint import RUNTIME_MB
from dlrover_kfp.core.observation import Config, Observation
from dlrover_kfp.core.perf_model import fit
from dlrover_kfp.errors import SpecError
from dlrover_kfp.sim.cluster.truth import (
    JobTruth,
    MemoryTruth,
    PsContentionTruth,
    RooflineTruth,
    TrainerTruth,
    closed_loop_step,
)

CONTENTION = PsContentionTruth(
    base=2e-3,
    compute=4e-5,
    worker_threads=6.0,
    ps_cost=8e-6,
    ps_threads=8.0,
    rtt=1e-3,
    fanout=3e-4,
)
ROOFLINE = RooflineTruth(
    base=1e-3,
    compute=4e-5,
    serial=0.08,
    wire=4e-6,
    ps_cost=2e-5,
    ps_threads=8.0,
    fanout=5e-4,
)
TRAINER = TrainerTruth(
    base=1e-4,
    compute=1.7e-5,
    alpha=1.05,
    serial=0.08,
    worker_threads=8.0,
    ps_work=4.8e-6,
    critical=0.3,
    ps_threads=8.0,
)
GRID = list(
    itertools.product((1, 2, 5, 16, 32), (1, 3, 8, 15), (0.5, 1.0, 4.0, 16.0), (0.5, 2.0, 8.0))
)
Truths = PsContentionTruth | RooflineTruth | TrainerTruth


@pytest.mark.parametrize("truth", [CONTENTION, ROOFLINE, TRAINER], ids=lambda t: t.family)
def test_the_ps_wait_is_consistent_with_its_utilisation(truth: Truths) -> None:
    """The PS is a closed-loop queue: at every shape, the step time is the worker's own time
    plus the critical share of one request's PS time over (1 − ρ), where ρ is the PS's own
    utilisation (the cores it uses over the cores it can keep busy), and ρ < 1."""
    batch = 512
    for w, p, lw, lp in GRID:
        x, _, ps_used = truth.evaluate(w, p, lw, lp, batch)
        step = w * batch / x
        ep = min(lp, truth.ps_threads)
        rho = ps_used / ep
        assert 0.0 <= rho < 1.0
        if isinstance(truth, TrainerTruth):
            busy = truth.ps_work * batch / (p * ep)
            wait = truth.critical * busy
            own = step - wait / (1 - rho)
        else:
            busy = wait = truth.ps_cost * batch / (p * ep)
            own = step - wait / (1 - rho)
        assert rho == pytest.approx(w * busy / step, rel=1e-9)
        assert own > 0
        assert closed_loop_step(own, wait, busy, w) == pytest.approx(step, rel=1e-9)


def test_a_lightly_loaded_ps_adds_little_wait() -> None:
    """At 20 % PS utilisation a worker waits 1.25 request times, not a whole round of all
    workers' requests (the inconsistency of the earlier form)."""
    a, s, w = 0.2, 0.001, 40
    step = closed_loop_step(a, s, s, w)
    rho = w * s / step
    assert rho == pytest.approx(0.2, abs=0.02)
    assert step - a == pytest.approx(s / (1 - rho), rel=1e-9)
    assert step - a < 2 * s


def test_roofline_step_time_solves_its_queue_equation() -> None:
    """T = A + S / (1 - w·S/T), with A and S as the docstring defines them."""
    t, batch = ROOFLINE, 512
    for w, p, lw, lp in GRID:
        x, _, _ = t.evaluate(w, p, lw, lp, batch)
        step = w * batch / x
        t_compute = t.compute * batch * (t.serial / min(1.0, lw) + (1 - t.serial) / lw)
        t_network = t.wire * batch * max(1.0, w / p)
        a = t.base + max(t_compute, t_network) + t.fanout * math.log2(p)
        s = t.ps_cost * batch / (p * min(lp, t.ps_threads))
        rho = w * s / step
        assert 0 <= rho < 1
        assert step == pytest.approx(a + s / (1 - rho), rel=1e-9)


def test_roofline_saturates_at_the_ps_capacity() -> None:
    """Many workers: the PS queue caps throughput at p·min(λp, threads) / ps_cost."""
    capacity = 2 * 4.0 / ROOFLINE.ps_cost
    x = [ROOFLINE.throughput(w, 2, 8.0, 4.0, 512) for w in (1, 4, 16, 64, 256, 4096)]
    assert x == sorted(x)
    assert x[-1] < capacity
    assert x[-1] > 0.95 * capacity


def test_roofline_is_network_bound_past_the_ps_nic_ceiling() -> None:
    """When the network dominates the step, more worker CPU buys nothing; more PS does."""
    heavy = RooflineTruth(
        base=1e-4, compute=1e-5, serial=0.05, wire=2e-5, ps_cost=1e-7, ps_threads=8, fanout=0.0
    )
    assert heavy.throughput(16, 2, 4.0, 8.0, 512) == pytest.approx(
        heavy.throughput(16, 2, 16.0, 8.0, 512), rel=1e-9
    )
    assert heavy.throughput(16, 8, 4.0, 8.0, 512) > 3 * heavy.throughput(16, 2, 4.0, 8.0, 512)


def test_roofline_worker_speedup_is_bounded_by_amdahl() -> None:
    lone = RooflineTruth(
        base=1e-9, compute=1e-4, serial=0.1, wire=1e-12, ps_cost=1e-12, ps_threads=8, fanout=0
    )
    one = lone.throughput(1, 1, 1.0, 1.0, 512)
    assert lone.throughput(1, 1, 4.0, 1.0, 512) / one == pytest.approx(1 / (0.1 + 0.9 / 4), 1e-3)
    assert lone.throughput(1, 1, 1000.0, 1.0, 512) / one < 10.0


def _worst_fit_error(truth: Truths, batch: int = 512) -> float:
    configs = [
        Config(w, p, lw, lp)
        for w, p, lw, lp in itertools.product(
            (1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 15), (1.0, 2.0, 4.0, 8.0, 16.0), (1.0, 4.0, 16.0)
        )
    ]
    observations = [
        Observation(
            config=c,
            batch_size=batch,
            throughput=truth.throughput(c.workers, c.ps, c.worker_cpu, c.ps_cpu, batch),
        )
        for c in configs
    ]
    model = fit(observations)
    return max(abs(model.throughput(o.config, batch) / o.throughput - 1) for o in observations)


def test_roofline_is_outside_the_planners_model_form() -> None:
    """The planner's own fit, given the truth everywhere, still misses the roofline badly."""
    assert _worst_fit_error(ROOFLINE) > 0.3
    assert _worst_fit_error(ROOFLINE) > _worst_fit_error(CONTENTION)


def test_throughput_is_fast_enough_for_a_million_calls() -> None:
    for truth in (CONTENTION, ROOFLINE):
        start = time.process_time()  # the CPU given, not wall time: holds on a busy machine
        for i in range(50_000):
            truth.evaluate(1 + i % 32, 1 + i % 15, 8.0, 4.0, 512)
        per_call = (time.process_time() - start) / 50_000
        assert per_call < 10e-6


MEMORY = MemoryTruth(worker_mb=2000.0, ps_start_mb=1000.0, ps_end_mb=9000.0)


def test_ps_memory_grows_with_progress_and_saturates() -> None:
    assert MEMORY.ps_total_mb(0.0) == pytest.approx(1000.0)
    assert MEMORY.ps_total_mb(1.0) == pytest.approx(9000.0)
    half = 1000.0 + 8000.0 * (1 - math.exp(-1.5)) / (1 - math.exp(-3.0))
    assert MEMORY.ps_total_mb(0.5) == pytest.approx(half)
    totals = [MEMORY.ps_total_mb(f / 20) for f in range(21)]
    steps = [b - a for a, b in itertools.pairwise(totals)]
    assert all(s > 0 for s in steps)
    assert steps == sorted(steps, reverse=True)  # concave: fast early, saturating
    assert MEMORY.ps_total_mb(-1.0) == MEMORY.ps_total_mb(0.0)
    assert MEMORY.ps_total_mb(2.0) == MEMORY.ps_total_mb(1.0)


def test_ps_memory_splits_across_ps_with_a_hot_first_shard() -> None:
    even = MEMORY
    assert even.ps_used_mb(1.0, 4) == pytest.approx(RUNTIME_MB + 9000.0 / 4)
    assert even.ps_used_mb(1.0, 1) == pytest.approx(RUNTIME_MB + 9000.0)
    hot = MemoryTruth(worker_mb=2000.0, ps_start_mb=1000.0, ps_end_mb=9000.0, imbalance=0.5)
    first = hot.ps_used_mb(1.0, 4)
    rest = hot.ps_used_mb(1.0, 4, index=2)
    assert first == pytest.approx(RUNTIME_MB + 1.5 * 9000.0 / 4)
    assert first - RUNTIME_MB + 3 * (rest - RUNTIME_MB) == pytest.approx(9000.0)
    assert hot.ps_peak_mb(4) == first
    # PS 0 never holds more than everything.
    lopsided = MemoryTruth(worker_mb=1.0, ps_start_mb=0.0, ps_end_mb=100.0, imbalance=5.0)
    assert lopsided.ps_used_mb(1.0, 2) == pytest.approx(RUNTIME_MB + 100.0)
    assert lopsided.ps_used_mb(1.0, 2, index=1) == pytest.approx(RUNTIME_MB)


def test_memory_truth_rejects_shrinking_ps() -> None:
    with pytest.raises(ValueError, match="ps_end_mb"):
        MemoryTruth(worker_mb=1.0, ps_start_mb=10.0, ps_end_mb=5.0)


@pytest.mark.parametrize(
    "throughput", [CONTENTION, ROOFLINE, TRAINER], ids=["ps-contention", "roofline", "trainer"]
)
def test_job_truth_round_trips_and_picks_the_family(throughput: Truths) -> None:
    truth = JobTruth(throughput=throughput, memory=MEMORY)
    data = to_dict(truth)
    assert data["throughput"]["family"] == throughput.family
    again = parse(JobTruth, data, "truth.json")
    assert again == truth
    assert type(again.throughput) is type(throughput)


def test_job_truth_contract_is_strict() -> None:
    data = to_dict(JobTruth(throughput=ROOFLINE, memory=MEMORY))
    data["throughput"]["serial"] = 1.5
    with pytest.raises(SpecError, match="serial"):
        parse(JobTruth, data, "truth.json")
    data = to_dict(JobTruth(throughput=ROOFLINE, memory=MEMORY))
    data["memory"]["leak_mb"] = 1.0
    with pytest.raises(SpecError, match=r"memory\.leak_mb: unknown key"):
        parse(JobTruth, data, "truth.json")
    data = to_dict(JobTruth(throughput=CONTENTION, memory=MEMORY))
    data["throughput"]["compute"] = "4e-5"
    with pytest.raises(SpecError, match="compute"):
        parse(JobTruth, data, "truth.json")
