"""Stage 2: auto-scaling a running job from its own samples and a fitted model.

observe (samples) -> decide (this module, pure) -> apply (the runtime). Each decision:

1. waits until the last change has had ``min_interval_s`` (``in_place_min_interval_s`` after
   an in-place resize: nothing restarted) and the current configuration has ``min_samples``
   samples, so that a plan is judged on steady-state throughput;
2. rolls the last change back if it did not deliver: a step that raised the job's cost must
   measure at least ``min_gain / 2`` more throughput; a step that lowered it (a give-back, a
   probe) may measure at most ``give_back_tolerance`` below what it promised;
3. fits the resource-performance model on every configuration seen so far;
4. searches for the target by the planner's objective (search.py: the most throughput per
   unit of cost above ``throughput_floor`` of the best, or the cheapest nearly-best), never
   giving a pod less CPU than it uses, for growth only within a trust region
   (``max_job_cpu_growth`` times the most CPU the job was measured with), and never back to
   a configuration the job abandoned (usage.abandoned_configs: no thrashing);
5. grows if that promises ``min_gain`` more throughput (``in_place_min_gain`` when the step
   only resizes the workers' CPU in place: it pays no restart and no re-read); gives back if it
   saves
   ``min_saving`` of the cost within the objective's loss bound;
6. otherwise, if a role leaves CPU idle and has never been measured with less, probes: cuts
   that role's CPU per pod (to ``probe_factor`` of it, not below mean use x 1.25) and lets the
   next measurement judge. Averages of CPU use cannot tell whether fewer cores suffice
   (bursts), a measurement can; and once measured the model knows the slope there;
7. otherwise, if the pods' measured memory shows a much smaller need (the workers' peak, the
   PS' growth measured to have stopped), right-sizes memory alone (see :func:`memory_needs`;
   growth and give-back steps carry it along, and never take the PS below their measured
   growth's end-of-job need);
8. otherwise keeps the plan: a stable optimum yields no change (no thrashing).

Growth moves by bounded steps; giving back is taken whole (rollback bounds its risk).
Predicted gains are ratios of the model at two configurations applied to the measured
throughput, so the model's bias at the current point cancels; between two configurations the
job has measured, the ratio of the measurements.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from dlrover_kfp.core.footprint import RUNTIME_MB
from dlrover_kfp.core.observation import Config, Observation
from dlrover_kfp.core.perf_model import PRIOR, PerfModel, fit
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.planner.context import PlanningContext, clamp_worker_memory
from dlrover_kfp.core.planner.memory_growth import ps_growth
from dlrover_kfp.core.planner.quota import OVER_QUOTA, fit_to_quota
from dlrover_kfp.core.planner.search import (
    Correction,
    CpuBounds,
    InfeasiblePlanError,
    MemoryNeeds,
    search,
)
from dlrover_kfp.core.planner.settings import (
    AutoScaleSettings,
    MemoryGrowthSettings,
    PlannerSettings,
)
from dlrover_kfp.core.profile import RuntimeSample
from dlrover_kfp.core.reconcile import in_place
from dlrover_kfp.core.usage import (
    abandoned_configs,
    capped_observations,
    config_of,
    cores_per_sample,
    cpu_saturation,
    failed_moves,
    observations_from_samples,
    peak_memory_mb,
)

#: "memory": memory right-sized alone, CPU unchanged. Memory does not set the speed, so such a
#: step is not judged by throughput (noise would undo it); Stage 3 answers an OOM.
StepKind = Literal["grow", "give_back", "rollback", "memory"]
#: What :func:`memory_needs` did to the pods' memory: kept it, raised the PS to their measured
#: growth's end-of-job need, or gave memory back.
MemoryChange = Literal["keep", "raise", "give_back"]


@dataclass(frozen=True, slots=True)
class ScalingStep:
    """The last change auto-scaling made, kept by the caller so that it can be judged."""

    time: float  # seconds since job start when the new plan was applied
    before: ResourcePlan
    throughput_before: float  # measured samples/s at ``before``
    kind: StepKind = "grow"
    #: samples/s the step was predicted to reach (the plan's ``predicted_throughput``)
    expected: float | None = None
    #: applied in place (the workers resized, nothing restarted): judged and followed at an
    #: in-place step's cost (``in_place_min_gain``, ``in_place_min_interval_s``)
    in_place: bool = False


def throughput_before(samples: Sequence[RuntimeSample], settings: PlannerSettings) -> float:
    """What a step is judged against (:attr:`ScalingStep.throughput_before`): the mean samples/s
    of the last ``min_samples`` samples, the window the decision was made on; 0 without any.
    The one rule for every caller that applies a Stage-2 plan (the job master, the simulators).
    """
    recent = samples[-settings.auto_scale.min_samples :]
    return statistics.fmean(x.throughput for x in recent) if recent else 0.0


@dataclass(frozen=True, slots=True)
class AutoScaleDecision:
    """``plan`` is None when the current plan should stand; ``reason`` says why either way.
    ``kind`` tells the caller how to record the step (see :class:`ScalingStep`); ``in_place``
    whether it was priced as an in-place resize (the caller records whether it was one)."""

    plan: ResourcePlan | None
    reason: str
    model: PerfModel | None = None
    kind: StepKind = "grow"
    in_place: bool = False


def plan_config(plan: ResourcePlan) -> Config:
    return Config(plan.workers.count, plan.ps.count, plan.workers.cpu, plan.ps.cpu)


def describe(c: Config) -> str:
    return f"{c.workers}w x {c.worker_cpu:g}cpu + {c.ps}ps x {c.ps_cpu:g}cpu"


def trust_region(cur: Config, measured_cpu: float, s: AutoScaleSettings) -> tuple[Config, float]:
    """How far one step may grow (per role, and the job's CPU in all); reductions are free.

    The model is fitted on what was measured; far beyond it, it is a guess, and a wrong guess
    costs a relaunch of every pod. Searching within the region (rather than clamping a step
    toward a far target, dimension by dimension) keeps every step one the model rates best
    among those it can vouch for.
    """
    upper = Config(
        cur.workers + s.max_worker_step,
        cur.ps + s.max_ps_step,
        cur.worker_cpu * s.max_cpu_growth,
        cur.ps_cpu * s.max_cpu_growth,
    )
    return upper, s.max_job_cpu_growth * max(measured_cpu, cur.total_cpu)


def _probe(
    cur: Config, observations: Sequence[Observation], s: AutoScaleSettings, step: float
) -> tuple[Config, str] | None:
    """A give-back probe for the first role that idles and was never measured with less CPU."""
    now = next((o for o in reversed(observations) if o.config == cur), None)
    if now is None:
        return None
    for role in ("worker", "ps"):
        given = cur.worker_cpu if role == "worker" else cur.ps_cpu
        used = now.worker_cpu_used if role == "worker" else now.ps_cpu_used
        if used is None or used >= s.busy_utilization * given:
            continue
        lower_seen = any(
            (o.config.worker_cpu if role == "worker" else o.config.ps_cpu) < given
            for o in observations
        )
        if lower_seen:
            continue
        floor = math.ceil(used * (1 + s.idle_headroom) / step - 1e-9) * step
        cut = max(floor, math.ceil(given * s.probe_factor / step - 1e-9) * step, step)
        if cut >= given:
            continue
        probe = (
            Config(cur.workers, cur.ps, cut, cur.ps_cpu)
            if role == "worker"
            else Config(cur.workers, cur.ps, cur.worker_cpu, cut)
        )
        return probe, f"{role}s use {used:.2g} of {given:g} cores: probe {cut:g}"
    return None


def samples_needed(
    samples: Sequence[RuntimeSample],
    at_current: Sequence[RuntimeSample],
    cur: Config,
    s: AutoScaleSettings,
) -> int:
    """Samples at the current plan before a decision: ``min_samples``, except while the job
    still runs the plan it started with, which nothing here measured (the user's request, or
    history's guess). That plan is left as soon as the samples' mean can tell a step of
    ``min_gain`` from noise:

        n >= max(2, (z · cv / min_gain)²),   cv = stdev / mean of the samples at the plan

    (the mean's standard error cv/√n at most min_gain / z). Start-up samples, slow or idle,
    raise cv and so hold the decision back on their own. z = inf: min_samples throughout.
    """
    started = any(config_of(x) != cur for x in samples if x.workers > 0 and x.ps > 0)
    rates = [x.throughput for x in at_current]
    if started or math.isinf(s.leave_start_z) or len(rates) < 2 or statistics.fmean(rates) <= 0:
        return s.min_samples
    cv = statistics.stdev(rates) / statistics.fmean(rates)
    return min(s.min_samples, max(2, math.ceil((s.leave_start_z * cv / s.min_gain) ** 2)))


def judge_step(step: ScalingStep, measured: float, s: AutoScaleSettings) -> str | None:
    """Why the last step should be undone, or None if it stands.

    A growth step must pay: it must measure at least ``min_gain / 2`` more throughput (else it
    holds resources for nothing; ``in_place_min_gain / 2`` for an in-place one, which cost
    nothing else). A give-back step must keep what it promised, the lower of its prediction
    and the throughput before it, within ``give_back_tolerance``. A memory
    step is not judged by small changes (memory does not set the speed, and noise would undo
    it) but is undone when throughput falls ``rollback_drop`` after it: a pod squeezed into
    swapping or collector thrash. A rollback is never undone: it returned to a configuration
    already measured, and the one it left is abandoned (undoing it would flip-flop). A step
    taken with nothing measured before it (a restarted job's first) has no baseline: it stands.

    The judged drop, for every kind but a rollback: ``measured / throughput_before - 1``.
    The runtime's hold rule (core/planner/steadiness.py) asks the same question of any move
    that left a shape: a move this undoes is one the measurements contradict.
    """
    if step.throughput_before <= 0 or step.kind == "rollback":
        return None
    change = measured / step.throughput_before - 1
    if step.kind == "grow" and change < _min_gain(s, step.in_place) / 2:
        return f"the last growth step measured {change:+.1%}, not the gain it was for"
    promised = step.throughput_before
    if step.expected is not None and step.expected > 0:
        promised = min(promised, step.expected)
    if step.kind == "give_back" and measured < (1 - s.give_back_tolerance) * promised:
        return (
            f"giving back measured {measured / promised - 1:+.0%} against the "
            f"{promised:.0f} samples/s it promised"
        )
    if step.kind == "memory" and change < -s.rollback_drop:
        return f"throughput fell {-change:.0%} after the memory change"
    return None


def _min_gain(s: AutoScaleSettings, in_place: bool) -> float:
    """The gain a growth step must promise: less for one applied in place (its settings)."""
    return s.in_place_min_gain if in_place else s.min_gain


def _min_interval_s(s: AutoScaleSettings, last_step: ScalingStep) -> float:
    """Seconds from ``last_step`` to the next plan: shorter after an in-place one."""
    if last_step.in_place:
        return min(s.min_interval_s, s.in_place_min_interval_s)
    return s.min_interval_s


def auto_scale(
    ctx: PlanningContext,
    current: ResourcePlan,
    samples: Sequence[RuntimeSample],
    now: float,
    settings: PlannerSettings,
    *,
    last_step: ScalingStep | None = None,
    prior: PerfModel = PRIOR,
    known: Sequence[Observation] = (),
    resize_in_place: bool = False,
) -> AutoScaleDecision:
    """One Stage-2 decision (see the module docstring). ``known`` holds observations of
    similar finished jobs (from the history): measured points the model and the probes can
    use, so that a recurring job does not re-learn what its earlier runs measured.

    ``resize_in_place``: the caller applies a change of the workers' CPU in place (its backend
    resizes running pods). Such a step (core/reconcile.py ``in_place``) costs no restart and
    no data re-read, so it needs only ``in_place_min_gain`` and is followed after
    ``in_place_min_interval_s`` (the settings say why). The job master passes what it has
    learned: True until the backend refuses a resize, then False for the rest of the run,
    every CPU change priced as the replacement it will be. The simulator, whose pods are
    replaced, leaves it False."""
    s = settings.auto_scale
    cur = plan_config(current)
    since = last_step.time if last_step is not None else 0.0
    if last_step is not None and now - last_step.time < _min_interval_s(s, last_step):
        return AutoScaleDecision(None, f"waiting: last plan {now - last_step.time:.0f}s ago")
    at_current = [x for x in samples if x.time >= since and config_of(x) == cur]
    needed = samples_needed(samples, at_current, cur, s)
    if len(at_current) < needed:
        return AutoScaleDecision(
            None, f"waiting: {len(at_current)}/{needed} samples at the current plan"
        )
    measured = statistics.fmean(x.throughput for x in at_current[-s.min_samples :])
    memory, memory_change = memory_needs(ctx, current, samples, s, settings.memory_growth)

    if last_step is not None:
        verdict = judge_step(last_step, measured, s)
        if verdict is not None:
            back = last_step.before
            # Back to the old shape, not to PS memory below what their growth now needs.
            back_ps = dataclasses.replace(
                back.ps, memory_mb=max(back.ps.memory_mb, memory.ps_mb(back.ps.count))
            )
            # The raise may not fit beside the old shape's workers: they make room, as for
            # any growth (quota.fit_to_quota keeps the PS); where even that is over, stay.
            fitted = fit_to_quota(back.workers, back_ps, ctx, drop_ps=False, max_trim=0.0)
            if not fitted.fits:
                return AutoScaleDecision(
                    None,
                    f"stable: {OVER_QUOTA}: no rollback to {describe(plan_config(back))} "
                    f"fits the PS' {back_ps.memory_mb} MiB ({verdict})",
                )
            return AutoScaleDecision(
                ResourcePlan(
                    workers=fitted.workers,
                    ps=fitted.ps,
                    stage=Stage.AUTO_SCALE,
                    reason=f"rollback: {verdict} ({last_step.throughput_before:.0f} -> "
                    f"{measured:.0f} samples/s)",
                    predicted_throughput=round(last_step.throughput_before, 1),
                ),
                "rollback",
                kind="rollback",
                in_place=resize_in_place and in_place(current, back),
            )

    own_observations = observations_from_samples(samples, ctx.batch_size)
    better = _measured_better(ctx, current, own_observations, measured, memory, samples, s)
    if better is not None and better.plan is not None:
        return dataclasses.replace(
            better, in_place=resize_in_place and in_place(current, better.plan)
        )
    observations = (*known, *own_observations)
    worker_cap, ps_cap = cpu_saturation(observations, s.min_gain / 2)
    model = fit(
        capped_observations(observations, worker_cap, ps_cap), prior, settings=settings.model_fit
    )
    bounds = CpuBounds(
        worker_cap=worker_cap,
        ps_cap=ps_cap,
        worker_cores_per_sample=cores_per_sample(observations, "worker"),
        ps_cores_per_sample=cores_per_sample(observations, "ps"),
        headroom=s.idle_headroom,
        ps_headroom=s.ps_demand_headroom,
    )
    # (No observation at all when every sample so far shows no progress: a resumed job.)
    measured_cpu = max((o.config.total_cpu for o in observations), default=cur.total_cpu)
    upper, cpu_limit = trust_region(cur, measured_cpu, s)
    own = {o.config: o.throughput for o in own_observations}

    def model_rate(c: Config) -> float:
        lw = c.worker_cpu if worker_cap is None else min(c.worker_cpu, worker_cap)
        lp = c.ps_cpu if ps_cap is None else min(c.ps_cpu, ps_cap)
        return model.throughput(Config(c.workers, c.ps, lw, lp), ctx.batch_size)

    corrections = measured_corrections(samples, own, model_rate, s.min_gain)
    try:
        target = search(
            model,
            ctx,
            memory,
            bounds,
            s.throughput_floor,
            include=(cur,),
            objective=s.objective,
            cpu_limit=cpu_limit,
            upper=upper,
            exclude=abandoned_configs(samples) - {cur},
            corrections=corrections,
        ).target
    except InfeasiblePlanError as exc:
        # The pods' memory (grown by Stage 3) leaves no other shape in the quota: keep this one.
        return AutoScaleDecision(None, f"stable: {OVER_QUOTA}: {exc}", model)

    def predict(c: Config) -> float:
        x = model_rate(c)
        for k in corrections:
            x = k.corrected(x, model_rate(k.base), c)
        return x

    x_cur = predict(cur)
    gain = predict(target.config) / x_cur
    # A target this run has measured is judged by its measurement, not by the fit.
    if target.config in own and cur in own and target.config != cur:
        gain = own[target.config] / own[cur]
    cur_cost = ctx.dominant_share(current.total_cpu, current.total_memory_mb)
    max_loss = s.max_loss if s.objective == "fastest" else 1 - s.throughput_floor
    kind: StepKind
    # The target's cost of change: an in-place resize of the workers, or a replacement.
    target_groups = _groups(target.config, memory, ctx, target.config, target.ps_memory_mb)
    target_groups = _kept_in_place(current, target_groups, resize_in_place, ctx.quota_memory_mb)
    target_in_place = resize_in_place and in_place(current, _plan(current, target_groups))
    if gain >= 1 + _min_gain(s, target_in_place):
        step = target.config
        why = f"model predicts {gain - 1:+.0%} throughput"
        if target.cost < cur_cost:
            why += f" for {target.cost / cur_cost - 1:+.0%} cost"
        # A step that costs less must keep its promise; one that costs more must pay.
        kind = "give_back" if step.total_cpu < cur.total_cpu else "grow"
    elif target.cost <= (1 - s.min_saving) * cur_cost and gain >= 1 - max_loss:
        step, kind = target.config, "give_back"
        saving = 1 - target.cost / cur_cost
        why = f"gives back {saving:.0%} of the cost for {gain - 1:+.1%} throughput"
    else:
        give_back = _probe(cur, observations, s, ctx.node.cpu_step)
        if give_back is not None and not _fits(give_back[0], memory, ctx):
            # The PS' memory need rose past what this shape holds in the quota: a probe of
            # it would be replaced by the search's target (see _groups), a different shape
            # than the one probed. Stage 3 reshapes for memory; the probe waits.
            give_back = None
        kind = "give_back"
        if give_back is None and memory_change == "give_back":
            freed = current.total_memory_mb - memory.total_mb(cur.workers, cur.ps)
            give_back = cur, f"right-sizes memory to measured use, freeing {freed / 1024:.1f}Gi"
            kind = "memory"
        if give_back is None:
            return AutoScaleDecision(
                None,
                f"stable: best target {describe(target.config)} promises {gain - 1:+.1%} "
                f"throughput at {target.cost / cur_cost - 1:+.0%} cost",
                model,
            )
        step, why = give_back
    workers, ps = _kept_in_place(
        current,
        _groups(step, memory, ctx, target.config, target.ps_memory_mb),
        resize_in_place,
        ctx.quota_memory_mb,
    )
    stepped = Config(workers.count, ps.count, workers.cpu, ps.cpu)
    # The promise a give-back is judged by: the gain the decision was made on.
    predicted = measured * (gain if stepped == target.config else predict(stepped) / x_cur)
    plan = ResourcePlan(
        workers=workers,
        ps=ps,
        stage=Stage.AUTO_SCALE,
        reason=f"auto-scale {describe(cur)} -> {describe(stepped)}: {why}",
        predicted_throughput=round(predicted, 1),
    )
    return AutoScaleDecision(
        plan, why, model, kind=kind, in_place=resize_in_place and in_place(current, plan)
    )


def _measured_better(
    ctx: PlanningContext,
    current: ResourcePlan,
    own: Sequence[Observation],
    measured: float,
    memory: MemoryNeeds,
    samples: Sequence[RuntimeSample],
    s: AutoScaleSettings,
) -> AutoScaleDecision | None:
    """Back to a shape this run left and measured faster, at no more cost, if there is one:
    a run does not stay (or end) on a plan measured slower than one it left. The measurement
    wins over the model here: ``X_m(c) >= (1 + min_gain) · X_m(now)`` and ``cost(c) <=
    cost(now)``, with the memory each pod needs now, within the quota. Taken as a rollback
    (never undone; the shape left is abandoned, so noise that made the shape left look slow
    costs one such move, not a flip-flop)."""
    cur = plan_config(current)
    abandoned = abandoned_configs(samples)
    cur_cost = ctx.dominant_share(current.total_cpu, current.total_memory_mb)
    best: tuple[float, Config, NodeGroup, NodeGroup] | None = None
    for o in own:
        c = o.config
        if c == cur or c in abandoned or o.throughput < (1 + s.min_gain) * measured:
            continue
        if not _fits(c, memory, ctx):
            continue
        workers, ps = _groups(c, memory, ctx, c, memory.ps_mb(c.ps))
        cost = ctx.dominant_share(
            workers.total_cpu + ps.total_cpu, workers.total_memory_mb + ps.total_memory_mb
        )
        if cost > cur_cost + 1e-9:
            continue
        if best is None or o.throughput > best[0]:
            best = (o.throughput, c, workers, ps)
    if best is None:
        return None
    rate, c, workers, ps = best
    why = (
        f"back to {describe(c)}: measured {rate:.0f} samples/s there against {measured:.0f} "
        "now, at no more cost"
    )
    plan = ResourcePlan(
        workers=workers,
        ps=ps,
        stage=Stage.AUTO_SCALE,
        reason=f"rollback: {why}",
        predicted_throughput=round(rate, 1),
    )
    return AutoScaleDecision(plan, "rollback", kind="rollback")


def measured_corrections(
    samples: Sequence[RuntimeSample],
    own: dict[Config, float],
    model_rate: Callable[[Config], float],
    needed: float,
) -> tuple[Correction, ...]:
    """What this run's undone growth steps measured, as corrections of the model
    (search.Correction): a direction that measured worse is proposed again only where the
    model, scaled down by that measurement, still promises the step's gain. A step whose two
    ends have no measured throughput (a start-up, a stall) corrects nothing."""
    out = []
    for base, failed in failed_moves(samples):
        if own.get(base, 0.0) <= 0 or failed not in own:
            continue
        predicted = model_rate(failed) / model_rate(base)
        measured = own[failed] / own[base]
        if predicted <= 1 or measured >= predicted:
            continue
        ratio = max(-1.0, min(1.0, (measured - 1) / (predicted - 1)))
        k = Correction(base, failed, ratio, needed)
        if k.grows:
            out.append(k)
    return tuple(out)


def _kept_in_place(
    current: ResourcePlan,
    groups: tuple[NodeGroup, NodeGroup],
    resize_in_place: bool,
    quota_memory_mb: int,
) -> tuple[NodeGroup, NodeGroup]:
    """``groups``, with the pods' memory kept where its right-sizing alone would turn an
    in-place step into a replacement. Growth steps carry memory right-sizing along because they
    replace the pods anyway; an in-place step replaces nothing, and a memory decrease cannot be
    applied in place (a worker's: core/reconcile.py; a PS's moves it to a new pod), so carrying
    it would buy restarts and a data re-read (or a PS move) for memory the job holds already
    (within its quota: the counts are the same). The shrink waits for a memory step of its own
    (``min_memory_saving``)."""
    if not resize_in_place or in_place(current, _plan(current, groups)):
        return groups
    kept = tuple(
        dataclasses.replace(group, memory_mb=max(group.memory_mb, was.memory_mb))
        for group, was in zip(groups, (current.workers, current.ps), strict=True)
    )
    kept_groups = (kept[0], kept[1])
    if in_place(current, _plan(current, kept_groups)):
        return kept_groups
    # The step moves or adds PS (never in place), but its workers' part may still be: the same
    # count at a new CPU is resized in place, unless a memory cut makes it a replacement. The
    # workers keep their memory then, where the quota holds it.
    workers, ps = groups
    was = current.workers
    if workers.count == was.count and workers.memory_mb < was.memory_mb:
        held = (workers.count * was.memory_mb) + ps.total_memory_mb
        if held <= quota_memory_mb:
            return dataclasses.replace(workers, memory_mb=was.memory_mb), ps
    return groups


def _plan(current: ResourcePlan, groups: tuple[NodeGroup, NodeGroup]) -> ResourcePlan:
    """``current`` with the workers and PS of ``groups``."""
    return dataclasses.replace(current, workers=groups[0], ps=groups[1])


def memory_needs(
    ctx: PlanningContext,
    current: ResourcePlan,
    samples: Sequence[RuntimeSample],
    s: AutoScaleSettings,
    g: MemoryGrowthSettings,
) -> tuple[MemoryNeeds, MemoryChange]:
    """Memory per pod for the plans this decision considers, and how it changed.

    By default the PS keep the state they hold, re-partitioned over any PS count (``held =
    max(footprint, p · (m − runtime))``): a cold start's is the user's request, a warm start's
    what earlier runs were measured to reach, and nothing measured in this run says less. The
    PS follow their measured growth (memory_growth.py, with ``N`` the projected end-of-job
    state with its margin)::

        ps_state = N      if N > held                        ("raise": before it OOMs)
                 = N      if growth stopped, and the job's memory falls by min_memory_saving
                 = held   otherwise (growth not measured, or still growing)
        worker_mb = max(floor, peak worker use × (1 + worker_memory_headroom))   (shrink only)
        ps_mb(p)  = runtime + ps_state / p

    A worker's memory is flat per batch, so once measured its need is known: every plan this
    decision considers gives workers ``worker_mb``, whatever the change. A step that replaces
    the workers anyway (a growth, a reshape) thus carries the measured memory along, and the
    search may count on it when it fits more, smaller workers in the memory quota (with the
    workers' request held instead, a quota equal to the user's request fits no worker more than
    the user asked for, however idle their CPU). A memory-only step, which relaunches pods for
    memory alone ("give_back"), is taken only when it frees ``min_memory_saving`` of the job's
    memory at the current configuration; an in-place step keeps the pods' memory (auto_scale's
    ``_kept_in_place``). A raise goes into every plan this decision makes; the running PS are
    raised by Stage 3, which runs first and waits for nothing (post_scale.ps_growth_short).
    """
    cur = plan_config(current)
    held = max(ctx.ps_state_mb, cur.ps * (current.ps.memory_mb - RUNTIME_MB))
    worker_mb = current.workers.memory_mb
    worker_peak = peak_memory_mb(samples, "worker")
    if worker_peak > 0:
        worker_mb = min(
            worker_mb,
            clamp_worker_memory(
                max(ctx.worker_memory_floor_mb, worker_peak * (1 + s.worker_memory_headroom)),
                ctx.node,
            ),
        )
    conserved = MemoryNeeds(
        worker_mb=worker_mb,
        ps_fixed_mb=RUNTIME_MB,
        ps_state_mb=held,
        ps_min_mb=ctx.node.min_memory_mb,
    )
    growth = ps_growth(ctx, samples, g)
    need = held if growth is None else growth.need_state_mb(ctx, g)
    if need > held:
        return dataclasses.replace(conserved, ps_state_mb=need), "raise"
    stopped = growth is not None and growth.stopped(g)
    sized = dataclasses.replace(conserved, ps_state_mb=need if stopped else held)
    if sized.total_mb(cur.workers, cur.ps) > (1 - s.min_memory_saving) * current.total_memory_mb:
        return conserved, "keep"
    return sized, "give_back"


def _fits(step: Config, memory: MemoryNeeds, ctx: PlanningContext) -> bool:
    """Whether ``step``, with the memory per pod ``memory`` gives it, is within the quota."""
    return (
        step.total_cpu <= ctx.quota_cpu + 1e-9
        and memory.total_mb(step.workers, step.ps) <= ctx.quota_memory_mb
    )


def _groups(
    step: Config, memory: MemoryNeeds, ctx: PlanningContext, target: Config, target_ps_mb: int
) -> tuple[NodeGroup, NodeGroup]:
    """Node groups for a stepped configuration; the target itself if the step breaks the quota
    (fewer PS than the target need more memory each)."""
    ps_mb = memory.ps_mb(step.ps)
    if not _fits(step, memory, ctx):
        step, ps_mb = target, target_ps_mb
    return (
        NodeGroup(count=step.workers, cpu=step.worker_cpu, memory_mb=memory.worker_mb),
        NodeGroup(count=step.ps, cpu=step.ps_cpu, memory_mb=ps_mb),
    )
