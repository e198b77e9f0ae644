"""One change of the PS set, as one protocol: :class:`PsChange` and its steps (:class:`Step`).

The elastic policy (runtime/elastic.py) decides *that* PS change (a new count or size, one PS
moved off a contended node); this module is *how*. The master's side is
:class:`~dlrover_kfp.runtime.master.PsSwitch`, the shared record its RPC handlers read and the
new PS and workers act on; a :class:`PsChange` installs it, moves it on and removes it.

**Live** (the quota holds old and new PS together)::

    STARTING -> COPYING -> PAUSING -> FINISHING -> SWITCHED
                   |                      |
                   +-------> ABANDONED <--+

The new PS pods start while training goes on and copy their rows from the old PS over the
network (COPYING: each is on *standby* once it has); the workers pause (PAUSING: each finishes
its step, waits for its pushes and reports); released, the new PS fetch the rows updated since
their copy from the now quiescent old PS and register (FINISHING); the workers get the new set
and the old PS stop once they have persisted their last checkpoint (SWITCHED). A new PS that
fails, freezes, stays Pending with no node to place it on (:data:`PENDING_S`) or does not come
in time abandons the change: its pods stop, the old PS serve on, the generation stays.

**Stop-first** (the quota cannot hold both)::

    STARTING -> PAUSING -> CHECKPOINTING -> STOPPING_OLD -> RESTORING -> SWITCHED
                                 |                               |
                                 +--> ABANDONED        FAILED <--+

The workers pause, the quiescent old PS checkpoint (a checkpoint that fails abandons the change:
the main loop sees the dead PS and rolls back), the old PS stop, the new ones start and restore
the checkpoint. A new PS that cannot restore fails the job: no old PS is left to go back to.

The change acts on the run's pods and master state and records its events in the run's record;
what the policy keeps (its PS nodes, its pauses, the workers to relaunch, the thread retiring
the old PS) comes back in the :class:`ChangeOutcome`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.core.profile import EventKind, JobEvent
from dlrover_kfp.errors import DlroverKfpError, PermanentError, TransientError
from dlrover_kfp.ports import PodPhase, PodStatus
from dlrover_kfp.runtime.checkpoints import CheckpointCoordinator
from dlrover_kfp.runtime.job import JobFailedError, JobRun
from dlrover_kfp.runtime.liveness import (
    FIRST_REPORT_S,
    starting_ps_frozen,
)
from dlrover_kfp.runtime.master import PsSwitch
from dlrover_kfp.training import transfer_protocol as transfer
from dlrover_kfp.training.master_protocol import USAGE_INTERVAL_S
from dlrover_kfp.training.wire import connect

log = logging.getLogger("dlrover_kfp.elastic")

#: Seconds the workers get to pause before the stragglers are stopped: ``PAUSE_SHARDS`` times a
#: shard's time at the job's median speed, within these bounds (:func:`pause_timeout_s`).
PAUSE_TIMEOUT_S = 20.0
PAUSE_MIN_S = 3.0
PAUSE_SHARDS = 4
#: A pod that has not reported its usage for this long is frozen (SIGSTOPped, its node hung):
#: the change does not wait for it. Two and a half report intervals leave room for one late
#: report of a busy process, whose reporting thread needs the GIL only briefly.
SILENT_S = 2.5 * USAGE_INTERVAL_S


#: Seconds a new PS may stay Pending with no node to place it on (its scheduler's
#: ``Unschedulable`` message) before the change is abandoned. The scheduler tries again as
#: pods end or go, and the pods a plan gives up for the change (its removed workers) are gone
#: within their grace period (10 s at most); past that, room would have to come from other
#: jobs' pods ending, which may be never, and the change holds the master's loop meanwhile
#: (no sample taken, no failure handled). A PS pending without that message (its image being
#: pulled, its volume attached) is not unplaceable: the startup timeout covers it.
PENDING_S = 30.0
#: The loop turn of every wait on the new PS and the workers.
_POLL_S = 0.005


class Step(StrEnum):
    """Where a PS change is (the module docstring draws both paths). It only moves forward,
    along :data:`_NEXT`; SWITCHED, ABANDONED and FAILED are final."""

    STARTING = "starting"
    COPYING = "copying"
    PAUSING = "pausing"
    FINISHING = "finishing"
    CHECKPOINTING = "checkpointing"
    STOPPING_OLD = "stopping_old"
    RESTORING = "restoring"
    SWITCHED = "switched"
    ABANDONED = "abandoned"
    FAILED = "failed"


#: The steps each step may move on to (None: not started).
_NEXT: dict[Step | None, frozenset[Step]] = {
    None: frozenset({Step.STARTING}),
    Step.STARTING: frozenset({Step.COPYING, Step.PAUSING}),
    Step.COPYING: frozenset({Step.PAUSING, Step.ABANDONED}),
    Step.PAUSING: frozenset({Step.FINISHING, Step.CHECKPOINTING}),
    Step.FINISHING: frozenset({Step.SWITCHED, Step.ABANDONED}),
    Step.CHECKPOINTING: frozenset({Step.STOPPING_OLD, Step.ABANDONED}),
    Step.STOPPING_OLD: frozenset({Step.RESTORING}),
    Step.RESTORING: frozenset({Step.SWITCHED, Step.FAILED}),
    Step.SWITCHED: frozenset(),
    Step.ABANDONED: frozenset(),
    Step.FAILED: frozenset(),
}


def pause_timeout_s(shard_s: float | None) -> float:
    """How long the workers get to pause, given one worker's time for one shard at the job's
    median speed (None: no speed measured yet).

    A worker pauses once its current shard is done and reported: within one shard's time at
    the median speed, two at half of it (the straggler rule's line). Four shards' time (at
    least PAUSE_MIN_S) leaves room for that, and a frozen one holds the job little:
    ``min(PAUSE_TIMEOUT_S, max(PAUSE_MIN_S, PAUSE_SHARDS * shard_s))``."""
    timeout = PAUSE_TIMEOUT_S if shard_s is None else PAUSE_SHARDS * shard_s
    return min(PAUSE_TIMEOUT_S, max(PAUSE_MIN_S, timeout))


@dataclass(frozen=True)
class ChangeOutcome:
    """What a change that ended (SWITCHED or ABANDONED) leaves the policy to keep."""

    step: Step
    #: the node of each PS index now: the new ones where the change switched
    ps_nodes: Mapping[int, NodeId]
    #: seconds training was paused (None: abandoned)
    pause_s: float | None
    #: workers stopped because they did not pause: to be launched again
    stopped_workers: tuple[str, ...]
    #: the thread stopping the old PS once their checkpoint is committed (a live switch)
    retiring: threading.Thread | None


class PsChange:
    """One change of the PS set (the module docstring): ``moved`` names the PS that move to
    new pods of ``target``'s size; ``None`` replaces all of them (as does a new count).

    ``ps_nodes`` are the nodes of the PS serving now (the policy's); ``pause_timeout`` bounds
    the workers' pause (:func:`pause_timeout_s`), and the workers of ``slow`` (Stage 3 found
    them slow since the last change) are not waited for. Built, it has changed nothing; call
    :meth:`carry_out` once."""

    def __init__(
        self,
        run: JobRun[Any],
        *,
        ps_nodes: Mapping[int, NodeId],
        target: NodeGroup,
        moved: frozenset[int] | None,
        live: bool,
        pause_timeout: float = PAUSE_TIMEOUT_S,
        slow: Collection[str] = (),
        on_failed_workers: Callable[[Sequence[PodStatus]], None] | None = None,
    ) -> None:
        self.run = run
        #: told of the worker pods seen failed while the change waits (the policy's failure
        #: handling: an event, the relaunch budget, a relaunch): the change holds the master's
        #: loop, and a worker that dies meanwhile must not go unseen
        self.on_failed_workers = on_failed_workers
        self.target = target
        self.live = live
        self.pause_timeout = pause_timeout
        self.slow = frozenset(slow)
        self.ps_nodes = dict(ps_nodes)
        self.replaced = (
            frozenset(range(target.count))
            if moved is None or target.count != run.ps.count
            else moved
        )
        self.retired = {k for k in self.ps_nodes if k in self.replaced or k >= target.count}
        self.old_pods = [run.pod_name(self.ps_nodes[k]) for k in sorted(self.retired)]
        state = run.state
        with state.lock:
            self.generation = state.generation + 1
            # Without a copy, the new PS restore the change's own checkpoint, the newest.
            self.config = {
                **state.job_config,
                "num_ps": target.count,
                "restore": True,
                "restore_choice": None,
            }
            sources = [state.ps_addresses[k] for k in range(run.ps.count)] if live else None
        self.switch = PsSwitch(
            self.generation, target.count, self.replaced, self.config, copy_from=sources
        )
        self.new_nodes = {k: NodeId("ps", k, self.generation) for k in self.replaced}
        self.new_pods = {k: run.pod_name(node) for k, node in self.new_nodes.items()}
        self.step: Step | None = None
        #: every step entered, in order
        self.history: list[Step] = []
        #: per new PS pod, when the backend first said it runs
        self.running_since: dict[str, float] = {}
        self._launched = False
        #: the checkpoint's step (stop-first), when the workers were asked to pause, for how long
        self._step = -1
        self._paused_at = 0.0
        self._pause_s = 0.0
        self._stopped_workers: dict[str, float | None] = {}
        self._retiring: threading.Thread | None = None

    # -- the protocol ---------------------------------------------------------------------------

    def carry_out(self) -> ChangeOutcome:
        """Take the change through its steps (the module docstring) to SWITCHED or ABANDONED;
        raises :class:`JobFailedError` where it FAILED."""
        self.start()
        if self.live:
            if self.copy():
                self.pause()
                if self.finish():
                    self.switch_over("over the network")
        else:
            self.pause()
            if self.checkpoint():
                self.stop_old()
                self.restore()
                self.switch_over(
                    f"from the checkpoint of step {self._step:,}, after the old ones stopped"
                )
        return self.outcome()

    def start(self) -> None:
        """STARTING: the master's switch record installed; the reports of an abandoned change's
        pods (whose generation comes again) are not these'."""
        self._enter(Step.STARTING)
        state = self.run.state
        with state.lock:
            state.switch = self.switch
            for k in self.replaced:
                state.usage.pop(NodeId("ps", k, self.generation), None)

    def copy(self) -> bool:
        """COPYING: the new PS start and copy their rows while training goes on; each is on
        standby once it has."""
        self._enter(Step.COPYING)
        self._launch_new()
        copied = self._await(lambda: self.switch.standby >= self.replaced, "copy its rows")
        return self._or_abandon(copied)

    def pause(self) -> None:
        """PAUSING: the workers are asked to pause; those that do not in time (or frozen) are
        stopped, their leases back to the queue. Once the rest paused, every reported shard's
        pushes are in the old PS, which are quiescent."""
        self._enter(Step.PAUSING)
        self._paused_at = self.run.clock.monotonic()
        with self.run.state.lock:
            self.switch.pausing = True
        self._stopped_workers = self.await_pause()
        for name, silent_s in self._stopped_workers.items():
            self.run.stop(name, "straggler")
            self._record(
                "straggler",
                "did not pause for the PS switch"
                + ("" if silent_s is None else f" (silent for {silent_s:.1f}s: frozen)")
                + ": stopped, its shards back to the queue",
                node=name,
            )

    def finish(self) -> bool:
        """FINISHING (live): released, the new PS fetch the rows updated since their copy and
        the dense parameters, and register."""
        self._enter(Step.FINISHING)
        with self.run.state.lock:
            self.switch.released = True
        return self._or_abandon(self._await_serving())

    def checkpoint(self) -> bool:
        """CHECKPOINTING (stop-first): a checkpoint of the quiescent old PS; committed, it
        releases the new PS to restore it. A PS that died or a disk that failed abandons the
        change: the main loop sees the dead PS and rolls back."""
        self._enter(Step.CHECKPOINTING)
        state = self.run.state
        self._step = self.run.next_checkpoint_step(state)
        try:
            self.run.coordinator.checkpoint(self._step, extra=self.run.checkpoint_extra(state))
        except (TransientError, PermanentError, OSError) as exc:
            return self._or_abandon(f"its checkpoint of step {self._step:,} failed: {exc}")
        with state.lock:
            self.switch.released = True
        return True

    def stop_old(self) -> None:
        """STOPPING_OLD (stop-first): the old PS stop (their pods deleted after 10 s)."""
        self._enter(Step.STOPPING_OLD)
        self.run.coordinator.shutdown_ps(self.retired)
        for name in self.old_pods:
            self.run.stopping.add(name)
        self.run.wait_for_terminal(self.old_pods, timeout_s=10.0)

    def restore(self) -> None:
        """RESTORING (stop-first): the new PS start and restore the checkpoint. One that
        cannot fails the job: the old PS are gone."""
        self._enter(Step.RESTORING)
        self._launch_new()
        reason = self._await_serving()
        if reason is not None:
            self._give_up(reason, Step.FAILED)
            raise JobFailedError("the PS could not be restarted from the checkpoint")

    def switch_over(self, source: str) -> None:
        """SWITCHED: the workers waiting for their configuration get the new set; the old PS
        stop (live: once they have persisted their last checkpoint, on a thread)."""
        self._enter(Step.SWITCHED)
        old = self.run.coordinator
        if self.live:
            self._retiring = retire(self.run, old, self.retired, self.old_pods)
        else:
            old.close()
        state = self.run.state
        with state.lock:
            state.ps_addresses = {
                k: self.switch.addresses[k] if k in self.replaced else state.ps_addresses[k]
                for k in range(self.target.count)
            }
            state.num_ps = self.target.count
            state.job_config = self.config
            state.generation = self.generation
            state.switch = None
        self._pause_s = self.run.clock.monotonic() - self._paused_at
        self.run.ps = self.target
        # The old PS may still persist a checkpoint: their .tmp is not stale.
        self.run.coordinator = self.run.new_coordinator(state, prune_tmp=False)
        for name in self.old_pods:
            self.run.stopping.add(name)
        target = self.target
        self._record(
            "migration",
            f"PS {', '.join(str(k) for k in sorted(self.replaced))} moved to new pods "
            f"({target.count} x {target.cpu:g} cpu, {target.memory_mb} MiB) {source}"
            f"{moved_detail(self.switch.moved.values())}; training paused {self._pause_s:.2f}s",
        )

    def outcome(self) -> ChangeOutcome:
        """What the policy keeps of a change that ended."""
        if self.step is Step.ABANDONED:
            nodes, pause = self.ps_nodes, None
        elif self.step is Step.SWITCHED:
            count = self.target.count
            nodes = {k: self.new_nodes.get(k) or self.ps_nodes[k] for k in range(count)}
            pause = self._pause_s
        else:
            raise RuntimeError(f"PS change {self.generation}: not ended ({self.step})")
        return ChangeOutcome(
            step=self.step,
            ps_nodes=nodes,
            pause_s=pause,
            stopped_workers=tuple(self._stopped_workers),
            retiring=self._retiring,
        )

    # -- waiting ------------------------------------------------------------------------------

    def _await_serving(self) -> str | None:
        return self._await(lambda: set(self.switch.addresses) >= self.replaced, "serve")

    def _await(self, done: Callable[[], bool], what: str) -> str | None:
        """Wait until ``done`` (read under the master's lock); why not, if the new PS failed,
        froze (:meth:`frozen`: killed) or did not ``what`` within the startup timeout.

        A frozen new PS ends the wait within FIRST_REPORT_S of its start or SILENT_S of its
        freezing, not at the timeout."""
        run, state = self.run, self.run.state
        deadline = run.clock.monotonic() + run.settings.startup_timeout_s
        while run.clock.monotonic() < deadline:
            with state.lock:
                if done():
                    return None
            every = run.backend.statuses()
            self._watch_workers(every)
            statuses = [s for s in every if s.name in self.new_pods.values()]
            failed = [s for s in statuses if s.phase.terminal]
            if failed:
                return run.describe_failure(failed[0])
            unplaced = self.unplaced(statuses)
            if unplaced is not None:
                return unplaced
            frozen = self.frozen(statuses)
            if frozen is not None:
                pod, reason = frozen
                run.stopping.add(pod)
                run.backend.delete(pod, grace_s=0.0)  # a frozen process ignores SIGTERM
                return reason
            run.clock.sleep(_POLL_S)
        return f"the new PS did not {what} within {run.settings.startup_timeout_s:.0f}s"

    def unplaced(self, pods: Sequence[PodStatus]) -> str | None:
        """Why the change gives up on a new PS that no node has room for: Pending, with the
        scheduler's message saying so, for more than PENDING_S since it was launched. Only
        while the old PS serve (live): stop-first has none to go back to, and waits on."""
        if not self.live:
            return None
        now = self.run.clock.monotonic()
        for pod in pods:
            since = self.run.launched_at.get(pod.name)
            if pod.phase is not PodPhase.PENDING or not pod.message or since is None:
                continue
            if now - since > PENDING_S:
                return (
                    f"new PS {pod.name} pending {now - since:.1f}s, placed on no node "
                    f"({pod.message}); the old PS keep serving"
                )
        return None

    def frozen(self, pods: Sequence[PodStatus]) -> tuple[str, str] | None:
        """A new PS that is frozen, and why: running (by the backend) for FIRST_REPORT_S
        without a word; loading its code (it said so, training/node.py ``announce``) for
        longer than its :func:`load_budget_s`; or, once it runs, silent for SILENT_S since its
        last usage report. A running PS reports from a thread of its own, so neither one
        restoring a checkpoint nor one copying rows is silent that long; a slow load is waited
        for, within its budget."""
        now = self.run.clock.monotonic()
        for pod in pods:
            if pod.phase is not PodPhase.RUNNING:
                continue
            since = self.running_since.setdefault(pod.name, now)
            node = NodeId("ps", pod.index, self.generation)
            why = starting_ps_frozen(
                now=now,
                running_since=since,
                heard=self.run.state.last_heard(node),
                loading=self.run.state.loading_since(node),
                cpu=self.target.cpu,
                silent_s=SILENT_S,
            )
            if why is not None:
                return pod.name, f"new PS {pod.name} frozen: {why}; killed, the old PS keep serving"
        return None

    def await_pause(self) -> dict[str, float | None]:
        """Wait until every running, configured worker has paused; the pods that did not, each
        with how long it had been silent if it was frozen (None: it was not).

        A frozen worker would hold the change for the whole timeout, so neither a worker of
        :attr:`slow` nor one that stopped reporting its usage for SILENT_S is waited for: they
        are among the pods returned. A worker not configured yet (relaunched, it has not asked)
        cannot pause: it is told to wait, and gets the new set afterwards."""
        run, state = self.run, self.run.state
        deadline = run.clock.monotonic() + self.pause_timeout
        while True:
            every = run.backend.statuses()
            self._watch_workers(every)
            running = [
                s
                for s in every
                if s.role == "worker" and not s.phase.terminal and s.name not in run.stopping
            ]
            with state.lock:
                waiting = [
                    s.name
                    for s in running
                    if NodeId.worker(s.index).key in state.configured
                    and NodeId.worker(s.index).key not in self.switch.ready
                ]
            silent = self._silent(running)
            if set(waiting) <= self.slow | silent.keys() or run.clock.monotonic() > deadline:
                return {name: silent.get(name) for name in waiting}
            run.clock.sleep(_POLL_S)

    def _watch_workers(self, statuses: Sequence[PodStatus]) -> None:
        """Hand the worker pods that failed (and that the run did not stop) to
        :attr:`on_failed_workers`; it remembers which it has handled."""
        if self.on_failed_workers is None:
            return
        failed = [
            s
            for s in statuses
            if s.role == "worker" and s.phase is PodPhase.FAILED and s.name not in self.run.stopping
        ]
        if failed:
            self.on_failed_workers(failed)

    def _silent(self, pods: Sequence[PodStatus]) -> dict[str, float]:
        """The worker pods of ``pods`` that have not reported their usage for SILENT_S: how
        long. A pod that has not reported yet is not judged (it may still be starting)."""
        now = self.run.clock.monotonic()
        out = {}
        for pod in pods:
            heard = self.run.state.last_heard(NodeId.worker(pod.index))
            if heard is not None and now - heard > SILENT_S:
                out[pod.name] = now - heard
        return out

    # -- helpers ------------------------------------------------------------------------------

    def _enter(self, step: Step) -> None:
        """Move on to ``step``: only forward, along :data:`_NEXT`."""
        if step not in _NEXT[self.step]:
            raise RuntimeError(f"PS change {self.generation}: {self.step} -> {step} is no step")
        self.step = step
        self.history.append(step)

    def _launch_new(self) -> None:
        for k in sorted(self.replaced):
            self.run.launch(self.new_nodes[k], self.target)
        self._launched = True

    def _or_abandon(self, reason: str | None) -> bool:
        """True when there is no ``reason`` to give the change up; else ABANDONED."""
        if reason is None:
            return True
        self._give_up(reason, Step.ABANDONED)
        return False

    def _give_up(self, reason: str, step: Step) -> None:
        """The workers go back to the old PS (where they still run), the new pods stop."""
        self._enter(step)
        with self.run.state.lock:
            self.run.state.switch = None
        if self._launched:
            for name in self.new_pods.values():
                self.run.stop(name)
        if self.switch.copy_from:
            # The new PS asked the old ones to mark updated rows; they stop now, not at the
            # next change.
            for failure in untrack(self.switch.copy_from, self.run.secret, self.generation):
                log.warning("PS change %d abandoned: %s", self.generation, failure)
        self._record("failure", f"PS change abandoned: {reason}")

    def _record(self, kind: EventKind, detail: str, node: str | None = None) -> None:
        """An event on the run's timeline, and its progress line."""
        t = round(self.run.clock.monotonic() - self.run.start, 3)
        self.run.events.append(JobEvent(time=t, kind=kind, node=node, detail=detail))
        who = "" if node is None else f"{node}: "
        self.run.progress(f"{self.run.run_id}: {who}{detail}")


#: How long :func:`untrack` waits for one old PS's answer (it answers in microseconds).
UNTRACK_TIMEOUT_S = 2.0


def untrack(sources: Sequence[tuple[str, int]], secret: bytes, generation: int) -> list[str]:
    """Tell every old PS at ``sources`` to stop marking the rows updated for change
    ``generation`` (``transfer_untrack``): the change was given up, and an old PS left marking
    would pay the mark on every push (3-5 %) until the next change. Best effort, on fresh
    connections, each bounded by :data:`UNTRACK_TIMEOUT_S` (an old PS that does not answer
    may be why the change was given up). The failures, in words; empty when all answered."""
    failed = []
    for j, (host, port) in enumerate(sources):
        try:
            conn = connect((str(host), int(port)), secret, timeout=UNTRACK_TIMEOUT_S)
            try:
                conn.request(transfer.UNTRACK, {"generation": generation})
            finally:
                conn.close()
        except DlroverKfpError as exc:
            failed.append(f"old PS {j} at {host}:{port}: {exc}")
    return failed


def retire(
    run: JobRun[Any], old: CheckpointCoordinator, retired: set[int], pods: list[str]
) -> threading.Thread:
    """Once the old PS have persisted the change's checkpoint (and it is committed), stop the
    retired ones; on a thread, so that training goes on meanwhile (deleted if they will not)."""

    def stop() -> None:
        try:
            old.join()
            old.shutdown_ps(retired)
        except Exception as exc:
            log.warning("stopping the old PS (their pods are deleted): %s", exc)
            for name in pods:
                run.backend.delete(name)
        finally:
            old.close()

    thread = threading.Thread(target=stop, name="retire-ps", daemon=True)
    thread.start()
    return thread


def moved_detail(moved: Iterable[dict[str, float]]) -> str:
    """What a change's new PS moved over the network, from their own accounts (none: a
    restore from a checkpoint)."""
    parts = list(moved)
    if not parts or not all(parts):
        return ""

    def total(key: str) -> float:
        return sum(p.get(key, 0.0) for p in parts)

    copied_mib = (total("bytes") - total("resent_bytes")) / 2**20
    return (
        f": {total('rows'):,.0f} rows ({copied_mib:,.1f} MiB) copied while training in "
        f"{max(p.get('copy_s', 0.0) for p in parts):.2f}s, {total('resent_rows'):,.0f} "
        f"updated since ({total('resent_bytes') / 2**20:,.1f} MiB) fetched in "
        f"{max(p.get('finish_s', 0.0) for p in parts):.2f}s of the pause"
    )


__all__ = [
    "FIRST_REPORT_S",
    "PENDING_S",
    "SILENT_S",
    "ChangeOutcome",
    "PsChange",
    "Step",
    "moved_detail",
    "pause_timeout_s",
    "retire",
]
