"""The elastic run: the job master applies the planner to live pods.

The loop is :class:`~dlrover_kfp.runtime.job.JobRun`'s (launch, sample, checkpoint, evaluate,
profile); :class:`ElasticPolicy` is what it does at the loop's hooks
(:class:`~dlrover_kfp.runtime.job.RunPolicy`), acting on the run's pods, master state and
record, which it is given:

* **decide**, after every runtime sample: Stage 2 (:func:`~dlrover_kfp.core.planner.auto_scale`,
  the function the simulator calls) on the samples so far; a new plan is turned into ordered pod
  changes by :func:`~dlrover_kfp.core.reconcile.reconcile` and applied:

  - worker changes are applied to the running job: a removed worker's leased shards go back to
    the queue when its connection drops (the master's ledger), a worker whose CPU changes (its
    memory kept or grown) is resized in place by the backend and goes on under the new quota;
    one whose memory shrinks, or whose resize the backend refuses, is a new pod of the new size
    under the same name; new workers lease shards as they come;
  - a PS change (count or size, or one PS moved) is applied **live**, as one protocol with
    explicit steps (:class:`~dlrover_kfp.runtime.ps_change.PsChange`):
    the new PS pods start while training goes on and copy their rows from the old PS over the
    network (each takes, from every old PS, the rows of its own partition: re-partitioned
    when the count changes), the old PS marking every row updated from then on; then the
    workers pause (each finishes its step, waits for its pushes and reports its shards), the
    new PS fetch the rows marked since their copy and the dense parameters from the now
    quiescent old PS, the workers connect to the new set and go on, and the old PS stop.
    Pods share nothing here, as on a cluster: no new PS reads an old one's memory or disk.
    Training is paused only from the workers' pause to their reconnection; nothing is trained
    twice or lost, since every push of every reported shard is in the old PS when they are
    read and no shard is leased while paused. When the quota cannot hold old and new PS
    together, the old PS checkpoint and stop first and the new ones restore the checkpoint.
  - ``migration="restart"`` applies a PS change **stop-and-restart** instead (the baseline the
    live switch is measured against): the workers are stopped (their leases return), a
    checkpoint is taken, the PS stop, the new PS start from it and the workers start again. A
    stopped worker's unreported shard is trained again from the start (its partial updates
    stay in the PS, as any asynchronous PS job's would); samples count when reported, once.

* **steadiness**: every step of Stage 2 and every Stage-3 hot-PS move to more CPU first
  passes :func:`~dlrover_kfp.core.planner.steadiness.refusal`: none too late to repay its
  measured price in the rows still to lease, no role shape re-entered within its hold unless
  the measurements contradict the move that left it. A refused step is not taken (said once).

* **instability**, before any resize: Stage 3 (:func:`~dlrover_kfp.core.planner.post_scale`)
  on the samples since its last action. A worker relaunch (a memory trend toward its limit,
  a pending pod) or replacement (a persistent straggler) is applied to that pod; a PS action
  (hot PS, memory trend) moves that PS to a new pod, live; when its new size differs from the
  others', all PS move (a job's PS share one size). Taking a slow worker's shards while it
  still runs is not applied: it and the next holder would both report the shard, and samples
  count at every report; its shards move when it is replaced. A worker no node has room for
  (Pending: a scale-up beyond the cluster's free room) holds no shard, so the job trains on
  with the pods it has; past the planner's ``pending_timeout_s`` (counted from its launch) it
  is relaunched smaller, its event naming the wait and the scheduler's message.

* **failures**: a failed worker goes to the relaunch policy
  (:func:`~dlrover_kfp.core.planner.relaunch.decide_relaunch`): relaunched as it was, bigger
  after an OOM, or the job fails after repeated failures. A failed PS (the same policy) rolls
  the whole job back to its last committed checkpoint (:meth:`_restore_from_checkpoint`):
  every PS restores it, the master restores the shard ledger and counts committed with it.
  A PS *process* that crashes while its pod runs is restarted inside the pod by the pod's
  supervisor (:mod:`~dlrover_kfp.training.supervisor`): the same rollback, but no PS pod is
  replaced and only the crashed process starts again: the other PS roll back in their running
  processes, and each restores its part of the committed step from its pod's own
  shared-memory snapshot (:meth:`_restart_in_place`).
  A *frozen* PS (SIGSTOPped, hung, its node gone: no usage report and no answer to a probe,
  :mod:`~dlrover_kfp.runtime.liveness`) is killed and handled the same way; a new PS of a
  live change that freezes abandons the change (the old PS serve on).

* **restart**: with ``resume``, a master started again on the output directory of a run whose
  master was killed goes on from that run's last committed checkpoint, at the shape and with
  the timeline committed with it (:class:`~dlrover_kfp.runtime.job.JobRun`).

Every plan applied (stage, reason, time) and every event (scale, relaunch, oom, migration,
failure) lands in the profile.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
from collections.abc import Collection, Sequence
from typing import Any

from dlrover_kfp.core.documents import parse, to_dict
from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.core.observation import Config, Observation
from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.planner import (
    PlannerSettings,
    ScalingStep,
    auto_scale,
    context_from_spec,
    throughput_before,
)
from dlrover_kfp.core.planner.auto_scale import describe, plan_config
from dlrover_kfp.core.planner.context import PlanningContext
from dlrover_kfp.core.planner.post_scale import Instability, post_scale
from dlrover_kfp.core.planner.quota import resume_within_quota
from dlrover_kfp.core.planner.relaunch import (
    ExitCause,
    FailJob,
    NoRelaunch,
    PodExit,
    Relaunch,
    decide_relaunch,
)
from dlrover_kfp.core.planner.search import InfeasiblePlanError
from dlrover_kfp.core.planner.steadiness import Move, Proposal, refusal
from dlrover_kfp.core.profile import AppliedPlan, EventKind, JobEvent, RuntimeSample
from dlrover_kfp.core.reconcile import ChangeKind, Pod, move_ps, reconcile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.core.usage import settled
from dlrover_kfp.ports import (
    Clock,
    ClusterBackend,
    PodNotFoundError,
    PodPhase,
    PodStatus,
    ResizeOutcome,
)
from dlrover_kfp.runtime.job import JobFailedError, JobRun, Progress
from dlrover_kfp.runtime.liveness import WatchedPs
from dlrover_kfp.runtime.master import MasterState
from dlrover_kfp.runtime.options import Migration, RunOptions
from dlrover_kfp.runtime.ps_change import (
    PsChange,
    pause_timeout_s,
)
from dlrover_kfp.training import checkpoint as ckpt
from dlrover_kfp.training import supervisor

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


def _resumed_shape(
    workers: NodeGroup, ps: NodeGroup, ctx: PlanningContext
) -> tuple[NodeGroup, NodeGroup, str]:
    """A resumed run's shape (:func:`resume_within_quota`) and what was changed to get it
    ("" when the checkpoint's shape fits the spec as it is now); refused where it cannot."""
    fitted = resume_within_quota(workers, ps, ctx)
    had = _shape(workers, ps)
    if not fitted.fits:
        raise InfeasiblePlanError(
            f"resources.limits: the run resumes at its checkpoint's shape ({had}), which does "
            f"not fit the quota (cpu {ctx.quota_cpu:g}, memory {ctx.quota_memory_mb}Mi) even "
            f"cut to {_shape(fitted.workers, fitted.ps)} (a resumed run keeps its PS count, "
            "whose rows the checkpoint holds); raise resources.limits, or run again with "
            "--fresh to plan the job anew"
        )
    if (fitted.workers, fitted.ps) == (workers, ps):
        return workers, ps, ""
    return (
        fitted.workers,
        fitted.ps,
        f"resumed within the spec as it is now (quota cpu {ctx.quota_cpu:g}, memory "
        f"{ctx.quota_memory_mb}Mi; workers {ctx.min_workers}-{ctx.max_workers}): the "
        f"checkpoint's shape {had} -> {_shape(fitted.workers, fitted.ps)}",
    )


def _shape(workers: NodeGroup, ps: NodeGroup) -> str:
    return f"{workers.text()} workers + {ps.text()} PS"


class ElasticPolicy:
    """What makes a run elastic (the module docstring): plans applied to live pods, failed pods
    relaunched, a failed PS rolled back. It starts from ``plan`` (Stage 1's, or the user's
    resources) and acts on the pieces of ``run`` (its pods, master state, record)."""

    def __init__(
        self,
        run: JobRun[Any],
        *,
        plan: ResourcePlan,
        planner: PlannerSettings,
        known: Sequence[Observation] = (),
        migration: Migration = "live",
    ) -> None:
        self.run = run
        self.planner = planner
        self.ctx = context_from_spec(run.spec, planner)
        extra = self.run.resume_from.extra if self.run.resume_from is not None else {}
        resumed_note = ""
        if "plan" in extra:
            # A resumed run goes on at the shape it had, with its timeline so far, within the
            # spec as it is now (a quota lowered since is honoured, or the resume refused).
            had = (
                parse(NodeGroup, extra["plan"]["workers"], "checkpoint", prefix="workers."),
                parse(NodeGroup, extra["plan"]["ps"], "checkpoint", prefix="ps."),
            )
            self.run.workers, self.run.ps, resumed_note = _resumed_shape(*had, self.ctx)
            plan = dataclasses.replace(plan, workers=self.run.workers, ps=self.run.ps)
        self.plan = plan
        self.known = tuple(known)
        self.last_step: ScalingStep | None = None
        self.plans: list[AppliedPlan] = [
            AppliedPlan(
                time=0.0, stage=plan.stage, reason=plan.reason, workers=plan.workers, ps=plan.ps
            )
        ]
        if "plans" in extra:
            self.plans = [parse(AppliedPlan, x, "checkpoint") for x in extra["plans"]]
            self.run.events = [parse(JobEvent, x, "checkpoint") for x in extra.get("events", [])]
        # The earlier master's events after its last checkpoint, from its run file's journal:
        # what happened stays in the timeline even where the training state rolls back.
        seen = set(self.run.events)
        self.run.events += [e for e in self.run.journalled if e not in seen]
        self.run.events.sort(key=lambda e: e.time)
        if resumed_note:
            t = round(self.run.earlier_s, 3)
            self.plans.append(
                AppliedPlan(
                    time=t,
                    stage=Stage.POST_SCALE,
                    reason=resumed_note,
                    workers=self.run.workers,
                    ps=self.run.ps,
                )
            )
            self.run.events.append(JobEvent(time=t, kind="scale", detail=resumed_note))
            self.run.progress(f"{self.run.run_id}: {resumed_note}")
        #: every stop handled, for the relaunch policy's failure count
        self._stops: list[PodExit] = []
        #: indices into ``samples`` where pods were (re)started: the job's start, every change
        self._starts: list[int] = [0]
        # Slow workers whose shards were sent elsewhere, with the window (len(_starts)) it was in.
        self._reassigned: dict[str, int] = {}
        #: (name, launch time) of failed pods already handled
        self._handled: set[tuple[str, float | None]] = set()
        self.migration: Migration = migration
        #: the node of each PS index: a moved PS is a new pod of a later generation
        self._ps_nodes: dict[int, NodeId] = {k: NodeId("ps", k) for k in range(plan.ps.count)}
        #: seconds training was paused by each PS change
        self.ps_pauses: list[float] = []
        #: threads stopping the PS a switch replaced, once their checkpoint is committed
        self._retiring: list[threading.Thread] = []
        #: whether a worker's CPU change is applied in place (the backend's resize): assumed
        #: until the backend refuses one, then a replacement for the rest of the run; Stage 2
        #: prices CPU changes by it (auto_scale's ``resize_in_place``)
        self.resize_in_place = True
        #: the shape changes applied (Stage 2's steps, Stage 3's PS moves): what the
        #: steadiness rules price steps by and hold left shapes against
        self.moves: list[Move] = []
        #: the target of the last step refused, said once
        self._said: Config | None = None

    # -- the hooks of the run's loop ----------------------------------------------------------

    def checkpoint_extra(self) -> dict[str, Any]:
        """The shape and timeline a resumed run goes on with."""
        return {
            "plan": {"workers": to_dict(self.run.workers), "ps": to_dict(self.run.ps)},
            "plans": [to_dict(x) for x in self.plans],
            "events": [to_dict(x) for x in self.run.events],
        }

    # -- failures -------------------------------------------------------------------------

    def handle_failures(self, statuses: list[PodStatus], t: float) -> None:
        if self._restart_in_place(statuses, t):
            return  # every PS restarted and every worker was replaced: the statuses are stale
        for status in statuses:
            decision = self._failed(status, t)
            if decision is None or isinstance(decision, NoRelaunch):
                continue
            if status.role == "ps":
                self._restore_from_checkpoint(status.name, decision, t)
                return  # every pod was replaced: the statuses seen are stale
            self._relaunch_worker(status.name, status.index, decision, t)
        self._handle_frozen_ps(t)

    def handle_failed_workers(self, statuses: Sequence[PodStatus]) -> None:
        """Failed worker pods seen while the master's loop is held (a PS change waiting on its
        new PS or on the workers' pause, a resize): each is handled as the loop would have,
        an event with its cause, counted against the relaunch budget, relaunched (a worker
        relaunched during a change is told to wait and gets the new PS set after it). PS are
        not handled here: a PS that fails mid-change is the loop's, after the change."""
        t = self.run.t()
        self.handle_failures([s for s in statuses if s.role == "worker"], t)

    def _failed(self, status: PodStatus, t: float) -> Relaunch | NoRelaunch | None:
        """The failure of ``status``, decided once per pod (:meth:`_decide_stop`); None if the
        pod did not fail, the run stopped it, or its failure was handled already."""
        if status.phase is not PodPhase.FAILED or status.name in self.run.stopping:
            return None
        key = (status.name, status.started_at)
        if key in self._handled:
            return None
        self._handled.add(key)
        return self._decide_stop(status, t)

    def _decide_stop(self, status: PodStatus, t: float) -> Relaunch | NoRelaunch:
        """A failed pod's event (``oom`` or ``failure``, with the cause from its log) and the
        relaunch policy's decision; raises :class:`JobFailedError` when the job must stop."""
        cause = _CAUSES.get(status.reason or "Error", ExitCause.ERROR)
        group = self.run.ps if status.role == "ps" else self.run.workers
        launched = self.run.launched.get(status.name)
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
        self.run.events.append(
            JobEvent(
                time=round(t, 3),
                kind="oom" if cause is ExitCause.OOM_KILLED else "failure",
                node=status.name,
                detail=self.run.describe_failure(status),
            )
        )
        decision = decide_relaunch(
            stop, self._stops, self.planner, memory_room_mb=self._memory_room_mb()
        )
        self._stops.append(stop)
        if isinstance(decision, FailJob):
            raise JobFailedError(decision.reason)
        return decision

    def _memory_room_mb(self) -> int:
        """MiB the job's memory quota leaves beyond its pods' memory, each pod at what it was
        last launched with (a pod relaunched after an OOM holds more than its group)."""
        pods = [(self.run.worker_name(k), self.run.workers) for k in range(self.run.workers.count)]
        pods += [(name, self.run.ps) for name in self._ps_pod_names()]
        launched = self.run.launched
        held = sum(launched[n].memory_mb if n in launched else g.memory_mb for n, g in pods)
        return self.ctx.quota_memory_mb - held

    def start_failed(self, pod: PodStatus) -> None:
        """A pod failed before every PS registered. A PS (OOM-killed building its rows: the
        model's footprint estimate was below what it really needs) goes to the relaunch policy
        as one failing while training does: relaunched in place, bigger after an OOM, with its
        event, or the job fails after repeated failures. No worker has trained on this PS set
        yet, so nothing rolls back."""
        key = (pod.name, pod.started_at)
        if pod.role != "ps":
            raise JobFailedError(self.run.describe_failure(pod))
            return
        if key in self._handled:
            return  # already relaunched: the backend still shows the old pod
        self._handled.add(key)
        # On the run's timeline, from the wall clock: the loop's own clock starts with training.
        t = max(0.0, (pod.finished_at or self.run.clock.now()) - self.run.started_wall)
        decision = self._decide_stop(pod, t)
        if isinstance(decision, NoRelaunch):  # a PS that exits 0 before it serves
            raise JobFailedError(self.run.describe_failure(pod))
            return
        state = self.run.state
        with state.lock:
            state.ps_addresses.pop(pod.index, None)  # it may have registered before it died
            generation = state.generation
        group = NodeGroup(count=1, cpu=decision.cpu, memory_mb=decision.memory_mb)
        self.run.launch(NodeId("ps", pod.index, generation), group)
        self.run.ps = dataclasses.replace(
            self.run.ps, memory_mb=max(self.run.ps.memory_mb, group.memory_mb)
        )
        self.plan = dataclasses.replace(self.plan, ps=self.run.ps)
        self.run.events.append(
            JobEvent(time=round(t, 3), kind="relaunch", node=pod.name, detail=decision.reason)
        )
        self.run.progress(f"{self.run.run_id}: {decision.reason}")

    def _ps_pod_names(self) -> list[str]:
        """The pods of the job's PS set, by index."""
        return [self.run.pod_name(node) for _, node in sorted(self._ps_nodes.items())]

    def _watched_ps(self) -> dict[int, WatchedPs]:
        return {
            k: WatchedPs(index=k, generation=node.generation, pod=self.run.pod_name(node))
            for k, node in self._ps_nodes.items()
        }

    def _handle_frozen_ps(self, t: float) -> None:
        """A frozen PS (:mod:`~dlrover_kfp.runtime.liveness`) is a failed one: it is killed at
        once (a frozen process cannot act on SIGTERM) and the job rolls back to its last
        checkpoint, as for a PS that died. It counts against the job as an error exit would:
        a PS that keeps freezing ends the job instead of rolling it back again and again.

        Called from the main loop only, between switches and rollbacks (both run on this
        thread), so neither is ever handled twice."""
        frozen = self.run.ps_watch.frozen(self._watched_ps())
        if frozen is None:
            return
        detail = self.run.kill_frozen(frozen)
        t = self.run.events[-1].time
        self.run.progress(f"{self.run.run_id}: {frozen.pod}: {detail}")
        decision = self._ps_stopped(frozen.pod, t)
        if isinstance(decision, FailJob):
            raise JobFailedError(decision.reason.replace("exited with an error", "froze"))
        if isinstance(decision, Relaunch):
            # The policy's words are an error exit's; its count (the last parenthesis) holds.
            count = decision.reason[decision.reason.rfind(" (") :]
            reason = f"{frozen.pod} froze: relaunched as it was{count}"
            self._restore_from_checkpoint(
                frozen.pod, dataclasses.replace(decision, reason=reason), t
            )

    def _ps_stopped(self, pod: str, t: float) -> Relaunch | NoRelaunch | FailJob:
        """The relaunch policy's decision on a PS that ended without a pod status to tell why
        (frozen and killed, or its process crashed inside a running pod), counted as an error
        exit: a PS that keeps failing ends the job instead of rolling it back again and again."""
        stop = PodExit(
            node=pod,
            role="ps",
            cause=ExitCause.ERROR,
            exit_code=None,
            time=t,
            cpu=self.run.ps.cpu,
            memory_mb=self.run.ps.memory_mb,
        )
        decision = decide_relaunch(stop, self._stops, self.planner)
        self._stops.append(stop)
        return decision

    def _restart_in_place(self, statuses: list[PodStatus], t: float) -> bool:
        """A PS process that ended while its pod runs: its pod's supervisor
        (training/supervisor.py) starts it again there, where its shared-memory snapshot is.

        The job rolls back to its last committed checkpoint as for a failed PS
        (:meth:`_roll_back`: the workers replaced, the ledger and counts restored), but no PS
        pod is replaced and only the crashed PS's process starts again: once the workers
        stopped, the other PS roll back in their running processes (a ``restore`` request
        through the checkpoint coordinator's connections,
        :meth:`~dlrover_kfp.runtime.checkpoints.CheckpointCoordinator.roll_back`), keeping their
        address and their snapshot buffer. Every PS restores its own part of the committed
        step from its pod's snapshot when that is exactly it, else from the volume. A process's
        start (the interpreter, torch: seconds at a fraction of a core) is then paid once, by
        the PS that crashed, not by every PS. A PS that does not roll back in place (it died
        too, or failed the restore and was asked to restart) serves again once it registers;
        a PS whose pod fails meanwhile is relaunched as one failing at the start is
        (:meth:`~dlrover_kfp.runtime.job.JobRun.wait_for_ps`). True when it handled one."""
        state = self.run.state
        with state.lock:
            lost = state.lost_ps()
            crashed = {k for k, why in state.restarting.items() if why != supervisor.ASKED}
        index = min({*lost, *crashed}, default=None)
        if index is None:
            return False
        pod = self.run.pod_name(self._ps_nodes[index])
        running = {s.name for s in statuses if s.phase is PodPhase.RUNNING}
        if pod not in running or pod in self.run.stopping:
            return False  # its pod ended (the loop handles it) or is being stopped
        decision = self._ps_stopped(pod, t)
        if not isinstance(decision, Relaunch):
            raise JobFailedError(decision.reason.replace("exited with an error", "crashed"))
        paused = self.run.clock.monotonic()
        lost_at = lost.get(index, paused)
        with state.lock:  # workers started from now on wait for the restarted PS
            state.ps_addresses.pop(index, None)
        workers = [self.run.worker_name(k) for k in range(self.run.workers.count)]
        for name in workers:
            self.run.stop(name, "rollback")
        self._join_retiring()
        self.run.wait_for_terminal(workers)  # no push may land after a PS rolled back
        every = set(range(self.run.ps.count))
        choice, rolled = self.run.coordinator.roll_back(every - {index})
        with state.lock:
            for k in every - set(rolled):  # each serves again once it registers
                state.ps_addresses.pop(k, None)
            state.restored_from.clear()
            state.restored_from.update({k: where for k, (where, _) in rolled.items()})
        taken = self._roll_back(state, choice)
        with state.lock:
            # Each restarted PS now gets the committed step to restore as soon as it asks.
            state.restart_released = True
        # The new workers start while the PS do (their pods run); they get no shard before
        # every PS serves again. A PS pod that fails meanwhile is relaunched as at the start.
        self.run.wait_for_ps(state, self.run.clock.monotonic(), self._launch_workers)
        serving_s = self.run.clock.monotonic() - lost_at
        with state.lock:
            restored = dict(state.restored_from)
            cause = state.restarting.get(index) or "its process ended"
            state.restart_released = False
            state.restarting.clear()
            state.ps_lost.clear()
        self.run.coordinator = self.run.new_coordinator(state)
        self._starts.append(len(self.run.samples))
        where = [restored.get(k, "") for k in range(self.run.ps.count)]
        source = (
            f"the checkpoint of step {choice.step:,} ({where.count('memory')} from memory, "
            f"{where.count('volume')} from the volume)"
            if choice is not None
            else "the start"
        )
        source += f", {len(rolled)} in its running process"
        detail = (
            f"{NodeId('ps', index).key} crashed ({cause}) and was restarted in its pod: every "
            f"PS restored from {source}, serving again in {serving_s:.2f}s; {taken:,} samples "
            f"trained since are taken back and trained again; training paused "
            f"{self.run.clock.monotonic() - paused:.1f}s"
        )
        self.run.events.append(JobEvent(time=round(t, 3), kind="relaunch", node=pod, detail=detail))
        self.run.progress(f"{self.run.run_id}: {pod}: {detail}")
        return True

    def _roll_back(self, state: MasterState, choice: ckpt.CheckpointChoice | None) -> int:
        """The master's side of a rollback to ``choice`` (the last committed checkpoint, None:
        the job's start), once the workers stopped: the ledger and counts committed with it,
        the rates rebased. Returns the samples taken back (reported since it, to be trained
        and counted again)."""
        with state.lock:
            before = sum(w.samples for w in state.workers.values())
            self.run.restore_master(state, choice)
            after = sum(w.samples for w in state.workers.values())
        self.run.restored_at(state, choice.step if choice is not None else 0)
        self.run.rebase_rates(state, self.run.clock.monotonic() - self.run.start)
        return before - after

    def _restore_from_checkpoint(self, name: str, decision: Relaunch, t: float) -> None:
        """A PS died: the job goes back to its last committed checkpoint, all of it.

        The dead PS's rows since the checkpoint are lost, so every PS restores that checkpoint
        (a consistent model), and the master restores the shard ledger and the per-worker
        counts committed with it: the shards done since are trained again and their samples,
        taken back, are counted once, when they are done again. Without a committed
        checkpoint the job starts over from its initial parameters and an empty ledger.
        """
        state = self.run.state
        paused = self.run.clock.monotonic()
        for k in range(self.run.workers.count):
            self.run.stop(self.run.worker_name(k), "rollback")
        self._join_retiring()
        for pod in self._ps_pod_names():
            self.run.stop(pod)
        self.run.wait_for_terminal(
            [
                *self._ps_pod_names(),
                *(self.run.worker_name(k) for k in range(self.run.workers.count)),
            ],
        )
        with state.lock:
            lost_at = min(state.lost_ps().values(), default=paused)
        self.run.coordinator.close()  # a checkpoint in flight fails with the dead PS: not committed
        # committed ones only, whose ledger is this run's split
        choice = ckpt.select_checkpoint(self.run.checkpoint_dir, accept=self.run.check_committed)
        taken = self._roll_back(state, choice)
        ps = NodeGroup(count=self.run.ps.count, cpu=decision.cpu, memory_mb=decision.memory_mb)
        self._launch_all(state, ps, self.run.workers)
        serving_s = self.run.clock.monotonic() - lost_at
        self._starts.append(len(self.run.samples))
        source = f"the checkpoint of step {choice.step:,}" if choice is not None else "the start"
        detail = (
            f"{decision.reason}: every PS restored from {source}, serving again in "
            f"{serving_s:.2f}s; {taken:,} samples trained since are taken back and trained "
            f"again; training paused {self.run.clock.monotonic() - paused:.1f}s"
        )
        self.run.events.append(
            JobEvent(time=round(t, 3), kind="relaunch", node=name, detail=detail)
        )
        self.run.progress(f"{self.run.run_id}: {name}: {detail}")

    def _launch_all(self, state: MasterState, ps: NodeGroup, workers: NodeGroup) -> None:
        """Start the job's every pod again, after the old ones stopped: the PS, a new
        generation, then, once their pods run, the workers."""
        with state.lock:
            generation = state.generation = state.generation + 1
            state.switch = None
            state.ps_addresses.clear()
            # Whatever the old set's processes said (lost, restarting) ends with them.
            state.ps_lost.clear()
            state.restarting.clear()
            state.restart_released = False
            state.num_ps = ps.count
            state.job_config = {**state.job_config, "num_ps": ps.count}
        self.run.ps = ps
        self._ps_nodes = {k: NodeId("ps", k, generation) for k in range(ps.count)}
        for k in range(ps.count):
            self.run.launch(self._ps_nodes[k], ps)
        self.run.workers = workers
        self.run.wait_for_ps(state, self.run.clock.monotonic(), self._launch_workers)
        self.run.coordinator = self.run.new_coordinator(state)

    def _launch_workers(self) -> None:
        """Start every worker of the job's worker group (after a rollback stopped them)."""
        for k in range(self.run.workers.count):
            self._launch_worker(k, self.run.workers)

    def _launch_worker(self, index: int, group: NodeGroup) -> None:
        """(Re)start worker ``index`` at ``group``'s size (a stop of it is no longer ours:
        :meth:`JobRun.launch`).

        The new pod is not configured until it asks: a PS switch must not wait for it to
        pause (it cannot; it is given the new PS set once the switch is over)."""
        with self.run.state.lock:
            self.run.state.configured.pop(NodeId.worker(index).key, None)
            # Its predecessor's reports say nothing about whether the new pod is frozen.
            self.run.state.usage.pop(NodeId.worker(index), None)
        self.run.launch(NodeId.worker(index), group)

    def _relaunch_worker(self, name: str, index: int, decision: Relaunch, t: float) -> None:
        self._launch_worker(
            index, NodeGroup(count=1, cpu=decision.cpu, memory_mb=decision.memory_mb)
        )
        self._starts.append(len(self.run.samples))
        self.run.events.append(
            JobEvent(time=round(t, 3), kind="relaunch", node=name, detail=decision.reason)
        )
        self.run.progress(f"{self.run.run_id}: {decision.reason}")

    # -- decisions --------------------------------------------------------------------------

    def _settled(self) -> list[RuntimeSample]:
        """The samples that tell a shape's steady behaviour.

        After every start of pods (the job's, a resize's, a relaunch's) the samples until the
        first trained shard say nothing about the shape's speed (processes starting, the first
        rows being read), the first one with progress is partial, and a new process's memory
        grows while it loads and warms up, which is no trend toward a limit. Those samples are
        left out of what Stage 2 and Stage 3 see.
        """
        out: list[RuntimeSample] = []
        for k, start in enumerate(self._starts):
            end = self._starts[k + 1] if k + 1 < len(self._starts) else len(self.run.samples)
            out.extend(settled(self.run.samples[start:end]))
        return out

    def _lease_ages(self, state: MasterState) -> dict[str, float]:
        """Per worker pod, how long it has held its oldest shard without reporting it."""
        with state.lock:
            ages = state.ledger.lease_ages(self.run.clock.monotonic())
        out: dict[str, float] = {}
        for holder, age in ages.items():
            node = NodeId.from_holder(holder)
            if node is not None and node.role == "worker":
                name = self.run.pod_name(node)
                out[name] = max(age, out.get(name, 0.0))
        return out

    def _pending(self, workers: Collection[str]) -> tuple[dict[str, float], dict[str, str]]:
        """The job's worker pods (of ``workers``) still Pending: seconds since this master
        launched each, and why where the cluster says (its scheduler's message:
        :attr:`~dlrover_kfp.ports.PodStatus.message`), for Stage 3's pending rule. The job
        trains on meanwhile with the workers that run; a pending one only holds no shard.

        Workers only: a PS is waited for where it is started, and that wait is bounded and says
        why (the job's start or a rollback: the startup timeout; a live PS change: abandoned
        after :data:`~dlrover_kfp.runtime.ps_change.PENDING_S`), so none is pending here."""
        now = self.run.clock.monotonic()
        waited: dict[str, float] = {}
        why: dict[str, str] = {}
        for pod in self.run.backend.statuses():
            since = self.run.launched_at.get(pod.name)
            if pod.phase is not PodPhase.PENDING or pod.name not in workers or since is None:
                continue
            if pod.name in self.run.stopping:
                continue
            waited[pod.name] = now - since
            if pod.message:
                why[pod.name] = pod.message
        return waited, why

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
        return self.run.settings.shard_rows / statistics.median(speeds)

    def decide(self, t: float) -> None:
        state = self.run.state
        settled = self._settled()
        workers = {*map(self.run.worker_name, range(self.run.workers.count))}
        pending_s, pending_why = self._pending(workers)
        if not settled and not pending_s:
            return
        with state.lock:
            if state.ledger.finished:
                return  # nothing left to lease: a new shape would only start idle pods
        # Stage 3 first: instability (a memory trend toward a limit, a hot PS, a straggler)
        # is acted on before any resize. It sees the settled samples since the last change.
        # Only the job's own pods: a PS a live move replaced still runs until it has persisted
        # the move's checkpoint (long, if it was starved), and is no longer the job's to move.
        ps_pods = set(self._ps_pod_names())
        current = {*ps_pods, *workers}
        recent = [
            _only(x, current) for x in settled if x.time >= self.run.samples[self._starts[-1]].time
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
            pending_s=pending_s,
            pending_why=pending_why,
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
            unstable = self._steady_actions(unstable, settled, t)
        if unstable is not None and unstable.actions:
            before, rate, started = (
                self.plan,
                throughput_before(settled, self.planner),
                self._mark(),
            )
            self._apply_actions(state, unstable)
            self._starts.append(len(self.run.samples))
            if plan_config(self.plan) != plan_config(before):  # a PS moved to another size
                grew = self.plan.total_cpu > before.total_cpu
                step = ScalingStep(
                    time=self.run.clock.monotonic() - self.run.start,
                    before=before,
                    throughput_before=rate,
                    kind="grow" if grew else "give_back",
                )
                self._moved(step, started)
            return
        if not settled:
            return  # only pending pods to judge: no speed measured for Stage 2 yet
        decision = auto_scale(
            self.ctx,
            self.plan,
            settled,
            t,
            self.planner,
            last_step=self.last_step,
            known=self.known,
            resize_in_place=self.resize_in_place,
        )
        if decision.plan is None:
            return
        measured = throughput_before(settled, self.planner)
        before = self.plan
        proposal = self._proposal(
            decision.plan,
            measured,
            decision.plan.predicted_throughput,
            in_place=decision.in_place and self.resize_in_place,
        )
        if self._refused(proposal, t):
            return
        started = self._mark()
        self.run.progress(f"{self.run.run_id}: plan at {t:.0f}s: {decision.plan.reason}")
        self._apply(state, decision.plan)
        self._starts.append(len(self.run.samples))
        applied_at = self.run.clock.monotonic() - self.run.start
        # What now runs (an abandoned PS change keeps the old PS), and the event says so: a
        # step's record names the shape applied, not one that never ran.
        applied = plan_config(
            dataclasses.replace(decision.plan, workers=self.run.workers, ps=self.run.ps)
        )
        reason = decision.plan.reason
        if applied != plan_config(decision.plan):
            reason += (
                f"; applied as {describe(applied)}: its PS part was abandoned (the failure"
                " event says why)"
            )
        self.plan = dataclasses.replace(
            decision.plan, workers=self.run.workers, ps=self.run.ps, reason=reason
        )
        self.last_step = ScalingStep(
            time=applied_at,
            before=before,
            throughput_before=measured,
            kind=decision.kind,
            expected=decision.plan.predicted_throughput,
            # In place unless the backend refused a resize of it (then replaced).
            in_place=decision.in_place and self.resize_in_place,
        )
        self._moved(self.last_step, started)
        self.plans.append(
            AppliedPlan(
                time=round(applied_at, 3),
                stage=self.plan.stage,
                reason=self.plan.reason,
                workers=self.plan.workers,
                ps=self.plan.ps,
            )
        )
        self.run.events.append(
            JobEvent(time=round(applied_at, 3), kind="scale", detail=self.plan.reason)
        )

    # -- steadiness: no step too late to repay, no flip-flop (core/planner/steadiness.py) ----

    def _proposal(
        self, target: ResourcePlan, rate_now: float, rate_new: float | None, *, in_place: bool
    ) -> Proposal:
        """The step from the running plan to ``target``, as the steadiness rules judge it."""
        share = self.ctx.dominant_share
        return Proposal(
            before=plan_config(self.plan),
            after=plan_config(target),
            rate_now=rate_now,
            rate_new=rate_new,
            share_now=share(self.plan.total_cpu, self.plan.total_memory_mb),
            share_new=share(target.total_cpu, target.total_memory_mb),
            in_place=in_place,
        )

    def _refused(self, proposal: Proposal, t: float) -> bool:
        """Whether ``proposal`` must not be taken now: re-entering a held shape, or too late to
        repay its price in the rows still to lease. Said once per target shape (a stage
        proposes it again at every decision while the reason stands)."""
        with self.run.state.lock:
            rows = self.run.state.ledger.rows_to_lease
        why = refusal(proposal, self.moves, self.run.samples, t, rows, self.planner)
        if why is not None and proposal.after != self._said:
            self.run.progress(
                f"{self.run.run_id}: step to {describe(proposal.after)} not taken: {why}"
            )
        self._said = proposal.after if why is not None else None
        return why is not None

    def _steady_actions(
        self, plan: ResourcePlan, settled: Sequence[RuntimeSample], t: float
    ) -> ResourcePlan | None:
        """Stage 3's ``plan`` without a hot-PS move to more CPU that the steadiness rules
        refuse. Stage 3 predicts no rate; the one the move is judged by is the most it could
        reach: X0 · new CPU / old CPU, the PS the only bottleneck (so only moves that could
        not repay even then are refused). Fault repairs (OOM, a starved, frozen or pending
        pod, a straggler) are never refused."""
        grown = [
            a for a in plan.actions if a.kind == "migrate_ps" and (a.cpu or 0) > self.run.ps.cpu
        ]
        if not grown:
            return plan
        cpu = max(a.cpu or 0.0 for a in grown)
        rate = throughput_before(settled, self.planner)
        target = dataclasses.replace(self.plan, ps=dataclasses.replace(self.run.ps, cpu=cpu))
        proposal = self._proposal(target, rate, rate * cpu / self.run.ps.cpu, in_place=False)
        if not self._refused(proposal, t):
            return plan
        kept = tuple(a for a in plan.actions if a not in grown)
        return dataclasses.replace(plan, actions=kept) if kept else None

    def _mark(self) -> tuple[float, int]:
        """(monotonic time, samples trained) when a step starts being applied."""
        return self.run.clock.monotonic(), self.run.state.totals()[0]

    def _moved(self, step: ScalingStep, started: tuple[float, int]) -> None:
        """Record an applied move, with the training it lost while it was applied: the
        seconds elapsed less the samples trained meanwhile at the rate before it."""
        t0, n0 = started
        elapsed = self.run.clock.monotonic() - t0
        trained = self.run.state.totals()[0] - n0
        rate = step.throughput_before
        lost = max(0.0, elapsed - trained / rate) if rate > 0 else 0.0
        self.moves.append(
            Move(
                step=step,
                before=plan_config(step.before),
                after=plan_config(self.plan),
                apply_lost_s=lost,
            )
        )

    def _apply_actions(self, state: MasterState, plan: ResourcePlan) -> None:
        """Stage 3's node actions (see :mod:`dlrover_kfp.core.planner.post_scale`)."""
        t = self.run.clock.monotonic() - self.run.start
        ps_target = self.run.ps
        moved: set[int] = set()
        kind: EventKind
        roles = {s.name: (s.role, s.index) for s in self.run.backend.statuses()}
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
                index = self._worker_index(action.node)
                group = NodeGroup(
                    count=1,
                    cpu=action.cpu or self.run.workers.cpu,
                    memory_mb=action.memory_mb or self.run.workers.memory_mb,
                )
                self.run.stop(action.node, "relaunch" if action.kind == "relaunch" else "straggler")
                self._launch_worker(index, group)
                kind = "relaunch" if action.kind == "relaunch" else "straggler"
            else:
                # reassign_shards: taking a live worker's leases would let it and the next
                # holder both report the shard; its shards move when it is replaced instead
                # (or when a PS switch, which does not wait for it, stops it).
                self._reassigned[action.node] = len(self._starts)
                kind = "straggler"
            self.run.events.append(
                JobEvent(time=round(t, 3), kind=kind, node=action.node, detail=action.reason)
            )
            self.run.progress(f"{self.run.run_id}: {action.node}: {action.reason}")
        # The workers as the plan has them (Stage 3 may give some up to make room in the
        # quota), with the memory a relaunch gave any of them.
        workers = NodeGroup(
            count=min(self.run.workers.count, plan.workers.count),
            cpu=self.run.workers.cpu,
            memory_mb=max(self.run.workers.memory_mb, plan.workers.memory_mb),
        )
        target = dataclasses.replace(plan, workers=workers, ps=ps_target)
        if ps_target == self.run.ps and moved and self.migration == "live":
            # Same size: only the hot PS move, each to a new pod (a contended node left).
            self._apply(state, dataclasses.replace(target, ps=self.run.ps))
            for index in sorted(moved):
                change = move_ps(
                    self._current_pods(), index, self.ctx.quota_cpu, self.ctx.quota_memory_mb
                )
                self._switch_ps(self.run.ps, frozenset({index}), live=change.live)
        elif ps_target == self.run.ps and moved:
            self._restart_with(state, target)
        else:
            self._apply(state, target)
        self.run.workers = NodeGroup(
            count=self.run.workers.count, cpu=self.run.workers.cpu, memory_mb=workers.memory_mb
        )
        self.plan = dataclasses.replace(plan, workers=self.run.workers, ps=self.run.ps)
        applied = round(self.run.clock.monotonic() - self.run.start, 3)
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
            Pod(
                role="worker",
                index=k,
                cpu=self.run.workers.cpu,
                memory_mb=self.run.workers.memory_mb,
            )
            for k in range(self.run.workers.count)
        ]
        pods += [
            Pod(role="ps", index=k, cpu=self.run.ps.cpu, memory_mb=self.run.ps.memory_mb)
            for k in range(self.run.ps.count)
        ]
        return pods

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
        statuses: dict[str, PodStatus] | None = None  # read once, at the first resize
        for change in changes:
            name = self.run.worker_name(change.index)
            if change.kind is ChangeKind.REMOVE_WORKER:
                # Beyond the new count: a scale-in; else replaced at its new size (a step).
                beyond = change.index >= target.workers.count
                self.run.stop(name, "scale-in" if beyond else "scale")
            elif change.kind is ChangeKind.REPARTITION_PS:
                self._switch_ps(target.ps, None, live=change.live)
            elif change.kind is ChangeKind.MIGRATE_PS:
                # One PS after another, each to a pod of the new size.
                self._switch_ps(target.ps, frozenset({change.index}), live=change.live)
            elif change.kind is ChangeKind.RESIZE_WORKER:
                # After any PS change above: a worker may have died while it held the loop.
                if statuses is None:
                    statuses = {s.name: s for s in self.run.backend.statuses()}
                group = NodeGroup(count=1, cpu=change.cpu, memory_mb=change.memory_mb)
                self._resize_worker(change.index, group, statuses.get(name))
            elif change.kind is ChangeKind.ADD_WORKER:
                self._launch_worker(change.index, target.workers)
        self.run.workers = target.workers

    def _resize_worker(self, index: int, group: NodeGroup, status: PodStatus | None = None) -> None:
        """Worker ``index`` to ``group``'s size in place: the backend's ``resize``; the same
        process goes on under the new quota and sizes its threads to it (training/node.py),
        with no start-up and no shard read again. Where the backend refuses (an older cluster,
        a node without room, see :class:`~dlrover_kfp.ports.ResizeOutcome`) or the pod is not
        running, it is replaced as before: stopped, and started again at the new size. After
        a refusal the planner prices every CPU change as a replacement (``resize_in_place``).
        ``status``: the pod as last read; a pod that failed (while a PS change held the loop)
        is a failure, counted, and relaunched at the new size, not a refused resize."""
        name = self.run.worker_name(index)
        t = self.run.t()
        decision = None if status is None else self._failed(status, t)
        if isinstance(decision, Relaunch):
            memory_mb = max(group.memory_mb, decision.memory_mb)
            grown = dataclasses.replace(decision, cpu=group.cpu, memory_mb=memory_mb)
            self._relaunch_worker(name, index, grown, t)
            return
        not_running = False
        try:
            outcome = self.run.backend.resize(name, group.cpu, group.memory_mb)
        except PodNotFoundError:
            outcome = ResizeOutcome(in_place=False, reason="not running")
            not_running = True
        if outcome.in_place:
            launched = self.run.launched.get(name)
            if launched is not None:  # what its self-reported usage is requested against
                self.run.launched[name] = dataclasses.replace(
                    launched, cpu=group.cpu, memory_mb=group.memory_mb
                )
            detail = f"{name} resized in place to {group.cpu:g} cpu in {outcome.seconds:.2f}s"
        else:
            # A pod not running (starting, just relaunched) says nothing of the backend.
            self.resize_in_place = self.resize_in_place and not_running
            self.run.stop(name, "scale")
            self._launch_worker(index, group)
            detail = f"{name}: in-place resize refused ({outcome.reason}): replaced"
        self.run.events.append(
            JobEvent(time=round(self.run.t(), 3), kind="scale", node=name, detail=detail)
        )
        self.run.progress(f"{self.run.run_id}: {detail}")

    def _restart_with(self, state: MasterState, target: ResourcePlan) -> None:
        """A PS change, stop-and-restart (see the module docstring)."""
        paused = self.run.clock.monotonic()
        for k in range(self.run.workers.count):
            self.run.stop(self.run.worker_name(k), "migration")
        step = self.run.next_checkpoint_step(state)
        self.run.coordinator.checkpoint(step, extra=self.run.checkpoint_extra(state))
        self.run.coordinator.shutdown_ps()
        self.run.wait_for_terminal(self._ps_pod_names())
        self.run.coordinator.close()
        for name in self._ps_pod_names():
            self.run.stopping.add(name)
        with state.lock:
            # The new PS restore the checkpoint just taken, the newest.
            state.job_config = {**state.job_config, "restore": True, "restore_choice": None}
        self._launch_all(state, target.ps, target.workers)
        pause = self.run.clock.monotonic() - paused
        self.ps_pauses.append(pause)
        detail = (
            f"PS restarted ({target.ps.count} x {target.ps.cpu:g} cpu) from the checkpoint of "
            f"step {step:,}, workers restarted; training paused {pause:.2f}s"
        )
        t = round(self.run.clock.monotonic() - self.run.start, 3)
        self.run.events.append(JobEvent(time=t, kind="migration", detail=detail))
        self.run.progress(f"{self.run.run_id}: {detail}")

    def _switch_ps(
        self, target: NodeGroup, moved: frozenset[int] | None, *, live: bool = True
    ) -> None:
        """A change of the PS set without restarting the workers, live or stop-first: one
        :class:`~dlrover_kfp.runtime.ps_change.PsChange` (the protocol: its module docstring).

        ``moved`` names the PS that move to new pods of ``target``'s size; ``None`` replaces
        all of them (a new count). The policy keeps what the change leaves: the PS nodes, the
        pause, the thread stopping the old PS; the workers it stopped for not pausing are
        launched again."""
        self._join_retiring()  # the previous change's old PS have stopped
        outcome = self._ps_change(target, moved, live=live).carry_out()
        if outcome.retiring is not None:
            self._retiring.append(outcome.retiring)
        self._ps_nodes = dict(outcome.ps_nodes)
        self._relaunch_workers(outcome.stopped_workers)
        if outcome.pause_s is not None:
            self.ps_pauses.append(outcome.pause_s)

    def _ps_change(
        self, target: NodeGroup, moved: frozenset[int] | None, *, live: bool
    ) -> PsChange:
        """The change :meth:`_switch_ps` carries out, from the PS serving now. The workers'
        pause is bounded by four shards' time at the recent median speed, and the ones Stage 3
        found slow since the last change are not waited for (a frozen one would hold it)."""
        return PsChange(
            self.run,
            ps_nodes=self._ps_nodes,
            target=target,
            moved=moved,
            live=live,
            pause_timeout=pause_timeout_s(self._shard_s(self.run.samples[-5:])),
            slow={name for name, w in self._reassigned.items() if w == len(self._starts)},
            on_failed_workers=self.handle_failed_workers,
        )

    def _join_retiring(self) -> None:
        for thread in self._retiring:
            thread.join()
        self._retiring.clear()

    def finish(self) -> None:
        """The PS a last switch replaced stop once its checkpoint is committed."""
        self._join_retiring()

    def _relaunch_workers(self, names: Collection[str]) -> None:
        for name in names:
            self._launch_worker(self._worker_index(name), self.run.workers)

    def _worker_index(self, name: str) -> int:
        """The index of one of the job's worker pods."""
        node = NodeId.from_pod_name(self.run.spec.name, name)
        if node is None or node.role != "worker":
            raise ValueError(f"{name} is not a worker pod of job {self.run.spec.name}")
        return node.index

    def applied_plans(self) -> tuple[AppliedPlan, ...]:
        return tuple(self.plans)


def _only(sample: RuntimeSample, pods: Collection[str]) -> RuntimeSample:
    """``sample`` with the nodes of ``pods`` alone."""
    return dataclasses.replace(sample, nodes=tuple(n for n in sample.nodes if n.name in pods))


def elastic_run(
    spec: JobSpec,
    backend: ClusterBackend,
    options: RunOptions,
    *,
    plan: ResourcePlan,
    known: Sequence[Observation] = (),
    progress: Progress | None = None,
    clock: Clock | None = None,
) -> JobRun[ElasticPolicy]:
    """A run of ``spec`` that starts from ``plan`` and applies the planner's later stages
    (``options.planner``: the default settings when None) to its live pods."""
    planner = options.planner or PlannerSettings()

    def policy(run: JobRun[Any]) -> ElasticPolicy:
        return ElasticPolicy(
            run, plan=plan, planner=planner, known=known, migration=options.migration
        )

    return JobRun(
        spec,
        backend,
        options,
        groups=(plan.workers, plan.ps),
        policy=policy,
        progress=progress,
        clock=clock,
    )


__all__ = ["ElasticPolicy", "elastic_run"]
