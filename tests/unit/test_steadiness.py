"""The steadiness rules (core/planner/steadiness.py): no step too late to repay its measured
price, no shape re-entered within its hold unless the measurements contradict the move that
left it. Issue 30's two live cases are replayed: a scale-out after the only worker held the
last shards, and one PS moved between 0.25 and 0.5 cores five times."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dlrover_kfp.core.observation import Config
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.planner import PlannerSettings, ScalingStep
from dlrover_kfp.core.planner.steadiness import (
    Move,
    Proposal,
    break_even_s,
    held,
    hold_s,
    refusal,
    step_cost_s,
    too_late,
    transition_lost_s,
)
from dlrover_kfp.core.profile import RuntimeSample
from dlrover_kfp.core.shards import ShardLedger
from dlrover_kfp.core.usage import settled

SETTINGS = PlannerSettings()
LOW = Config(1, 1, 1.0, 0.25)  # the PS at a quarter core ...
HIGH = Config(1, 1, 1.0, 0.5)  # ... and at half a core


def _sample(t: float, c: Config, rate: float) -> RuntimeSample:
    return RuntimeSample(
        time=t,
        global_step=int(t),
        throughput=rate,
        workers=c.workers,
        ps=c.ps,
        worker_cpu=c.worker_cpu,
        ps_cpu=c.ps_cpu,
    )


def _plan(c: Config) -> ResourcePlan:
    return ResourcePlan(
        workers=NodeGroup(count=c.workers, cpu=c.worker_cpu, memory_mb=1024),
        ps=NodeGroup(count=c.ps, cpu=c.ps_cpu, memory_mb=1024),
        stage=Stage.AUTO_SCALE,
        reason="test",
    )


def _move(
    t: float, before: Config, after: Config, rate: float, *, promised: float | None = None
) -> Move:
    grew = after.total_cpu > before.total_cpu
    step = ScalingStep(
        time=t,
        before=_plan(before),
        throughput_before=rate,
        kind="grow" if grew else "give_back",
        expected=promised,
    )
    return Move(step=step, before=before, after=after)


def _proposal(before: Config, after: Config, now: float, new: float | None) -> Proposal:
    return Proposal(
        before=before,
        after=after,
        rate_now=now,
        rate_new=new,
        share_now=before.total_cpu / 4,
        share_new=after.total_cpu / 4,
    )


# -- too late ------------------------------------------------------------------------------


def test_break_even_is_the_cost_plus_its_payback() -> None:
    """X0 = 100, X1 = 200 samples/s, c = 10 s: the step repays once the rest takes over
    c / (1 - X0/X1) = 20 s (10 s of cost, 10 s at the doubled rate to earn it back)."""
    assert break_even_s(10.0, 0.5) == pytest.approx(20.0)
    assert break_even_s(10.0, 1.0) == math.inf  # a step that buys nothing never repays
    grow = _proposal(LOW, HIGH, 100.0, 200.0)
    assert too_late(grow, rows_to_lease=1_900, cost_s=10.0) is not None  # 19 s left
    assert too_late(grow, rows_to_lease=2_100, cost_s=10.0) is None  # 21 s left


def test_a_scale_out_once_every_shard_is_leased_is_refused() -> None:
    """Issue 30: at 91%, the only worker holding the last shards, a scale-out was taken: the new
    worker could take no shard. Leased rows are trained at the old pace whatever the step does;
    with none left to lease no price is repaid."""
    ledger = ShardLedger(ranges=((0, 0, 1000), (0, 1000, 2000)), epochs=1)
    assert ledger.rows_to_lease == 2000
    ledger.lease("worker-0", 0.0)
    ledger.lease("worker-0", 0.0)
    assert ledger.rows_to_lease == 0
    scale_out = _proposal(Config(1, 1, 1.0, 0.5), Config(2, 1, 1.0, 0.5), 150_000.0, 280_000.0)
    why = too_late(scale_out, ledger.rows_to_lease, cost_s=0.5)
    assert why is not None and why.startswith("too late: 0 rows left to lease")
    # Two epochs: the second epoch's rows are all still to lease.
    assert ShardLedger(ranges=((0, 0, 1000),), epochs=2).rows_to_lease == 2000


def test_a_give_back_is_priced_in_quota_seconds() -> None:
    """A step that adds no CPU is for the quota: ρ = (S1/X1)/(S0/X0). Halving the PS CPU
    (1.5 -> 1.25 of 4 cores) at the same rate: ρ = 5/6, break-even 6 c."""
    give_back = _proposal(HIGH, LOW, 100.0, 100.0)
    assert too_late(give_back, rows_to_lease=500, cost_s=1.0) is not None  # 5 s < 6 s
    assert too_late(give_back, rows_to_lease=700, cost_s=1.0) is None  # 7 s > 6 s
    assert too_late(dataclasses.replace(give_back, rate_new=None), 0, 1.0) is None  # unjudged


def test_a_step_s_price_is_the_training_it_lost_measured() -> None:
    """1 s lost applying it, then a sample at half the rate over 2 s (1 s more) and the new
    shape's partial first sample at 0 over 2 s (2 s more); the next one is settled."""
    move = dataclasses.replace(_move(10.0, LOW, HIGH, 100.0), apply_lost_s=1.0)
    samples = [
        _sample(8.0, LOW, 100.0),
        _sample(12.0, LOW, 50.0),
        _sample(14.0, HIGH, 0.0),
        _sample(16.0, HIGH, 80.0),
    ]
    assert transition_lost_s(move, samples) is None  # the transition is not over
    samples.append(_sample(18.0, HIGH, 120.0))
    assert transition_lost_s(move, samples) == pytest.approx(1.0 + 1.0 + 2.0 + 0.4)
    assert step_cost_s([move], samples, in_place=False) == pytest.approx(4.4)
    # Before any move of its kind: the job's own start-up for one that starts pods, 0 in place.
    assert step_cost_s([], samples, in_place=False) == 8.0  # its first sample with progress
    assert step_cost_s([move], samples, in_place=True) == 0.0


