"""Two rules against steps a running job inflicts on itself: too late to repay, and flip-flops.

observe (the runtime's samples and the moves it applied) -> decide (this module, pure) -> apply
(the runtime drops a refused step and says why). Stage 2 and Stage 3 each judge the job's shape
as it is now; neither knows what a step will cost the job in the time it has left, nor that the
other just undid its last move. Both facts live here, measured from the job's own samples:

1. **Too late.** A step that costs the job ``c`` seconds of training (its measured price, below)
   and then makes each remaining sample cost ``ρ`` of what it costs now repays only when the
   work left to hand out takes longer than its break-even (derivation at :func:`break_even_s`):

       R = rows not yet leased / X0               (X0: samples/s measured now)
       refuse when  R <= c / (1 - ρ)  =  c + c·ρ/(1 - ρ)      (cost + payback)

   For a step that adds CPU the price is time: ``ρ = X0 / X1`` (X1: the rate the step is
   predicted to reach). For one that does not (a give-back, a memory step, a rollback to a
   cheaper shape) it is quota: ``ρ = (S1 / X1) / (S0 / X0)``, S the dominant share of the
   quota held, i.e. quota-seconds per sample after over before. Rows already leased are
   trained by their holders at the old pace whatever the step does, so only the rows still to
   lease count: a worker added once every shard is out (issue 30: a scale-out at 91%, after
   the only worker held the last shards, raised JCT from ~21 s to 48.6 s) can buy nothing.

2. **Held.** A role's shape (its pod count and CPU per pod) that the job moved away from is not
   re-entered within the hold time ``h`` of leaving it, unless the measurements contradict the
   move that left it. "Contradict" is Stage 2's own judgement of a step
   (:func:`~dlrover_kfp.core.planner.auto_scale.judge_step`) applied to that move with the
   rate measured after it (the settled samples at the new shape, the last ``min_samples``):
   a move that added CPU is contradicted when it measured less than ``min_gain / 2`` more
   throughput than before it (``in_place_min_gain / 2`` in place); one that did not, when it
   measured more than ``give_back_tolerance`` (5 %, above the noise of a 5-sample mean) below
   the lower of its promise and the rate before it. A move not yet measured contradicts
   nothing. So a hot-PS move that bought nothing may be given back at once (a rollback), and a
   give-back that kept its promise holds its ground against the hot-PS rule that would undo it
   (issue 30: one PS moved between 0.25 and 0.5 cores five times)::

       h = max(min_interval_s, 2 · c / flip_flop_share)

   A flip-flop A -> B -> A is two steps of cost ``c``; with every left shape held for ``h`` it
   recurs at most once per ``h``, so it costs at most ``2c / h = flip_flop_share`` of the
   job's time (10 %). The hold scales with what a step costs this job: an hour for a step of
   ~3 min (a cluster's relaunch), 40 s for one of 2 s; never shorter than one planning
   interval, below which it would hold nothing.

**A step's price ``c``** (:func:`step_cost_s`) is measured: the seconds of training the job
lost, against the rate before it, from the decision until the new shape's first settled sample
(the loop's time applying it, measured by the runtime, plus the samples of the transition)::

       lost = apply_lost + Σ_i dt_i · max(0, 1 - X_i / X0)

the mean over the job's earlier moves of the same kind (in place, or starting pods). Before the
job has made one, a step that starts pods is priced at the job's own start-up (the time to its
first sample with progress: what starting its pods cost it), an in-place resize at nothing
(nothing restarts).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from dlrover_kfp.core.observation import Config
from dlrover_kfp.core.planner.auto_scale import ScalingStep, describe, judge_step
from dlrover_kfp.core.planner.settings import PlannerSettings
from dlrover_kfp.core.profile import RuntimeSample
from dlrover_kfp.core.usage import config_of, settled


@dataclass(frozen=True, slots=True)
class Move:
    """A change of the job's shape the runtime applied (Stage 2's, or a Stage-3 PS move)."""

    #: what it was, judged as Stage 2 judges its steps: its time (seconds since the start, when
    #: the new shape was in place), the rate before it, its kind and promise, in place or not
    step: ScalingStep
    before: Config
    after: Config
    #: seconds of training lost while the runtime applied it (measured:
    #: ``elapsed - samples trained meanwhile / rate before``)
    apply_lost_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Proposal:
    """A step a stage proposes: the shapes, the rates (measured now, predicted after: None
    where the stage predicts none), the dominant shares of the quota held before and after,
    and whether it is applied in place."""

    before: Config
    after: Config
    rate_now: float
    rate_new: float | None
    share_now: float
    share_new: float
    in_place: bool = False


def remaining_s(rows_to_lease: int, rate: float) -> float:
    """Seconds the rows not yet leased take at ``rate`` samples/s: R = rows / X0 (inf when no
    rate is measured: nothing can be judged late)."""
    return rows_to_lease / rate if rate > 0 else math.inf


def break_even_s(cost_s: float, rho: float) -> float:
    """The least remaining time ``R`` in which a step of price ``cost_s`` repays.

    Without the step the rest costs ``R`` (in its unit: seconds, or quota-seconds per S0);
    with it, ``c`` then ``ρ·R``. It repays when c + ρ·R < R, i.e. R > c / (1 - ρ): the cost
    itself plus the payback ``c·ρ / (1 - ρ)``, the time the step's gain takes to earn its cost
    back (for time: c · X0 / (X1 - X0)). A step that saves nothing per sample (ρ >= 1) never
    repays: inf."""
    return cost_s / (1 - rho) if rho < 1 else math.inf


def price_ratio(p: Proposal) -> float | None:
    """ρ of :func:`break_even_s`: what one remaining sample costs after the step, as a share of
    now. Time for a step that adds CPU (X0 / X1), quota-seconds for one that does not
    ((S1/X1) / (S0/X0)); None when the step has no predicted rate or nothing is measured."""
    if p.rate_new is None or p.rate_new <= 0 or p.rate_now <= 0:
        return None
    if p.after.total_cpu > p.before.total_cpu + 1e-9:
        return p.rate_now / p.rate_new
    if p.share_now <= 0:
        return None
    return (p.share_new / p.rate_new) / (p.share_now / p.rate_now)


def too_late(p: Proposal, rows_to_lease: int, cost_s: float) -> str | None:
    """Why ``p`` cannot repay its price in the work left (rule 1), or None."""
    rho = price_ratio(p)
    if rho is None:
        return None
    left = remaining_s(rows_to_lease, p.rate_now)
    need = break_even_s(cost_s, rho)
    if left > need:
        return None
    unit = "time" if p.after.total_cpu > p.before.total_cpu + 1e-9 else "quota"
    return (
        f"too late: {rows_to_lease:,} rows left to lease take {left:.1f}s at "
        f"{p.rate_now:,.0f} samples/s; the step costs {cost_s:.1f}s and needs "
        f"{need:.1f}s to repay it ({unit} per sample x{rho:.2f})"
    )


def transition_lost_s(move: Move, samples: Sequence[RuntimeSample]) -> float | None:
    """Seconds of training ``move`` cost, measured (module docstring); None until the new
    shape's first settled sample (its second with progress: the first is partial)."""
    rate = move.step.throughput_before
    if rate <= 0:
        return None
    lost, prev, progressed = move.apply_lost_s, move.step.time, 0
    for x in samples:
        if x.time <= move.step.time:
            continue
        if config_of(x) == move.after and x.throughput > 0:
            progressed += 1
            if progressed == 2:
                return lost
        lost += (x.time - prev) * max(0.0, 1 - x.throughput / rate)
        prev = x.time
    return None


