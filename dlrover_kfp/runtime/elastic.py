"""The elastic run: the job master applies the planner to live pods.

The loop is :class:`~dlrover_kfp.runtime.job.StaticRun`'s (launch, sample, checkpoint,
evaluate, profile) with its two hooks filled in:

* **decide**, after every runtime sample: Stage 2 (:func:`~dlrover_kfp.core.planner.auto_scale`,
  the function the simulator calls) on the samples so far; a new plan is turned into ordered pod
  changes by :func:`~dlrover_kfp.core.reconcile.reconcile` and applied:

  - worker changes are applied to the running job: a removed worker's leased shards go back to
    the queue when its connection drops (the master's ledger), a resized worker is a new pod of
    the new size under the same name, new workers lease shards as they come;
  - a PS change (count or size) is applied **stop-and-restart**: the workers are stopped (their
    leases return), a flash checkpoint is taken with the shard ledger, the PS stop, the new PS
    start from that checkpoint with the rows re-partitioned over their new count, and the
    workers start again. Nothing is counted twice: samples count when a worker reports a shard
    done, and a stopped worker's unreported shard is trained again from the start (its partial
    updates stay in the PS, as any asynchronous PS job's would). A live migration, with
    training paused only for the switch, is not built yet.

* **instability**, before any resize: Stage 3 (:func:`~dlrover_kfp.core.planner.post_scale`)
  on the samples since its last action. A worker relaunch (a memory trend toward its limit,
  a pending pod) or replacement (a persistent straggler) is applied to that pod; a PS action
  (hot PS, memory trend) resizes all PS stop-and-restart. Taking a slow worker's shards while it
  still runs is not applied: it and the next holder would both report the shard, and samples
  count at every report; its shards move when it is replaced.

* **failures**: a failed worker goes to the relaunch policy
  (:func:`~dlrover_kfp.core.planner.relaunch.decide_relaunch`): relaunched as it was, bigger
  after an OOM, or the job fails after repeated failures. A failed PS fails the job (restoring
  a PS from the last checkpoint while the ledger has moved on is not built yet).

Every plan applied (stage, reason, time) and every event (scale, relaunch, oom, failure) lands
in the profile.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

from dlrover_kfp.backends import ClusterBackend, PodPhase, PodStatus
from dlrover_kfp.core.observation import Observation
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan
from dlrover_kfp.core.planner import (
    PlannerSettings,
    ScalingStep,
    auto_scale,
    context_from_spec,
    throughput_before,
)
from dlrover_kfp.core.planner.post_scale import Instability, post_scale
from dlrover_kfp.core.planner.relaunch import (
    ExitCause,
    FailJob,
    NoRelaunch,
    PodExit,
    Relaunch,
    decide_relaunch,
)
from dlrover_kfp.core.profile import AppliedPlan, EventKind, JobEvent, RuntimeSample
from dlrover_kfp.core.reconcile import ChangeKind, Pod, reconcile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.runtime.job import JobFailedError, Progress, RunSettings, StaticRun
from dlrover_kfp.runtime.master import MasterState


def local_planner_settings() -> PlannerSettings:
    """The planner's settings for pods that are processes on one machine.

    The defaults are a cluster's (half-core steps, a decision every 5 minutes). A machine's
    quota is a few cores and a job a few minutes, so pods come in quarter cores, memory from
    512 MiB, and Stage 2 decides every 10 s once it has 3 samples at the current shape.
    """
    defaults = PlannerSettings()
    return dataclasses.replace(
        defaults,
        node=dataclasses.replace(defaults.node, min_cpu=0.25, cpu_step=0.25, min_memory_mb=512),
        auto_scale=dataclasses.replace(defaults.auto_scale, min_interval_s=10.0, min_samples=3),
        # Stage 3 looks one planning interval ahead for a memory trend.
        post_scale=dataclasses.replace(defaults.post_scale, oom_horizon_s=10.0),
    )


#: How the backend's reasons map to the relaunch policy's causes.
_CAUSES = {
    "OOMKilled": ExitCause.OOM_KILLED,
    "Error": ExitCause.ERROR,
    "StartError": ExitCause.START_ERROR,
    "Deleted": ExitCause.DELETED,
    "Evicted": ExitCause.EVICTED,
    "Preempted": ExitCause.PREEMPTED,
}


class ElasticRun(StaticRun):
    """One elastic run, starting from ``plan`` (Stage 1's, or the user's resources)."""

    def __init__(
        self,
        spec: JobSpec,
        backend: ClusterBackend,
        *,
        plan: ResourcePlan,
        planner: PlannerSettings,
        output_dir: Path,
        base_dir: Path,
        settings: RunSettings | None = None,
        run_id: str | None = None,
        progress: Progress | None = None,
        known: Sequence[Observation] = (),
    ) -> None:
        super().__init__(
            spec,
            backend,
            output_dir=output_dir,
            base_dir=base_dir,
            settings=settings,
            run_id=run_id,
            progress=progress,
            groups=(plan.workers, plan.ps),
        )
        self.plan = plan
        self.planner = planner
        self.ctx = context_from_spec(spec, planner)
        self.known = tuple(known)
        self.last_step: ScalingStep | None = None
        self.plans: list[AppliedPlan] = [
            AppliedPlan(
                time=0.0, stage=plan.stage, reason=plan.reason, workers=plan.workers, ps=plan.ps
            )
        ]
        #: every stop handled, for the relaunch policy's failure count
        self._stops: list[PodExit] = []
        #: indices into ``samples`` where pods were (re)started: the job's start, every change
        self._starts: list[int] = [0]
        #: (name, launch time) of failed pods already handled
        self._handled: set[tuple[str, float | None]] = set()

    # -- failures -------------------------------------------------------------------------

    def _handle_failures(self, statuses: list[PodStatus], t: float) -> None:
        for status in statuses:
            if status.phase is not PodPhase.FAILED or status.name in self._stopping:
                continue
            key = (status.name, status.started_at)
            if key in self._handled:
                continue
            self._handled.add(key)
            role = status.role
            group = self.ps if role == "ps" else self.workers
            cause = _CAUSES.get(status.reason or "Error", ExitCause.ERROR)
            stop = PodExit(
                node=status.name,
                role=role,
                cause=cause,
                exit_code=status.exit_code,
                time=t,
                cpu=group.cpu,
                memory_mb=group.memory_mb,
            )
            self.events.append(
                JobEvent(
                    time=round(t, 3),
                    kind="oom" if cause is ExitCause.OOM_KILLED else "failure",
                    node=status.name,
                    detail=self._describe_failure(status),
                )
            )
            if role == "ps":
                raise JobFailedError(
                    f"{self._describe_failure(status)}; restoring a failed PS during an elastic "
                    f"run is not supported yet"
                )
            decision = decide_relaunch(stop, self._stops, self.planner)
            self._stops.append(stop)
            if isinstance(decision, FailJob):
                raise JobFailedError(decision.reason)
            if isinstance(decision, NoRelaunch):
                continue
            self._relaunch_worker(status.name, status.index, decision, t)

    def _relaunch_worker(self, name: str, index: int, decision: Relaunch, t: float) -> None:
        group = NodeGroup(count=1, cpu=decision.cpu, memory_mb=decision.memory_mb)
        self.backend.launch(self._pod("worker", index, group, self.address))
        self._starts.append(len(self.samples))
        self.events.append(
            JobEvent(time=round(t, 3), kind="relaunch", node=name, detail=decision.reason)
        )
        self.progress(f"{self.run_id}: {decision.reason}")

    # -- decisions --------------------------------------------------------------------------

    def _settled(self) -> list[RuntimeSample]:
        """The samples that tell a shape's steady behaviour.

        After every start of pods (the job's, a resize's, a relaunch's) the samples until the
        first trained shard say nothing about the shape's speed (processes starting, the first
        rows being read), the first one with progress is partial, and a new process's memory
        grows while it loads and warms up, which is no trend toward a limit. Those samples are
        left out of what Stage 2 and Stage 3 see.
        """
        settled: list[RuntimeSample] = []
        for k, start in enumerate(self._starts):
            end = self._starts[k + 1] if k + 1 < len(self._starts) else len(self.samples)
            part = self.samples[start:end]
            first = next((i for i, x in enumerate(part) if x.throughput > 0), None)
            if first is not None:
                settled.extend(part[first + 1 :])
        return settled

    def _decide(self, state: MasterState, t: float) -> None:
        settled = self._settled()
        if not settled:
            return
        with state.lock:
            if state.ledger.finished:
                return  # nothing left to lease: a new shape would only start idle pods
        # Stage 3 first: instability (a memory trend toward a limit, a hot PS, a straggler)
        # is acted on before any resize. It sees the settled samples since the last change.
        recent = [x for x in settled if x.time >= self.samples[self._starts[-1]].time]
        unstable = post_scale(self.ctx, self.plan, Instability(samples=recent), t, self.planner)
        if unstable is not None and unstable.actions:
            self._apply_actions(state, unstable)
            self._starts.append(len(self.samples))
            return
        decision = auto_scale(
            self.ctx,
            self.plan,
            settled,
            t,
            self.planner,
            last_step=self.last_step,
            known=self.known,
        )
        if decision.plan is None:
            return
        measured = throughput_before(settled, self.planner)
        before = self.plan
        self.progress(f"{self.run_id}: plan at {t:.0f}s: {decision.plan.reason}")
        self._apply(state, decision.plan)
        self._starts.append(len(self.samples))
        applied_at = self.clock() - self.start
        self.plan = decision.plan
        self.last_step = ScalingStep(
            time=applied_at, before=before, throughput_before=measured, kind=decision.kind
        )
        self.plans.append(
            AppliedPlan(
                time=round(applied_at, 3),
                stage=self.plan.stage,
                reason=self.plan.reason,
                workers=self.plan.workers,
                ps=self.plan.ps,
            )
        )
        self.events.append(
            JobEvent(time=round(applied_at, 3), kind="scale", detail=self.plan.reason)
        )

    def _apply_actions(self, state: MasterState, plan: ResourcePlan) -> None:
        """Stage 3's node actions (see :mod:`dlrover_kfp.core.planner.post_scale`)."""
        t = self.clock() - self.start
        ps_target: NodeGroup | None = None
        kind: EventKind
        roles = {s.name: s.role for s in self.backend.statuses()}
        for action in plan.actions:
            if roles.get(action.node) == "ps":
                # A PS is resized with all of them, stop-and-restart (a live migration of one
                # PS is not built yet).
                ps_target = NodeGroup(
                    count=plan.ps.count,
                    cpu=max(plan.ps.cpu, action.cpu or 0.0),
                    memory_mb=max(plan.ps.memory_mb, action.memory_mb or 0),
                )
                kind = "migration"
            elif action.kind in ("relaunch", "replace_worker"):
                index = int(action.node.rsplit("-", 1)[1])
                group = NodeGroup(
                    count=1,
                    cpu=action.cpu or self.workers.cpu,
                    memory_mb=action.memory_mb or self.workers.memory_mb,
                )
                self._stop(action.node)
                self._stopping.discard(action.node)
                self.backend.launch(self._pod("worker", index, group, self.address))
                kind = "relaunch" if action.kind == "relaunch" else "straggler"
            else:
                # reassign_shards: taking a live worker's leases would let it and the next
                # holder both report the shard; its shards move when it is replaced instead.
                kind = "straggler"
            self.events.append(
                JobEvent(time=round(t, 3), kind=kind, node=action.node, detail=action.reason)
            )
            self.progress(f"{self.run_id}: {action.node}: {action.reason}")
        if ps_target is not None:
            self._restart_with(state, dataclasses.replace(plan, workers=self.workers, ps=ps_target))
        self.workers = NodeGroup(
            count=self.workers.count,
            cpu=self.workers.cpu,
            memory_mb=max(self.workers.memory_mb, plan.workers.memory_mb),
        )
        self.plan = dataclasses.replace(plan, workers=self.workers, ps=self.ps)
        applied = round(self.clock() - self.start, 3)
        self.plans.append(
            AppliedPlan(
                time=applied,
                stage=self.plan.stage,
                reason=self.plan.reason,
                workers=self.plan.workers,
                ps=self.plan.ps,
            )
        )

    def _current_pods(self) -> list[Pod]:
        pods = [
            Pod(role="worker", index=k, cpu=self.workers.cpu, memory_mb=self.workers.memory_mb)
            for k in range(self.workers.count)
        ]
        pods += [
            Pod(role="ps", index=k, cpu=self.ps.cpu, memory_mb=self.ps.memory_mb)
            for k in range(self.ps.count)
        ]
        return pods

    def _stop(self, name: str) -> None:
        self._stopping.add(name)
        self.backend.delete(name)

    def _apply(self, state: MasterState, target: ResourcePlan) -> None:
        changes = reconcile(
            self._current_pods(), target, self.ctx.quota_cpu, self.ctx.quota_memory_mb
        )
        if any(c.kind in (ChangeKind.REPARTITION_PS, ChangeKind.MIGRATE_PS) for c in changes):
            self._restart_with(state, target)
            return
        for change in changes:
            name = self._worker_name(change.index)
            if change.kind is ChangeKind.REMOVE_WORKER:
                self._stop(name)
            elif change.kind is ChangeKind.ADD_WORKER:
                self._stopping.discard(name)
                self.backend.launch(self._pod("worker", change.index, target.workers, self.address))
        self.workers = target.workers

    def _restart_with(self, state: MasterState, target: ResourcePlan) -> None:
        """A PS change, stop-and-restart (see the module docstring)."""
        paused = time.monotonic()
        for k in range(self.workers.count):
            self._stop(self._worker_name(k))
        step = state.totals()[1]
        self.coordinator.checkpoint(step, extra={"shards": self._ledger_dict(state)})
        self.coordinator.shutdown_ps()
        self._wait_for_terminal([f"{self.spec.name}-ps-{k}" for k in range(self.ps.count)])
        self.coordinator.close()
        for k in range(self.ps.count):
            self._stopping.add(f"{self.spec.name}-ps-{k}")
        with state.lock:
            state.num_ps = target.ps.count
            state.ps_addresses.clear()
            state.job_config = {**state.job_config, "num_ps": target.ps.count, "restore": True}
        self.ps = target.ps
        for k in range(target.ps.count):
            name = f"{self.spec.name}-ps-{k}"
            self._stopping.discard(name)
            self.backend.launch(self._pod("ps", k, target.ps, self.address))
        self._wait_for_ps(state, self.clock())
        self.coordinator = self._new_coordinator(state)
        for k in range(target.workers.count):
            self._stopping.discard(self._worker_name(k))
            self.backend.launch(self._pod("worker", k, target.workers, self.address))
        self.workers = target.workers
        self.progress(
            f"{self.run_id}: PS restarted from the checkpoint of step {step:,} "
            f"({target.ps.count} x {target.ps.cpu:g} cpu), training paused "
            f"{time.monotonic() - paused:.1f}s"
        )

    def _wait_for_terminal(self, names: Sequence[str], timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        wanted = set(names)
        while time.monotonic() < deadline:
            states = {s.name: s.phase for s in self.backend.statuses() if s.name in wanted}
            if all(phase.terminal for phase in states.values()):
                return
            time.sleep(0.05)
        for name in wanted:
            self._stop(name)

    def _applied_plans(self) -> tuple[AppliedPlan, ...]:
        return tuple(self.plans)


__all__ = ["ElasticRun", "local_planner_settings"]