# -- held ------------------------------------------------------------------------------------


def _flip(
    rate_low: float, rate_high: float, rate_back: float
) -> tuple[list[Move], list[RuntimeSample]]:
    """The issue's flip-flop up to its second move: the PS hot at 0.25 core moved to 0.5 at
    10 s (Stage 3), given back to 0.25 at 30 s (Stage 2, promising the rate it had), with
    steady samples at each shape."""
    samples = [_sample(float(t), LOW, rate_low) for t in range(2, 11, 2)]
    samples += [_sample(float(t), HIGH, rate_high) for t in range(12, 31, 2)]
    samples += [_sample(float(t), LOW, rate_back) for t in range(32, 51, 2)]
    moves = [
        _move(10.0, LOW, HIGH, rate_low),
        _move(30.0, HIGH, LOW, rate_high, promised=rate_high),
    ]
    return moves, samples


def test_a_move_that_bought_nothing_may_be_undone_at_once() -> None:
    """The hot-PS move measured no gain (1,000 -> 1,000 samples/s, below min_gain / 2): the
    measurement contradicts it, and giving the core back is a rollback, not a flip-flop."""
    moves, samples = _flip(1000.0, 1000.0, 1000.0)
    back = _proposal(HIGH, LOW, 1000.0, 1000.0)
    assert held(back, moves[:1], samples[:15], 30.0, 600.0, SETTINGS) is None


def test_a_move_that_paid_holds_its_shape() -> None:
    moves, samples = _flip(1000.0, 1200.0, 1000.0)
    back = _proposal(HIGH, LOW, 1200.0, 1200.0)
    why = held(back, moves[:1], samples[:15], 30.0, 600.0, SETTINGS)
    assert why is not None and "re-enters 1 PS x 0.25cpu, left at 10s" in why