def start_up_s(samples: Sequence[RuntimeSample]) -> float:
    """Seconds from the job's start to its first sample with progress: what starting its pods
    cost it (0 before it has one)."""
    return next((x.time for x in samples if x.throughput > 0), 0.0)


def step_cost_s(
    moves: Sequence[Move], samples: Sequence[RuntimeSample], *, in_place: bool
) -> float:
    """The price ``c`` of a step (module docstring): the mean measured over the job's earlier
    moves of the same kind, else the job's start-up for one that starts pods, 0 in place."""
    measured = [
        lost
        for m in moves
        if m.step.in_place == in_place and (lost := transition_lost_s(m, samples)) is not None
    ]
    if measured:
        return statistics.fmean(measured)
    return 0.0 if in_place else start_up_s(samples)


def hold_s(cost_s: float, settings: PlannerSettings) -> float:
    """h = max(min_interval_s, 2 · c / flip_flop_share) (module docstring)."""
    return max(settings.auto_scale.min_interval_s, 2 * cost_s / settings.steady.flip_flop_share)


def settled_rate(
    move: Move, samples: Sequence[RuntimeSample], until: float, settings: PlannerSettings
) -> float | None:
    """Samples/s measured at ``move``'s new shape before ``until`` (the next move): the mean of
    its last ``min_samples`` settled samples (:func:`~dlrover_kfp.core.usage.settled`);
    None when it has none."""
    at = [x for x in samples if move.step.time < x.time <= until and config_of(x) == move.after]
    steady = settled(at)[-settings.auto_scale.min_samples :]
    if not steady:
        return None
    return statistics.fmean(x.throughput for x in steady)


