"""The elastic run: the job master applies the planner to live pods.

The loop is :class:`~dlrover_kfp.runtime.job.StaticRun`'s (launch, sample, checkpoint,
evaluate, profile) with its two hooks filled in:

* **decide**, after every runtime sample: Stage 2 (:func:`~dlrover_kfp.core.planner.auto_scale`,
  the function the simulator calls) on the samples so far; a new plan is turned into ordered pod
  changes by :func:`~dlrover_kfp.core.reconcile.reconcile` and applied:

  - worker changes are applied to the running job: a removed worker's leased shards go back to
    the queue when its connection drops (the master's ledger), a resized worker is a new pod of
    the new size under the same name, new workers lease shards as they come;
  - a PS change (count or size, or one PS moved) is applied **live** (:meth:`_switch_ps`):
    the new PS pods start while training goes on and wait, started, for the master; then the
    workers pause (each finishes its step, waits for its pushes and reports its shards), a
    flash checkpoint of the now quiescent PS is taken with the shard ledger, the new PS
    restore from it (rows re-partitioned when their count changed), the workers connect to
    the new set and go on, and the old PS stop. Training is paused only from the workers'
    pause to their reconnection; nothing is trained twice or lost, since every push of every
    reported shard is in the checkpoint and no shard is leased while paused.
  - ``migration="restart"`` applies a PS change **stop-and-restart** instead (the baseline the
    live switch is measured against): the workers are stopped (their leases return), a
    checkpoint is taken, the PS stop, the new PS start from it and the workers start again. A
    stopped worker's unreported shard is trained again from the start (its partial updates
    stay in the PS, as any asynchronous PS job's would); samples count when reported, once.

* **instability**, before any resize: Stage 3 (:func:`~dlrover_kfp.core.planner.post_scale`)
  on the samples since its last action. A worker relaunch (a memory trend toward its limit,
  a pending pod) or replacement (a persistent straggler) is applied to that pod; a PS action
  (hot PS, memory trend) moves that PS to a new pod, live; when its new size differs from the
  others', all PS move (a job's PS share one size). Taking a slow worker's shards while it
  still runs is not applied: it and the next holder would both report the shard, and samples
  count at every report; its shards move when it is replaced.

* **failures**: a failed worker goes to the relaunch policy
  (:func:`~dlrover_kfp.core.planner.relaunch.decide_relaunch`): relaunched as it was, bigger
  after an OOM, or the job fails after repeated failures. A failed PS (the same policy) rolls
  the whole job back to its last committed checkpoint (:meth:`_restore_from_checkpoint`):
  every PS restores it, the master restores the shard ledger and counts committed with it.
  A *frozen* PS (SIGSTOPped, hung, its node gone: no usage report and no answer to a probe,
  :mod:`~dlrover_kfp.runtime.liveness`) is killed and handled the same way; a new PS of a
  live change that freezes abandons the change (the old PS serve on).

* **restart**: with ``resume``, a master started again on the output directory of a run whose
  master was killed goes on from that run's last committed checkpoint, at the shape and with
  the timeline committed with it (:class:`~dlrover_kfp.runtime.job.StaticRun`).

Every plan applied (stage, reason, time) and every event (scale, relaunch, oom, migration,
failure) lands in the profile.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Literal

from dlrover_kfp.backends import ClusterBackend, PodPhase, PodStatus
from dlrover_kfp.core.documents import parse, to_dict
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
from dlrover_kfp.core.reconcile import ChangeKind, Pod, move_ps, reconcile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.errors import PermanentError, TransientError
from dlrover_kfp.runtime.checkpoints import CheckpointCoordinator
from dlrover_kfp.runtime.job import JobFailedError, Progress, RunSettings, StaticRun
from dlrover_kfp.runtime.liveness import WatchedPs
from dlrover_kfp.runtime.master import MasterState, PsSwitch
from dlrover_kfp.training import checkpoint as ckpt
from dlrover_kfp.training.master_protocol import USAGE_INTERVAL_S

log = logging.getLogger("dlrover_kfp.elastic")

#: How a PS change is applied: live (paused only for the switch) or stop-and-restart.
Migration = Literal["live", "restart"]

#: Seconds the workers get to pause for a PS switch before the stragglers are stopped:
#: ``_PAUSE_SHARDS`` times a shard's time at the job's median speed, within these bounds.
_PAUSE_TIMEOUT_S = 20.0
_PAUSE_MIN_S = 3.0
_PAUSE_SHARDS = 4
#: A worker that has not reported its usage for this long is frozen (SIGSTOPped, its node
#: hung): a switch does not wait for it. Two and a half report intervals leave room for one
#: late report of a busy process, whose reporting thread needs the GIL only briefly.
_SILENT_S = 2.5 * USAGE_INTERVAL_S
#: Seconds a new PS of a switch may run (its pod started, by the backend) without a first usage
#: report before it is frozen. A pod reports before it loads torch (training/node.py main):
#: ~0.25 s of CPU after the interpreter starts, 1 s in a quarter-core pod; five report
#: intervals leave a contended node ten times that. A pod still scheduled or pulling its
#: image is not running yet: the startup timeout (startup_timeout_s, 180 s) covers that.
_FIRST_REPORT_S = 5 * USAGE_INTERVAL_S


#: How the backend's reasons map to the relaunch policy's causes.
_CAUSES = {
    "OOMKilled": ExitCause.OOM_KILLED,
    "Error": ExitCause.ERROR,
    "StartError": ExitCause.START_ERROR,
    "Deleted": ExitCause.DELETED,
    "Evicted": ExitCause.EVICTED,
    "Preempted": ExitCause.PREEMPTED,
    "NodeLost": ExitCause.NODE_LOST,
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
        migration: Migration = "live",
        resume: bool = False,
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
            resume=resume,
        )
        extra = self.resume_from.extra if self.resume_from is not None else {}
        if "plan" in extra:
            # A resumed run goes on at the shape it had, with its timeline so far.
            self.workers = parse(
                NodeGroup, extra["plan"]["workers"], "checkpoint", prefix="workers."
            )
            self.ps = parse(NodeGroup, extra["plan"]["ps"], "checkpoint", prefix="ps.")
            plan = dataclasses.replace(plan, workers=self.workers, ps=self.ps)
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
        if "plans" in extra:
            self.plans = [parse(AppliedPlan, x, "checkpoint") for x in extra["plans"]]
            self.events = [parse(JobEvent, x, "checkpoint") for x in extra.get("events", [])]
        # The earlier master's events after its last checkpoint, from its run file's journal:
        # what happened stays in the timeline even where the training state rolls back.
        seen = set(self.events)
        self.events += [e for e in self.journalled if e not in seen]
        self.events.sort(key=lambda e: e.time)
        #: every stop handled, for the relaunch policy's failure count
        self._stops: list[PodExit] = []
        #: indices into ``samples`` where pods were (re)started: the job's start, every change
        self._starts: list[int] = [0]
        # Slow workers whose shards were sent elsewhere, with the window (len(_starts)) it was in.
        self._reassigned: dict[str, int] = {}
        #: (name, launch time) of failed pods already handled
        self._handled: set[tuple[str, float | None]] = set()
        self.migration: Migration = migration
        #: the pod name of each PS index (a moved PS gets a new pod and name)
        self._ps_pods: dict[int, str] = {k: self._pod_name("ps", k) for k in range(plan.ps.count)}
        #: the generation of each PS index's pod (the key of its usage reports)
        self._ps_gens: dict[int, int] = dict.fromkeys(range(plan.ps.count), 0)
        #: per new PS pod of a switch, when the backend first said it runs
        self._running_since: dict[str, float] = {}
        #: seconds training was paused by each PS change
        self.ps_pauses: list[float] = []
        #: threads stopping the PS a switch replaced, once their checkpoint is committed
        self._retiring: list[threading.Thread] = []

    def _checkpoint_extra(self, state: MasterState) -> dict[str, Any]:
        """The ledger and counts, and the shape and timeline a resumed run goes on with."""
        return {
            **super()._checkpoint_extra(state),
            "plan": {"workers": to_dict(self.workers), "ps": to_dict(self.ps)},
            "plans": [to_dict(x) for x in self.plans],
            "events": [to_dict(x) for x in self.events],
        }

    # -- failures -------------------------------------------------------------------------

    def _handle_failures(self, statuses: list[PodStatus], t: float) -> None:
        for status in statuses:
            if status.phase is not PodPhase.FAILED or status.name in self._stopping:
                continue
            key = (status.name, status.started_at)
            if key in self._handled:
                continue
            self._handled.add(key)
            decision = self._decide_stop(status, t)
            if isinstance(decision, NoRelaunch):
                continue
            if status.role == "ps":
                self._restore_from_checkpoint(status.name, decision, t)
                return  # every pod was replaced: the statuses seen are stale
            self._relaunch_worker(status.name, status.index, decision, t)
        self._handle_frozen_ps(t)

    def _decide_stop(self, status: PodStatus, t: float) -> Relaunch | NoRelaunch:
        """A failed pod's event (``oom`` or ``failure``, with the cause from its log) and the
        relaunch policy's decision; raises :class:`JobFailedError` when the job must stop."""
        cause = _CAUSES.get(status.reason or "Error", ExitCause.ERROR)
        group = self.ps if status.role == "ps" else self.workers
        launched = self._launched.get(status.name)
        stop = PodExit(
            node=status.name,
            role=status.role,
            cause=cause,
            exit_code=status.exit_code,
            time=t,
            cpu=group.cpu,
            # What the pod had: a relaunched pod may have more than its group.
            memory_mb=launched.memory_mb if launched is not None else group.memory_mb,
        )
        self.events.append(
            JobEvent(
                time=round(t, 3),
                kind="oom" if cause is ExitCause.OOM_KILLED else "failure",
                node=status.name,
                detail=self._describe_failure(status),
            )
        )
        decision = decide_relaunch(stop, self._stops, self.planner)
        self._stops.append(stop)
        if isinstance(decision, FailJob):
            raise JobFailedError(decision.reason)
        return decision

    def _start_failed(self, pod: PodStatus) -> None:
        """A pod failed before every PS registered. A PS (OOM-killed building its rows: the
        model's footprint estimate was below what it really needs) goes to the relaunch policy
        as one failing while training does: relaunched in place, bigger after an OOM, with its
        event, or the job fails after repeated failures. No worker has trained on this PS set
        yet, so nothing rolls back."""
        key = (pod.name, pod.started_at)
        if pod.role != "ps":
            super()._start_failed(pod)
            return
        if key in self._handled:
            return  # already relaunched: the backend still shows the old pod
        self._handled.add(key)
        # On the run's timeline, from the wall clock: the loop's own clock starts with training.
        t = max(0.0, (pod.finished_at or time.time()) - self.started_wall)
        decision = self._decide_stop(pod, t)
        if isinstance(decision, NoRelaunch):  # a PS that exits 0 before it serves
            super()._start_failed(pod)
            return
        state = self.state
        with state.lock:
            state.ps_addresses.pop(pod.index, None)  # it may have registered before it died
            generation = state.generation
        group = NodeGroup(count=1, cpu=decision.cpu, memory_mb=decision.memory_mb)
        self.backend.launch(self._pod("ps", pod.index, group, self.address, generation=generation))
        self.ps = dataclasses.replace(self.ps, memory_mb=max(self.ps.memory_mb, group.memory_mb))
        self.plan = dataclasses.replace(self.plan, ps=self.ps)
        self.events.append(
            JobEvent(time=round(t, 3), kind="relaunch", node=pod.name, detail=decision.reason)
        )
        self.progress(f"{self.run_id}: {decision.reason}")

    def _watched_ps(self) -> dict[int, WatchedPs]:
        return {
            k: WatchedPs(index=k, generation=self._ps_gens.get(k, 0), pod=pod)
            for k, pod in self._ps_pods.items()
        }

    def _handle_frozen_ps(self, t: float) -> None:
        """A frozen PS (:mod:`~dlrover_kfp.runtime.liveness`) is a failed one: it is killed at
        once (a frozen process cannot act on SIGTERM) and the job rolls back to its last
        checkpoint, as for a PS that died. It counts against the job as an error exit would:
        a PS that keeps freezing ends the job instead of rolling it back again and again.

        Called from the main loop only, between switches and rollbacks (both run on this
        thread), so neither is ever handled twice."""
        frozen = self.ps_watch.frozen(self._watched_ps())
        if frozen is None:
            return
        detail = self._kill_frozen(frozen)
        t = self.events[-1].time
        self.progress(f"{self.run_id}: {frozen.pod}: {detail}")
        stop = PodExit(
            node=frozen.pod,
            role="ps",
            cause=ExitCause.ERROR,
            exit_code=None,
            time=t,
            cpu=self.ps.cpu,
            memory_mb=self.ps.memory_mb,
        )
        decision = decide_relaunch(stop, self._stops, self.planner)
        self._stops.append(stop)
        if isinstance(decision, FailJob):
            raise JobFailedError(decision.reason.replace("exited with an error", "froze"))
        if isinstance(decision, Relaunch):
            # The policy's words are an error exit's; its count (the last parenthesis) holds.
            count = decision.reason[decision.reason.rfind(" (") :]
            reason = f"{frozen.pod} froze: relaunched as it was{count}"
            self._restore_from_checkpoint(
                frozen.pod, dataclasses.replace(decision, reason=reason), t
            )

    def _restore_from_checkpoint(self, name: str, decision: Relaunch, t: float) -> None:
        """A PS died: the job goes back to its last committed checkpoint, all of it.

        The dead PS's rows since the checkpoint are lost, so every PS restores that checkpoint
        (a consistent model), and the master restores the shard ledger and the per-worker
        counts committed with it: the shards done since are trained again and their samples,
        taken back, are counted once, when they are done again. Without a committed
        checkpoint the job starts over from its initial parameters and an empty ledger.
        """
        state = self.state
        paused = time.monotonic()
        for k in range(self.workers.count):
            self._stop(self._worker_name(k))
        self._join_retiring()
        for pod in self._ps_pods.values():
            self._stop(pod)
        self._wait_for_terminal(
            [*self._ps_pods.values(), *(self._worker_name(k) for k in range(self.workers.count))]
        )
        self.coordinator.close()  # a checkpoint in flight fails with the dead PS: not committed
        choice = ckpt.select_checkpoint(self.checkpoint_dir)  # committed ones only
        step = choice.step if choice is not None else 0
        with state.lock:
            before = sum(w.samples for w in state.workers.values())
            self._restore_master(state, choice)
            after = sum(w.samples for w in state.workers.values())
        self._restored_at(state, step)
        self._rebase_rates(state, self.clock() - self.start)
        ps = NodeGroup(count=self.ps.count, cpu=decision.cpu, memory_mb=decision.memory_mb)
        self._launch_all(state, ps, self.workers)
        self._starts.append(len(self.samples))
        source = f"the checkpoint of step {step:,}" if choice is not None else "the start"
        detail = (
            f"{decision.reason}: every PS restored from {source}; {before - after:,} samples "
            f"trained since are taken back and trained again; training paused "
            f"{time.monotonic() - paused:.1f}s"
        )
        self.events.append(JobEvent(time=round(t, 3), kind="relaunch", node=name, detail=detail))
        self.progress(f"{self.run_id}: {name}: {detail}")

    def _launch_all(self, state: MasterState, ps: NodeGroup, workers: NodeGroup) -> None:
        """Start the job's every pod again, after the old ones stopped: the PS, a new
        generation, then, once their pods run, the workers."""
        with state.lock:
            generation = state.generation = state.generation + 1
            state.switch = None
            state.ps_addresses.clear()
            state.num_ps = ps.count
            state.job_config = {**state.job_config, "num_ps": ps.count}
        self.ps = ps
        self._ps_pods = {}
        self._ps_gens = dict.fromkeys(range(ps.count), generation)
        for k in range(ps.count):
            self._ps_pods[k] = self._pod_name("ps", k, generation)
            self.backend.launch(self._pod("ps", k, ps, self.address, generation=generation))
        self.workers = workers

        def launch_workers() -> None:
            for k in range(workers.count):
                self._launch_worker(k, workers)

        self._wait_for_ps(state, self.clock(), launch_workers)
        self.coordinator = self._new_coordinator(state)

    def _launch_worker(self, index: int, group: NodeGroup) -> None:
        """(Re)start worker ``index`` at ``group``'s size; a stop of it is no longer ours.

        The new pod is not configured until it asks: a PS switch must not wait for it to
        pause (it cannot; it is given the new PS set once the switch is over)."""
        self._stopping.discard(self._worker_name(index))
        with self.state.lock:
            self.state.configured.pop(f"worker-{index}", None)
            # Its predecessor's reports say nothing about whether the new pod is frozen.
            self.state.usage.pop(("worker", index, 0), None)
        self.backend.launch(self._pod("worker", index, group, self.address))

    def _relaunch_worker(self, name: str, index: int, decision: Relaunch, t: float) -> None:
        self._launch_worker(
            index, NodeGroup(count=1, cpu=decision.cpu, memory_mb=decision.memory_mb)
        )
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

    def _lease_ages(self, state: MasterState) -> dict[str, float]:
        """Per worker pod, how long it has held its oldest shard without reporting it."""
        with state.lock:
            ages = state.ledger.lease_ages(self.clock())
        out: dict[str, float] = {}
        for holder, age in ages.items():
            worker = holder.split("#", 1)[0]  # "worker-3#<incarnation>"
            index = worker.rsplit("-", 1)[-1]
            if index.isdigit():
                name = self._pod_name("worker", int(index))
                out[name] = max(age, out.get(name, 0.0))
        return out

    def _shard_s(self, samples: Sequence[RuntimeSample]) -> float | None:
        """Seconds one worker takes for one shard at the median speed of the recent samples:
        shard rows / median per-worker samples/s (None before any worker made progress)."""
        speeds = [
            n.throughput
            for sample in samples
            for n in sample.nodes
            if n.role == "worker" and n.throughput
        ]
        if not speeds:
            return None
        return self.settings.shard_rows / statistics.median(speeds)

    def _decide(self, state: MasterState, t: float) -> None:
        settled = self._settled()
        if not settled:
            return
        with state.lock:
            if state.ledger.finished:
                return  # nothing left to lease: a new shape would only start idle pods
        # Stage 3 first: instability (a memory trend toward a limit, a hot PS, a straggler)
        # is acted on before any resize. It sees the settled samples since the last change.
        # Only the job's own pods: a PS a live move replaced still runs until it has persisted
        # the move's checkpoint (long, if it was starved), and is no longer the job's to move.
        ps_pods = set(self._ps_pods.values())
        current = {*ps_pods, *map(self._worker_name, range(self.workers.count))}
        recent = [
            _only(x, current) for x in settled if x.time >= self.samples[self._starts[-1]].time
        ]
        observed = Instability(
            samples=recent,
            lease_ages_s=self._lease_ages(state),
            shard_s=self._shard_s(recent),
            # A PS pod's name is its own (a moved or restored PS gets a new one): its samples
            # since it started are about it alone. The rule reads its last few telling ones.
            ps_history=[
                _only(x, ps_pods)
                for x in settled[-10 * self.planner.post_scale.starved_ps_samples :]
            ],
        )
        unstable = post_scale(self.ctx, self.plan, observed, t, self.planner)
        if unstable is not None and unstable.actions:
            if {a.kind for a in unstable.actions} == {"reassign_shards"}:
                # No pod changes: the window goes on, so that a straggler's streak can reach
                # its replacement (a new window would restart it, and it would only ever be
                # flagged again); each straggler is flagged once per window.
                window = len(self._starts)
                new = [a for a in unstable.actions if self._reassigned.get(a.node) != window]
                if new:
                    self._apply_actions(state, dataclasses.replace(unstable, actions=tuple(new)))
                return
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
        # What now runs (an abandoned PS change keeps the old PS).
        self.plan = dataclasses.replace(decision.plan, workers=self.workers, ps=self.ps)
        self.last_step = ScalingStep(
            time=applied_at,
            before=before,
            throughput_before=measured,
            kind=decision.kind,
            expected=decision.plan.predicted_throughput,
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
        ps_target = self.ps
        moved: set[int] = set()
        kind: EventKind
        roles = {s.name: (s.role, s.index) for s in self.backend.statuses()}
        for action in plan.actions:
            role, index = roles.get(action.node, ("", -1))
            if role == "ps":
                # To a new pod; the PS of a job share one size, so a bigger one moves them all.
                ps_target = NodeGroup(
                    count=ps_target.count,
                    cpu=max(ps_target.cpu, action.cpu or 0.0),
                    memory_mb=max(ps_target.memory_mb, action.memory_mb or 0),
                )
                moved.add(index)
                kind = "migration"
            elif action.kind in ("relaunch", "replace_worker"):
                index = int(action.node.rsplit("-", 1)[1])
                group = NodeGroup(
                    count=1,
                    cpu=action.cpu or self.workers.cpu,
                    memory_mb=action.memory_mb or self.workers.memory_mb,
                )
                self._stop(action.node)
                self._launch_worker(index, group)
                kind = "relaunch" if action.kind == "relaunch" else "straggler"
            else:
                # reassign_shards: taking a live worker's leases would let it and the next
                # holder both report the shard; its shards move when it is replaced instead
                # (or when a PS switch, which does not wait for it, stops it).
                self._reassigned[action.node] = len(self._starts)
                kind = "straggler"
            self.events.append(
                JobEvent(time=round(t, 3), kind=kind, node=action.node, detail=action.reason)
            )
            self.progress(f"{self.run_id}: {action.node}: {action.reason}")
        # The workers as the plan has them (Stage 3 may give some up to make room in the
        # quota), with the memory a relaunch gave any of them.
        workers = NodeGroup(
            count=min(self.workers.count, plan.workers.count),
            cpu=self.workers.cpu,
            memory_mb=max(self.workers.memory_mb, plan.workers.memory_mb),
        )
        target = dataclasses.replace(plan, workers=workers, ps=ps_target)
        if ps_target == self.ps and moved and self.migration == "live":
            # Same size: only the hot PS move, each to a new pod (a contended node left).
            self._apply(state, dataclasses.replace(target, ps=self.ps))
            for index in sorted(moved):
                change = move_ps(
                    self._current_pods(), index, self.ctx.quota_cpu, self.ctx.quota_memory_mb
                )
                self._switch_ps(state, self.ps, frozenset({index}), live=change.live)
        elif ps_target == self.ps and moved:
            self._restart_with(state, target)
        else:
            self._apply(state, target)
        self.workers = NodeGroup(
            count=self.workers.count, cpu=self.workers.cpu, memory_mb=workers.memory_mb
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
        """Turn the running pods into ``target``, in :func:`reconcile`'s order (which keeps the
        job within its quota on the way)."""
        changes = reconcile(
            self._current_pods(), target, self.ctx.quota_cpu, self.ctx.quota_memory_mb
        )
        if self.migration == "restart" and any(
            c.kind in (ChangeKind.REPARTITION_PS, ChangeKind.MIGRATE_PS) for c in changes
        ):
            self._restart_with(state, target)
            return
        for change in changes:
            name = self._worker_name(change.index)
            if change.kind is ChangeKind.REMOVE_WORKER:
                self._stop(name)
            elif change.kind is ChangeKind.REPARTITION_PS:
                self._switch_ps(state, target.ps, None, live=change.live)
            elif change.kind is ChangeKind.MIGRATE_PS:
                # One PS after another, each to a pod of the new size.
                self._switch_ps(state, target.ps, frozenset({change.index}), live=change.live)
            elif change.kind is ChangeKind.ADD_WORKER:
                self._launch_worker(change.index, target.workers)
        self.workers = target.workers

    def _restart_with(self, state: MasterState, target: ResourcePlan) -> None:
        """A PS change, stop-and-restart (see the module docstring)."""
        paused = time.monotonic()
        for k in range(self.workers.count):
            self._stop(self._worker_name(k))
        step = self._next_checkpoint_step(state)
        self.coordinator.checkpoint(step, extra=self._checkpoint_extra(state))
        self.coordinator.shutdown_ps()
        self._wait_for_terminal(list(self._ps_pods.values()))
        self.coordinator.close()
        for name in self._ps_pods.values():
            self._stopping.add(name)
        with state.lock:
            # The new PS restore the checkpoint just taken, the newest.
            state.job_config = {**state.job_config, "restore": True, "restore_choice": None}
        self._launch_all(state, target.ps, target.workers)
        pause = time.monotonic() - paused
        self.ps_pauses.append(pause)
        detail = (
            f"PS restarted ({target.ps.count} x {target.ps.cpu:g} cpu) from the checkpoint of "
            f"step {step:,}, workers restarted; training paused {pause:.2f}s"
        )
        t = round(self.clock() - self.start, 3)
        self.events.append(JobEvent(time=t, kind="migration", detail=detail))
        self.progress(f"{self.run_id}: {detail}")

    def _switch_ps(
        self,
        state: MasterState,
        target: NodeGroup,
        moved: frozenset[int] | None,
        *,
        live: bool = True,
    ) -> None:
        """A change of the PS set without restarting the workers (module docstring and
        runtime/master.py).

        ``moved`` names the PS that move to new pods of ``target``'s size; ``None`` replaces
        all of them (a new count). ``live``: the new pods start before the workers pause (the
        quota holds old and new together); otherwise the old PS stop first and the pause
        includes the new ones' start. If a new PS fails to start or restore, the switch is
        abandoned: the workers reconnect to the old PS when those still run.
        """
        self._join_retiring()  # the previous switch's checkpoint is committed
        replaced = (
            frozenset(range(target.count))
            if moved is None or target.count != self.ps.count
            else moved
        )
        retired = {k for k in self._ps_pods if k in replaced or k >= target.count}
        old_pods = [self._ps_pods[k] for k in sorted(retired)]
        with state.lock:
            generation = state.generation + 1
            # The new PS restore the switch's own checkpoint, the newest.
            config = {
                **state.job_config,
                "num_ps": target.count,
                "restore": True,
                "restore_choice": None,
            }
            switch = state.switch = PsSwitch(generation, target.count, replaced, config)
            # An abandoned switch's generation comes again: its pods' reports are not these'.
            for k in replaced:
                state.usage.pop(("ps", k, generation), None)
        new_pods = {k: self._pod_name("ps", k, generation) for k in replaced}
        for name in new_pods.values():
            self._running_since.pop(name, None)

        def launch_new() -> None:
            for k in sorted(replaced):
                pod = self._pod("ps", k, target, self.address, generation=generation)
                self.backend.launch(pod)

        if live:
            # 1. The new PS start (imports, connection) while training goes on.
            launch_new()
            if not self._await(
                state, lambda: switch.standby >= replaced, new_pods, "start", generation
            ):
                return
        # 2. The workers pause; one that does not in time is stopped (its leases return).
        paused = time.monotonic()
        with state.lock:
            switch.pausing = True
        unready = self._await_pause(state, switch)
        for name, silent_s in unready.items():
            self._stop(name)
            t = round(self.clock() - self.start, 3)
            detail = (
                "did not pause for the PS switch"
                + ("" if silent_s is None else f" (silent for {silent_s:.1f}s: frozen)")
                + ": stopped, its shards back to the queue"
            )
            self.events.append(JobEvent(time=t, kind="straggler", node=name, detail=detail))
            self.progress(f"{self.run_id}: {name}: {detail}")
        # 3. A checkpoint of the quiescent PS, from which the new ones restore: live, from its
        # snapshot in shared memory, while the old PS persist it behind (they stop after).
        step = self._next_checkpoint_step(state)
        old = self.coordinator
        try:
            if live:
                old.snapshot(step, extra=self._checkpoint_extra(state))
            else:
                old.checkpoint(step, extra=self._checkpoint_extra(state))
        except (TransientError, PermanentError, OSError) as exc:
            # A PS died or its disk failed mid-switch: no checkpoint to move from. The switch
            # is abandoned; the main loop sees the dead PS and rolls back as for any PS lost.
            self._abandon_switch(
                state, new_pods if live else {}, f"its checkpoint of step {step:,} failed: {exc}"
            )
            self._relaunch_workers(unready)
            return
        with state.lock:
            switch.released = True
        if not live:
            old.shutdown_ps(retired)
            for name in old_pods:
                self._stopping.add(name)
            self._wait_for_terminal(old_pods, timeout_s=10.0)
            launch_new()
        restored = self._await(
            state, lambda: set(switch.addresses) >= replaced, new_pods, "restore", generation
        )
        if not restored:
            if not live:
                raise JobFailedError("the PS could not be restarted from the checkpoint")
            self._relaunch_workers(unready)
            return
        # 4. The switch: the workers waiting for their configuration get the new set.
        if live:
            self._retire(old, retired, old_pods)
        else:
            old.close()
        with state.lock:
            state.ps_addresses = {
                k: switch.addresses[k] if k in replaced else state.ps_addresses[k]
                for k in range(target.count)
            }
            state.num_ps = target.count
            state.job_config = config
            state.generation = generation
            state.switch = None
        pause = time.monotonic() - paused
        self.ps = target
        self.coordinator = self._new_coordinator(state, prune_tmp=False)  # the old PS still persist
        for name in old_pods:
            self._stopping.add(name)
        self._ps_pods = {k: new_pods.get(k, self._ps_pods.get(k, "")) for k in range(target.count)}
        self._ps_gens = {
            k: generation if k in replaced else self._ps_gens.get(k, 0) for k in range(target.count)
        }
        self._relaunch_workers(unready)
        self.ps_pauses.append(pause)
        detail = (
            f"PS {', '.join(str(k) for k in sorted(replaced))} moved to new pods "
            f"({target.count} x {target.cpu:g} cpu, {target.memory_mb} MiB"
            f"{'' if live else ', after the old ones stopped'}) from the checkpoint of step "
            f"{step:,}; training paused {pause:.2f}s"
        )
        t = round(self.clock() - self.start, 3)
        self.events.append(JobEvent(time=t, kind="migration", detail=detail))
        self.progress(f"{self.run_id}: {detail}")

    def _retire(self, old: CheckpointCoordinator, retired: set[int], pods: list[str]) -> None:
        """Once the old PS have persisted the switch's checkpoint (and it is committed), stop
        the retired ones; on a thread, so that training goes on meanwhile."""

        def retire() -> None:
            try:
                old.join()
                old.shutdown_ps(retired)
            except Exception as exc:
                log.warning("stopping the old PS (their pods are deleted): %s", exc)
                for name in pods:
                    self.backend.delete(name)
            finally:
                old.close()

        thread = threading.Thread(target=retire, name="retire-ps", daemon=True)
        thread.start()
        self._retiring.append(thread)

    def _join_retiring(self) -> None:
        for thread in self._retiring:
            thread.join()
        self._retiring.clear()

    def _train(self, state: MasterState, start: float) -> None:
        super()._train(state, start)
        self._join_retiring()

    def _await(
        self,
        state: MasterState,
        done: Callable[[], bool],
        new_pods: dict[int, str],
        what: str,
        generation: int,
    ) -> bool:
        """Wait for the new PS of a switch; on failure, freezing or timeout abandon the switch.

        A new PS that is frozen (:meth:`_frozen_new_ps`) is killed and the switch abandoned
        within _FIRST_REPORT_S of its start or _SILENT_S of its freezing, not at the timeout."""
        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            with state.lock:
                if done():
                    return True
            statuses = [s for s in self.backend.statuses() if s.name in new_pods.values()]
            failed = [s for s in statuses if s.phase.terminal]
            if failed:
                reason = self._describe_failure(failed[0])
                break
            frozen = self._frozen_new_ps(state, statuses, generation)
            if frozen is not None:
                pod, reason = frozen
                self._stopping.add(pod)
                self.backend.delete(pod, grace_s=0.0)  # a frozen process ignores SIGTERM
                break
            time.sleep(0.005)
        else:
            reason = f"the new PS did not {what} within {self.settings.startup_timeout_s:.0f}s"
        self._abandon_switch(state, new_pods, reason)
        return False

    def _frozen_new_ps(
        self, state: MasterState, pods: Sequence[PodStatus], generation: int
    ) -> tuple[str, str] | None:
        """A new PS of a switch that is frozen, and why: running (by the backend) for
        _FIRST_REPORT_S without a usage report, or silent for _SILENT_S since its last one.
        Its reports come from their own thread, started before anything slow (training/node.py),
        so neither a PS loading torch nor one restoring a checkpoint is silent that long."""
        now = self.clock()
        for pod in pods:
            if pod.phase is not PodPhase.RUNNING:
                continue
            since = self._running_since.setdefault(pod.name, now)
            heard = state.last_heard("ps", pod.index, generation)
            if heard is None and now - since > _FIRST_REPORT_S:
                return pod.name, (
                    f"new PS {pod.name} frozen: no usage report within {now - since:.1f}s of "
                    "its start; killed, the old PS keep serving"
                )
            if heard is not None and now - heard > _SILENT_S:
                return pod.name, (
                    f"new PS {pod.name} frozen: no usage report for {now - heard:.1f}s; "
                    "killed, the old PS keep serving"
                )
        return None

    def _abandon_switch(self, state: MasterState, new_pods: dict[int, str], reason: str) -> None:
        """Give a PS switch up: the workers go back to the old PS, the new pods stop."""
        with state.lock:
            state.switch = None
        for name in new_pods.values():
            self._stop(name)
        t = round(self.clock() - self.start, 3)
        self.events.append(
            JobEvent(time=t, kind="failure", detail=f"PS change abandoned: {reason}")
        )
        self.progress(f"{self.run_id}: PS change abandoned: {reason}")

    def _await_pause(self, state: MasterState, switch: PsSwitch) -> dict[str, float | None]:
        """Wait until every running, configured worker has paused; the pods that did not, each
        with how long it had been silent if it was frozen (None: it was not).

        A frozen worker would hold the switch for the whole timeout, so neither a worker Stage
        3 found slow since the last change nor one that stopped reporting its usage for
        _SILENT_S is waited for: they are among the pods returned."""
        # A worker pauses once its current shard is done and reported: within one shard's time
        # at the median speed, two at half of it (the straggler rule's line). Four shards' time
        # (at least _PAUSE_MIN_S) leaves room for that, and a frozen one holds the job little.
        shard_s = self._shard_s(self.samples[-5:])
        timeout = _PAUSE_TIMEOUT_S if shard_s is None else _PAUSE_SHARDS * shard_s
        deadline = time.monotonic() + min(_PAUSE_TIMEOUT_S, max(_PAUSE_MIN_S, timeout))
        slow = {name for name, w in self._reassigned.items() if w == len(self._starts)}
        while True:
            running = [
                s
                for s in self.backend.statuses()
                if s.role == "worker" and not s.phase.terminal and s.name not in self._stopping
            ]
            with state.lock:
                waiting = [
                    s.name
                    for s in running
                    if f"worker-{s.index}" in state.configured
                    and f"worker-{s.index}" not in switch.ready
                ]
            silent = self._silent(state, running)
            if set(waiting) <= slow | silent.keys() or time.monotonic() > deadline:
                return {name: silent.get(name) for name in waiting}
            time.sleep(0.005)

    def _silent(self, state: MasterState, pods: Sequence[PodStatus]) -> dict[str, float]:
        """The worker pods of ``pods`` that have not reported their usage for _SILENT_S: how
        long. A pod that has not reported yet is not judged (it may still be starting)."""
        now = self.clock()
        out = {}
        for pod in pods:
            heard = state.last_heard("worker", pod.index)
            if heard is not None and now - heard > _SILENT_S:
                out[pod.name] = now - heard
        return out

    def _relaunch_workers(self, names: Collection[str]) -> None:
        for name in names:
            self._launch_worker(int(name.rsplit("-", 1)[1]), self.workers)

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


def _only(sample: RuntimeSample, pods: Collection[str]) -> RuntimeSample:
    """``sample`` with the nodes of ``pods`` alone."""
    return dataclasses.replace(sample, nodes=tuple(n for n in sample.nodes if n.name in pods))


__all__ = ["ElasticRun"]