def test_the_ps_flip_flop_stops_after_one_round_trip() -> None:
    """Replayed: 0.25 -> 0.5 (hot PS, no gain) -> 0.25 (a give-back that kept its promise) ->
    0.5 again is refused for the hold; after it, or when the give-back measured a loss beyond
    the noise band (5%), it is allowed."""
    moves, samples = _flip(1000.0, 1000.0, 990.0)
    again = _proposal(LOW, HIGH, 990.0, 1980.0)
    why = held(again, moves, samples, 50.0, 40.0, SETTINGS)
    assert why is not None and "until 70s" in why
    assert held(again, moves, samples, 70.0, 40.0, SETTINGS) is None
    moves, samples = _flip(1000.0, 1000.0, 900.0)  # the give-back lost 10%: contradicted
    assert held(again, moves, samples, 50.0, 40.0, SETTINGS) is None


def test_an_unmeasured_move_contradicts_nothing() -> None:
    moves, samples = _flip(1000.0, 1000.0, 1000.0)
    again = _proposal(LOW, HIGH, 1000.0, 2000.0)
    assert held(again, moves, samples[:15], 31.0, 40.0, SETTINGS) is not None


def test_the_hold_bounds_a_flip_flop_s_share_of_the_job() -> None:
    """h = max(min_interval_s, 2c / flip_flop_share): 2 s steps are held 40 s, 3-min ones an
    hour; never under one planning interval."""
    assert hold_s(2.0, SETTINGS) == pytest.approx(300.0)  # the cluster's 300 s interval
    local = dataclasses.replace(
        SETTINGS, auto_scale=dataclasses.replace(SETTINGS.auto_scale, min_interval_s=10.0)
    )
    assert hold_s(2.0, local) == pytest.approx(40.0)
    assert hold_s(180.0, SETTINGS) == pytest.approx(3600.0)
    assert hold_s(0.0, local) == pytest.approx(10.0)


def test_refusal_prices_the_hold_by_the_measured_cost() -> None:
    """The moves' transitions cost nothing measurable (the rate held through them): the
    hold is one planning interval, the cluster's 300 s."""
    moves, samples = _flip(1000.0, 1000.0, 990.0)
    again = _proposal(LOW, HIGH, 990.0, 1980.0)
    why = refusal(again, moves, samples, 50.0, 10**9, SETTINGS)
    assert why is not None and why.startswith("held:")
    assert refusal(again, moves, samples, 331.0, 10**9, SETTINGS) is None


def _at(t: float, x: float) -> RuntimeSample:
    return RuntimeSample(
        time=t, global_step=0, throughput=x, workers=3, ps=1, worker_cpu=0.25, ps_cpu=0.25
    )


@pytest.mark.parametrize(
    ("rates", "steady"),
    [
        # a start: start-up, the partial first report, then the shape's speed
        ([0, 0, 8e3, 9e4, 1e5], [9e4, 1e5]),
        # an in-place change: progress throughout, the first sample partial
        ([5e4, 9e4, 1e5], [9e4, 1e5]),
        # a replaced pod's last report lands after the change, then the new pods start
        ([3e4, 0, 0, 0, 0, 0, 0], []),
        ([3e4, 0, 0, 0, 8e3, 9e4, 1e5], [9e4, 1e5]),
        # a pause after the shape reported twice in a row is its own
        ([0, 8e3, 9e4, 1e5, 0, 0], [9e4, 1e5, 0, 0]),
        ([0, 0, 0], []),
    ],
)
def test_settled_samples_leave_out_start_up_and_a_replaced_pods_last_report(
    rates: list[float], steady: list[float]
) -> None:
    samples = [_at(float(i), x) for i, x in enumerate(rates)]
    assert [x.throughput for x in settled(samples)] == steady
