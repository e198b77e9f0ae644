"""Stage 2 prices a change of the workers' CPU applied in place (core/planner/auto_scale.py
``resize_in_place``) below a replacement: a smaller gain carries it, its judgment asks for a
smaller gain, and the next plan may follow it sooner. Against the known throughput function
of tests/unit/test_auto_scale.py."""

from __future__ import annotations

import dataclasses
import random
import statistics

from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.planner import PlannerSettings, ScalingStep, auto_scale, context_from_spec
from dlrover_kfp.core.profile import RuntimeSample
from dlrover_kfp.core.reconcile import in_place
from dlrover_kfp.sim.workload import Truth
from tests.unit.test_auto_scale import SETTINGS, plan, spec

#: Memory kept as it is (no right-sizing, which would replace every worker), no give-back
#: probe of the idle PS, and a bar for replacements above the gain the model sees for
#: 2 x 1 -> 2 x 2 cores (+79 %) while the bar for in-place steps is below it: the same
#: decision on each side of the two prices.
PRICED = dataclasses.replace(
    SETTINGS,
    auto_scale=dataclasses.replace(
        SETTINGS.auto_scale,
        min_memory_saving=1.0,
        busy_utilization=0.0,
        min_gain=0.9,
        in_place_min_gain=0.5,
    ),
)
#: Two workers, one PS already at its 8 cores: the workers' CPU is what limits the job.
START = plan(2, 1.0, 1, 8.0)


def _samples(at: ResourcePlan, t: float = 0.0) -> list[RuntimeSample]:
    return Truth().samples(at, t, PRICED.auto_scale.min_samples, random.Random(1))


def test_a_cpu_only_step_in_place_passes_a_bar_a_replacement_does_not() -> None:
    ctx = context_from_spec(spec(16.0, max_workers=2, max_ps=1), PRICED)
    samples = _samples(START)
    now = samples[-1].time + 10
    replaced = auto_scale(ctx, START, samples, now, PRICED)
    resized = auto_scale(ctx, START, samples, now, PRICED, resize_in_place=True)
    assert replaced.plan is None, replaced.reason
    assert resized.plan is not None and resized.in_place, resized.reason
    assert in_place(START, resized.plan) and resized.plan.workers.cpu > START.workers.cpu
    # A backend that refused a resize: the caller says so, the replacement's price holds.
    again = auto_scale(ctx, START, samples, now, PRICED, resize_in_place=False)
    assert again.plan is None


def _judged(in_place_step: bool, gain: float) -> str:
    """Stage 2's verdict on a growth step that measured ``gain`` over what it left."""
    settings = PlannerSettings()
    ctx = context_from_spec(spec(16.0, max_workers=2, max_ps=1), settings)
    after = dataclasses.replace(START, workers=dataclasses.replace(START.workers, cpu=2.0))
    samples = _samples(after, 400.0)
    before = statistics.fmean(x.throughput for x in samples) / (1 + gain)
    step = ScalingStep(
        time=350.0, before=START, throughput_before=before, kind="grow", in_place=in_place_step
    )
    decision = auto_scale(ctx, after, samples, 1000.0, settings, last_step=step)
    return decision.reason


def test_an_in_place_growth_is_judged_against_the_smaller_gain() -> None:
    # +1.5 %: above half of in_place_min_gain (1 %), below half of min_gain (2.5 %).
    assert not _judged(True, 0.015).startswith("rollback")
    assert _judged(False, 0.015).startswith("rollback")


def test_the_next_plan_follows_an_in_place_step_sooner() -> None:
    s = PlannerSettings().auto_scale
    ctx = context_from_spec(spec(16.0, max_workers=2, max_ps=1), PlannerSettings())
    samples = _samples(START, 400.0)
    now = 350.0 + s.in_place_min_interval_s + 10  # long after an in-place step, not a restart
    for step_in_place, waits in ((True, False), (False, True)):
        step = ScalingStep(time=350.0, before=START, throughput_before=0.0, in_place=step_in_place)
        decision = auto_scale(ctx, START, samples, now, PlannerSettings(), last_step=step)
        assert decision.reason.startswith("waiting: last plan") is waits, decision.reason


def test_an_in_place_step_keeps_the_workers_memory_that_a_replacement_would_right_size() -> None:
    """Growth steps carry memory right-sizing along (they replace the pods anyway); a memory
    decrease cannot be applied in place, so an in-place step keeps the pods' memory rather
    than buy restarts with it. The same decision, priced as a replacement, shrinks it."""
    settings = dataclasses.replace(
        PRICED,
        auto_scale=dataclasses.replace(PRICED.auto_scale, min_memory_saving=0.01, min_gain=0.5),
    )
    ctx = context_from_spec(spec(16.0, max_workers=2, max_ps=1), settings)
    samples = _samples(START)
    now = samples[-1].time + 10
    replaced = auto_scale(ctx, START, samples, now, settings)
    resized = auto_scale(ctx, START, samples, now, settings, resize_in_place=True)
    assert replaced.plan is not None and resized.plan is not None, (replaced, resized)
    # The same CPU step on both sides ...
    assert resized.plan.workers.cpu == replaced.plan.workers.cpu > START.workers.cpu
    # ... the replacement right-sizes the pods' memory to what they use; in place keeps it.
    assert replaced.plan.workers.memory_mb < START.workers.memory_mb
    assert replaced.plan.ps.memory_mb < START.ps.memory_mb
    assert not in_place(START, replaced.plan)
    assert resized.plan.workers.memory_mb == START.workers.memory_mb
    assert resized.plan.ps == START.ps
    assert resized.in_place and in_place(START, resized.plan)
