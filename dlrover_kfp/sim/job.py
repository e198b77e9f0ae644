"""One job run in simulated time against a synthetic workload, planned by the real planner.

The loop is the runtime's: observe a sample every ``sample_interval_s``, decide with
Stage 2 (:func:`~dlrover_kfp.core.planner.auto_scale`), apply. Applying a plan costs
``resize_pause_s`` of training (new pods start, shards move); the job ends when it has processed
``rows x epochs`` samples. The result is a real profile (schema v1) for the history store.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from dlrover_kfp.core.observation import Config, Observation
from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.planner import (
    PlannerSettings,
    ScalingStep,
    auto_scale,
    context_from_spec,
    throughput_before,
)
from dlrover_kfp.core.profile import (
    AppliedPlan,
    JobEvent,
    JobProfile,
    NodeSample,
    Outcome,
    RuntimeSample,
    profile_job,
)
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.sim.workload import Truth


@dataclass(frozen=True, slots=True)
class SimulationSettings:
    sample_interval_s: float = 30.0
    #: training paused while a new plan's pods start and shards move (seconds)
    resize_pause_s: float = 20.0
    #: multiplicative noise on throughput and CPU readings (standard deviation)
    noise: float = 0.03
    #: the job is failed if it has not finished by then (simulated seconds)
    max_duration_s: float = 7 * 86400.0


def _nodes(
    plan: ResourcePlan,
    truth: Truth,
    x: float,
    rng: random.Random,
    ctx_mem: tuple[int, int],
    noise: float,
) -> tuple[NodeSample, ...]:
    c = Config(plan.workers.count, plan.ps.count, plan.workers.cpu, plan.ps.cpu)
    w_used, p_used = truth.usage(c)
    w_mem, p_mem = ctx_mem
    workers = [
        NodeSample(
            name=f"worker-{k}",
            role="worker",
            cpu_used=round(min(plan.workers.cpu, w_used * rng.gauss(1, noise)), 3),
            cpu_requested=plan.workers.cpu,
            memory_used_mb=w_mem,
            memory_requested_mb=plan.workers.memory_mb,
            throughput=round(x / c.workers, 1),
        )
        for k in range(c.workers)
    ]
    ps = [
        NodeSample(
            name=f"ps-{k}",
            role="ps",
            cpu_used=round(min(plan.ps.cpu, p_used * rng.gauss(1, noise)), 3),
            cpu_requested=plan.ps.cpu,
            memory_used_mb=p_mem // c.ps + 384,
            memory_requested_mb=plan.ps.memory_mb,
        )
        for k in range(c.ps)
    ]
    return tuple(workers + ps)


def simulate_job(
    spec: JobSpec,
    initial: ResourcePlan,
    truth: Truth,
    *,
    run_id: str,
    started_at: str,
    seed: int = 0,
    settings: PlannerSettings | None = None,
    sim: SimulationSettings | None = None,
    known: Sequence[Observation] = (),
) -> JobProfile:
    """Run ``spec`` from ``initial`` to the end; ``known`` goes to every Stage-2 decision."""
    settings = settings or PlannerSettings()
    sim = sim or SimulationSettings()
    ctx = context_from_spec(spec, settings)
    rng = random.Random(seed)
    total = (spec.dataset_rows or 0) * spec.training.epochs
    # Memory the pods really use: the model's footprint (workers), the rows (PS, all together).
    memory = (int(ctx.worker_memory_floor_mb * 0.9), ctx.ps_state_mb)

    t, processed, step = 0.0, 0.0, 0
    current = initial
    plans = [
        AppliedPlan(
            time=0.0,
            stage=initial.stage,
            reason=initial.reason,
            workers=initial.workers,
            ps=initial.ps,
        )
    ]
    samples: list[RuntimeSample] = []
    events: list[JobEvent] = []
    last: ScalingStep | None = None
    while processed < total and t < sim.max_duration_s:
        c = Config(current.workers.count, current.ps.count, current.workers.cpu, current.ps.cpu)
        x = max(1.0, truth.throughput(c) * rng.gauss(1, sim.noise))
        dt = min(sim.sample_interval_s, (total - processed) / x)
        processed += x * dt
        t += dt
        step += int(x * dt / (truth.batch * c.workers))
        samples.append(
            RuntimeSample(
                time=round(t, 3),
                global_step=step,
                throughput=round(x, 1),
                workers=c.workers,
                ps=c.ps,
                worker_cpu=c.worker_cpu,
                ps_cpu=c.ps_cpu,
                nodes=_nodes(current, truth, x, rng, memory, sim.noise),
            )
        )
        if processed >= total:
            break
        decision = auto_scale(ctx, current, samples, t, settings, last_step=last, known=known)
        if decision.plan is not None:
            measured = throughput_before(samples, settings)
            t += sim.resize_pause_s
            last = ScalingStep(
                time=t,
                before=current,
                throughput_before=measured,
                kind=decision.kind,
                expected=decision.plan.predicted_throughput,
            )
            current = decision.plan
            plans.append(
                AppliedPlan(
                    time=round(t, 3),
                    stage=current.stage,
                    reason=current.reason,
                    workers=current.workers,
                    ps=current.ps,
                )
            )
            events.append(JobEvent(time=round(t, 3), kind="scale", detail=current.reason))
    finished = processed >= total
    return JobProfile(
        run_id=run_id,
        started_at=started_at,
        job=profile_job(spec),
        outcome=Outcome(
            status="succeeded" if finished else "failed",
            reason="" if finished else f"not finished after {sim.max_duration_s:.0f}s",
            jct_seconds=round(t, 3),
            samples_processed=int(processed),
        ),
        plans=tuple(plans),
        samples=tuple(samples),
        events=tuple(events),
    )