def _shape(c: Config, role: str) -> tuple[int, float]:
    return (c.workers, c.worker_cpu) if role == "worker" else (c.ps, c.ps_cpu)


def held(
    p: Proposal,
    moves: Sequence[Move],
    samples: Sequence[RuntimeSample],
    now: float,
    hold: float,
    settings: PlannerSettings,
) -> str | None:
    """Why ``p`` would re-enter a shape the job left less than ``hold`` seconds ago without a
    measurement contradicting the move that left it (rule 2), or None."""
    for role, role_name in (("worker", "workers"), ("ps", "PS")):
        want = _shape(p.after, role)
        if want == _shape(p.before, role):
            continue
        k = next(
            (
                k
                for k in range(len(moves) - 1, -1, -1)
                if _shape(moves[k].before, role) == want and _shape(moves[k].after, role) != want
            ),
            None,
        )
        if k is None or now - moves[k].step.time >= hold:
            continue
        left = moves[k]
        until = moves[k + 1].step.time if k + 1 < len(moves) else math.inf
        measured = settled_rate(left, samples, until, settings)
        if measured is not None and judge_step(left.step, measured, settings.auto_scale):
            continue  # the measurement contradicts the move: going back is a rollback
        after = "not measured" if measured is None else f"{measured:,.0f} samples/s"
        return (
            f"held: {describe(p.after)} re-enters {want[0]} {role_name} x {want[1]:g}cpu, left at "
            f"{left.step.time:.0f}s ({left.step.throughput_before:,.0f} samples/s before, "
            f"{after} after, which does not contradict that move); held {hold:.0f}s, "
            f"until {left.step.time + hold:.0f}s"
        )
    return None


def refusal(
    p: Proposal,
    moves: Sequence[Move],
    samples: Sequence[RuntimeSample],
    now: float,
    rows_to_lease: int,
    settings: PlannerSettings,
) -> str | None:
    """Why the runtime must not take ``p`` now (held, or too late to repay), or None: the one
    call Stage 2's and Stage 3's steps go through."""
    cost = step_cost_s(moves, samples, in_place=p.in_place)
    return held(p, moves, samples, now, hold_s(cost, settings), settings) or too_late(
        p, rows_to_lease, cost
    )


__all__ = [
    "Move",
    "Proposal",
    "break_even_s",
    "held",
    "hold_s",
    "price_ratio",
    "refusal",
    "remaining_s",
    "settled_rate",
    "start_up_s",
    "step_cost_s",
    "too_late",
    "transition_lost_s",
]
