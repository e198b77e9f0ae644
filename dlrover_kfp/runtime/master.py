"""The job master's RPC service: registration of PS, configuration, data shards, progress.

Every PS and worker process talks to the master over the job's authenticated transport:

* ``register`` (PS): "PS k listens at host:port". Workers are configured once every PS has.
* ``config``: the job spec, the PS addresses and the run settings; ``{"wait": true}`` until the
  PS are all registered.
* ``get_shard``: lease the next data shard (``{"shard": null, "finished": true}`` at the end).
* ``report``: a shard is done, with its samples, steps, summed loss and bad rows.

A worker's leased shards return to the queue when its connection drops (the ledger's
``requeue``), so a worker that dies loses no data and repeats none that was reported done.

Leases are held by a worker *incarnation* (``worker-3#<token>``; each process draws its own
token), not by its name: a relaunched ``worker-3`` may lease shards before the master has seen
its predecessor's connection drop, and that drop must take back only the predecessor's leases.
Progress is still counted per name.

**A live change of the PS set** (:class:`PsSwitch`, driven by the elastic run:
runtime/ps_change.py) goes through the same service. The PS set has a *generation*; the first
PS are generation 0. A new PS of generation ``g`` asks for its configuration with
``{"generation": g}``. When the old PS still run, the answer names them (``copy``): the new PS
copies its rows from them over the network while training goes on, says ``copied`` and is on
*standby*; released once the workers paused, it is told the same sources again (``migrate``),
fetches the rows updated since its copy and registers. When the old PS stopped first, it waits
on standby until the master releases it, once a checkpoint of the quiescent old PS is
committed, then restores from that checkpoint and registers. Meanwhile, once the switch is
*pausing*, every ``get_shard`` and ``report`` answer carries ``{"switch": g}``: a worker
finishes its step, waits for its pushes, reports, sends ``ready`` and asks for the
configuration again, which waits until the new PS are registered and then names them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dlrover_kfp.core.applied import AppliedTally
from dlrover_kfp.core.node_id import NodeId, holder_name
from dlrover_kfp.core.shards import ShardLedger
from dlrover_kfp.training.data import RowRange
from dlrover_kfp.training.master_protocol import (
    CONFIG,
    GET_SHARD,
    LOADING,
    READY,
    REGISTER,
    REPORT,
    SWITCH,
    USAGE,
)
from dlrover_kfp.training.supervisor import ASKED
from dlrover_kfp.training.wire import Message, PeerInfo

__all__ = [
    "MasterService",
    "MasterState",
    "PsSwitch",
    "WorkerStats",
    "lease_holder",
]


_INT64 = 2**63


def _moved(meta: dict[str, Any]) -> dict[str, float]:
    """What a new PS says its move carried (``moved``: rows, bytes, seconds), the numbers only:
    for the event the master records, never trusted for anything else."""
    moved = meta.get("moved")
    if not isinstance(moved, dict):
        return {}
    return {
        str(k)[:32]: float(v)
        for k, v in list(moved.items())[:8]
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _int(meta: dict[str, Any], key: str, kind: str, default: int | None = None) -> int:
    """``meta[key]`` as an integer, or a ValueError naming the request and the key.

    Requests come off the network: a key may be missing or hold any JSON value, and the
    message of a bare ``int(meta[key])`` (``KeyError: 'shard'``) does not say which request.
    """
    value = meta.get(key, default)
    if value is None:
        raise ValueError(f"{kind}: meta key {key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT64 <= value < _INT64:
        raise ValueError(f"{kind}: meta key {key!r} must be a 64-bit integer, got {value!r:.60}")
    return value


def _number(meta: dict[str, Any], key: str, kind: str, *, finite: bool = True) -> float:
    """``meta[key]`` as a number; with ``finite``, a finite one >= 0 (a NaN CPU reading would
    poison every rate computed from it)."""
    value = meta.get(key)
    if value is None:
        raise ValueError(f"{kind}: meta key {key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{kind}: meta key {key!r} must be a number, got {value!r:.60}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{kind}: meta key {key!r} is too large") from None
    if finite and (not math.isfinite(number) or number < 0):
        raise ValueError(f"{kind}: meta key {key!r} must be finite and >= 0, got {value!r:.60}")
    return number


def _name(meta: dict[str, Any], key: str, kind: str) -> str:
    value = meta.get(key)
    if not isinstance(value, str) or not value or len(value) > 256:
        raise ValueError(f"{kind}: meta key {key!r} must be a name (1..256 characters)")
    return value


def lease_holder(meta: dict[str, Any]) -> str:
    """Who holds a lease: the worker's name and, when it sent one, its incarnation token."""
    worker = _name(meta, "worker", "request")
    incarnation = meta.get("incarnation")
    if incarnation is not None and not isinstance(incarnation, str | int):
        raise ValueError(f"meta key 'incarnation' must be a token, got {incarnation!r:.60}")
    return holder_name(worker, incarnation)


@dataclass
class WorkerStats:
    """What one worker has reported: running totals, read by the sampler."""

    samples: int = 0
    steps: int = 0
    loss_sum: float = 0.0
    bad_rows: int = 0
    last_report: float = 0.0


@dataclass
class PsSwitch:
    """A change of the PS set under way (see the module docstring)."""

    generation: int
    num_ps: int
    #: indices whose PS is replaced by a new pod (the others keep theirs)
    replaced: frozenset[int]
    #: the configuration of the new generation (its ``num_ps``, ``restore``)
    job_config: dict[str, Any]
    #: where the new PS copy their rows from, over the network: the old PS's addresses by
    #: index (a live switch); None: they restore the switch's checkpoint (the old PS stopped)
    copy_from: list[tuple[str, int]] | None = None
    #: workers are being asked to pause
    pausing: bool = False
    #: the new PS may finish: the workers paused (a copy) or the checkpoint is committed
    released: bool = False
    #: new PS that have started (and, for a copy, copied their rows) and wait to be released
    standby: set[int] = field(default_factory=set)
    #: per new PS, what its move carried (rows, bytes, seconds), as it registered it
    moved: dict[int, dict[str, float]] = field(default_factory=dict)
    #: new PS that restored and listen
    addresses: dict[int, tuple[str, int]] = field(default_factory=dict)
    #: workers that paused for this generation
    ready: set[str] = field(default_factory=set)


@dataclass
class MasterState:
    """Everything the master's RPC handlers change, behind one lock."""

    ledger: ShardLedger
    num_ps: int
    job_config: dict[str, Any]
    ps_addresses: dict[int, tuple[str, int]] = field(default_factory=dict)
    workers: dict[str, WorkerStats] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: the generation of the PS set in use
    generation: int = 0
    #: a change of the PS set under way
    switch: PsSwitch | None = None
    #: per worker name, the PS generation it was last configured with
    configured: dict[str, int] = field(default_factory=dict)
    #: when the last shard report arrived, and the longest time between two (master clock):
    #: how long training stood still at worst (a PS switch, a restart)
    last_report_at: float | None = None
    longest_report_gap_s: float = 0.0
    #: per pod, its last two own usage reports: (master clock at arrival, cumulative CPU
    #: seconds, resident MiB, the pod's own clock at the reading)
    usage: dict[NodeId, list[tuple[float, float, float, float]]] = field(default_factory=dict)
    #: per pod that said it is loading its code (its supervisor's report before torch loads:
    #: training/node.py ``announce``), when (master clock); gone with its next report. A new
    #: PS is judged frozen against a loading budget meanwhile, not the silence of a few
    #: report intervals (runtime/ps_change.py)
    loading: dict[NodeId, float] = field(default_factory=dict)
    #: PS of the set in use whose process's connection to the master dropped, by index: when
    #: (master clock) and the address it served at. A PS ends with that connection, so its
    #: process is gone (a crash, its pod's end, a stop); the elastic run's failure handling
    #: reads it (:meth:`lost_ps`)
    ps_lost: dict[int, tuple[float, tuple[str, int]]] = field(default_factory=dict)
    #: PS processes restarted inside their pod (training/supervisor.py) that asked for their
    #: configuration, by index: why the previous process ended (``asked``: the master asked)
    restarting: dict[int, str] = field(default_factory=dict)
    #: the master rolled the job back: restarted PS get their configuration (see _config)
    restart_released: bool = False
    #: per PS that registered after a restart, where it restored from (memory, volume, start)
    restored_from: dict[int, str] = field(default_factory=dict)
    #: per (epoch, shard) given back before it was done, why: what PS 0 applied of it twice is
    #: put down to that (core/applied.py). The cause a worker was stopped for, ``relaunch``
    #: for one that ended on its own, ``rollback``/``resume`` for a shard in flight at the
    #: checkpoint a run went back to
    requeued: dict[tuple[int, int], str] = field(default_factory=dict)
    #: per worker name, why the run stopped it (set just before the stop)
    stop_causes: dict[str, str] = field(default_factory=dict)
    #: where a shard's rows lie in its file (``Dataset.locate``): sent with the lease, so that
    #: a worker reads its shards' bytes without indexing the file itself
    locate: Callable[[RowRange], Sequence[int] | None] | None = None

    def self_reported_usage(
        self, now: float, max_age_s: float
    ) -> dict[NodeId, tuple[float, float]]:
        """(cores, resident MiB) of every pod that reported twice, its last report at most
        ``max_age_s`` old: cores = (cpu₂ - cpu₁) / (a₂ - a₁) over its last two reports, ``a``
        the pod's own clock at each reading. The arrival times would not do: a report held up
        on its way (the pod's GIL, the network) shortens the next interval and inflates the
        rate (0.62 cores was seen for a pod held to 0.5)."""
        out = {}
        with self.lock:
            for key, readings in self.usage.items():
                if len(readings) < 2 or now - readings[-1][0] > max_age_s:
                    continue
                (_, c1, _, a1), (_, c2, rss, a2) = readings[-2], readings[-1]
                if a2 > a1:
                    out[key] = (max(0.0, (c2 - c1) / (a2 - a1)), rss)
        return out

    def loading_since(self, node: NodeId) -> float | None:
        """When (master clock) the pod said it is loading its code, if that was its last word."""
        with self.lock:
            return self.loading.get(node)

    def forget_reports(self, node: NodeId) -> None:
        """Drop what the pod of ``node`` reported (its usage, that it was loading): a pod
        started again under the same node is judged on its own reports."""
        with self.lock:
            self.usage.pop(node, None)
            self.loading.pop(node, None)

    def last_heard(self, node: NodeId) -> float | None:
        """When (master clock) the pod last reported its usage; None if it has not yet."""
        with self.lock:
            readings = self.usage.get(node)
            return readings[-1][0] if readings else None

    def committed(self) -> dict[str, Any]:
        """What goes with a checkpoint (its ``extra``): the shard ledger and what each worker
        has reported, taken together, so that a restore resumes both where the restored
        parameters left them. Call with :attr:`lock` held."""
        return {
            "shards": self.ledger.to_dict(),
            "stats": {
                name: [s.samples, s.steps, s.loss_sum, s.bad_rows]
                for name, s in self.workers.items()
            },
            "requeued": [[e, s, cause] for (e, s), cause in sorted(self.requeued.items())],
        }

    def requeue(self, worker: str, holder: str) -> None:
        """Give back the leases of ``holder`` (a process of ``worker`` whose connection
        dropped), noting why. Call with :attr:`lock` held."""
        epoch = self.ledger.epoch
        cause = self.stop_causes.pop(worker, "relaunch")
        for shard in self.ledger.requeue(holder):
            self.requeued[(epoch, shard)] = cause

    def restore_committed(
        self, extra: dict[str, Any] | None, initial: ShardLedger, cause: str = "rollback"
    ) -> None:
        """Put back what :meth:`committed` wrote, or, without it, the job's start: ``initial``'s
        shards all to do and nothing counted. The shards PS 0 had part-applied at that
        checkpoint are leased again from where their part ends (:attr:`ShardLedger.skip`);
        what was applied twice of them anyway is put down to ``cause``. Call with
        :attr:`lock` held."""
        self.requeued = {}
        if extra is None or "shards" not in extra:
            self.ledger = ShardLedger(
                initial.ranges, epochs=initial.epochs, lease_s=initial.lease_s
            )
            self.workers = {}
            return
        for e, s, why in extra.get("requeued", []):
            self.requeued[(int(e), int(s))] = str(why)
        self.ledger = ShardLedger.from_dict(extra["shards"])
        tally = AppliedTally.from_dict(extra.get("applied"))
        resume = tally.resume_points(self.ledger.epoch)
        # A shard PS 0 had part-applied is leased again from where that part ends: none of it
        # applied twice. One it had part-applied beyond a whole pass was trained twice already.
        self.ledger.skip = {s: rows for s, rows in resume.items() if s not in self.ledger.done}
        # A shard the state holds whole while the ledger, taken just before the PS snapshot,
        # has it to do (its report came between the two) is trained again whole: that too.
        redone = {(self.ledger.epoch, s) for s in self.ledger.todo}
        for key in [*tally.partial, *(tally.whole & redone)]:
            self.requeued.setdefault(key, cause)
        self.workers = {
            str(name): WorkerStats(
                samples=int(samples), steps=int(steps), loss_sum=float(loss), bad_rows=int(bad)
            )
            for name, (samples, steps, loss, bad) in dict(extra.get("stats", {})).items()
        }

    def lost_ps(self) -> dict[int, float]:
        """The PS of the set in use whose process is gone, by index: when it went. A loss of a
        process the set no longer names (a PS a change replaced, stopped after the master
        saw it go) is dropped. Call with :attr:`lock` held."""
        for k, (_, address) in list(self.ps_lost.items()):
            if self.ps_addresses.get(k) != address:
                del self.ps_lost[k]
        return {k: at for k, (at, _) in self.ps_lost.items()}

    @property
    def all_ps_registered(self) -> bool:
        return len(self.ps_addresses) == self.num_ps

    def totals(self) -> tuple[int, int, float, int]:
        """(samples, steps, loss sum, bad rows) over every worker."""
        with self.lock:
            stats = list(self.workers.values())
        return (
            sum(s.samples for s in stats),
            sum(s.steps for s in stats),
            sum(s.loss_sum for s in stats),
            sum(s.bad_rows for s in stats),
        )


class MasterService:
    """The handlers behind the master's :class:`~dlrover_kfp.training.wire.Server`."""

    def __init__(self, state: MasterState, clock: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self.clock = clock

    def handle(self, peer: PeerInfo, msg: Message) -> Message:
        handler = self._handlers.get(msg.kind)
        if handler is None:
            raise ValueError(f"unknown request {msg.kind!r}")
        return handler(self, peer, msg.meta)

    def on_disconnect(self, peer: PeerInfo) -> None:
        holder = peer.state.get("leases_for")
        if holder is not None:
            with self.state.lock:
                self.state.requeue(str(peer.state.get("worker", "")), holder)
        registered = peer.state.get("ps")
        if registered is not None:
            index, address = registered
            with self.state.lock:
                # Only the process serving as that PS now (its address is its own): a PS of an
                # older set, or one whose index has registered again since, is no news.
                if self.state.ps_addresses.get(index) == address:
                    self.state.ps_lost.setdefault(index, (self.clock(), address))

    def _pausing(self) -> int | None:
        """The generation workers must pause for, if any (call with the lock held)."""
        switch = self.state.switch
        return switch.generation if switch is not None and switch.pausing else None

    def _register(self, peer: PeerInfo, meta: dict[str, Any]) -> Message:
        index = _int(meta, "index", REGISTER)
        generation = _int(meta, "generation", REGISTER, default=0)
        where = meta.get("address")
        if (
            not isinstance(where, list | tuple)
            or len(where) != 2
            or not isinstance(where[0], str)
            or isinstance(where[1], bool)
            or not isinstance(where[1], int)
            or not 0 < where[1] < 65536
        ):
            raise ValueError(
                f"{REGISTER}: meta key 'address' must be [host, port], got {where!r:.80}"
            )
        address = (where[0], where[1])
        with self.state.lock:
            switch = self.state.switch
            if switch is not None and generation == switch.generation:
                if index not in switch.replaced:
                    raise ValueError(f"PS {index} is not replaced in generation {generation}")
                switch.addresses[index] = address
                switch.moved[index] = _moved(meta)
                peer.state["ps"] = (index, address)  # lost once it serves the set (on_disconnect)
            elif generation == self.state.generation or index in self.state.restarting:
                # (A PS restarted in its pod keeps the generation it was started with: a PS a
                # live change kept is of an older one than the set's.)
                if not 0 <= index < self.state.num_ps:
                    raise ValueError(f"PS index {index} out of range for {self.state.num_ps} PS")
                self.state.ps_addresses[index] = address
                peer.state["ps"] = (index, address)
                restored = meta.get("restored")
                if restored in ("memory", "volume", "start"):
                    self.state.restored_from[index] = restored
            else:
                raise ValueError(f"PS {index}: generation {generation} is not expected")
        return Message("ok", {}, ())

    def _config(self, peer: PeerInfo, meta: dict[str, Any]) -> Message:
        role = meta.get("role")
        generation = _int(meta, "generation", CONFIG, default=0)
        index = _int(meta, "index", CONFIG, default=0)
        with self.state.lock:
            state = self.state
            switch = state.switch
            if role == "ps" and "restart" in meta and generation <= state.generation:
                return self._restart_config(index, meta)
            if role == "ps" and switch is not None and generation == switch.generation:
                if index not in switch.replaced:
                    raise ValueError(f"PS {index} is not replaced in generation {generation}")
                return self._switch_config(switch, index, meta)
            if role == "worker":
                if not state.all_ps_registered or self._pausing() is not None:
                    return Message("config", {"wait": True}, ())
                state.configured[NodeId.worker(index).key] = state.generation
            addresses = [list(state.ps_addresses[k]) for k in sorted(state.ps_addresses)]
            config = {**state.job_config, "ps": addresses, "generation": state.generation}
        return Message("config", config, ())

    def _restart_config(self, index: int, meta: dict[str, Any]) -> Message:
        """A PS process restarted inside its pod asks for its configuration (call with the
        lock held): it waits until the master has rolled the job back (the elastic run's
        failure handling sees it in ``restarting``), then gets the configuration that names
        the committed checkpoint to restore."""
        state = self.state
        if not 0 <= index < state.num_ps:
            raise ValueError(f"PS index {index} out of range for {state.num_ps} PS")
        _int(meta, "restart", CONFIG)
        cause = meta.get("cause")
        cause = cause[:64] if isinstance(cause, str) else ""
        # A PS that never served (it crashed starting) has nothing trained on it to roll
        # back: it starts as any PS does. One that served, or that the master asked to
        # restart, waits for the rollback.
        served = index in state.ps_lost or index in state.ps_addresses
        if served or cause == ASKED or index in state.restarting:
            state.restarting.setdefault(index, cause)
            if not state.restart_released:
                return Message("config", {"wait": True}, ())
        addresses = [list(state.ps_addresses[k]) for k in sorted(state.ps_addresses)]
        config = {**state.job_config, "ps": addresses, "generation": state.generation}
        return Message("config", config, ())

    @staticmethod
    def _switch_config(switch: PsSwitch, index: int, meta: dict[str, Any]) -> Message:
        """A new PS of a switch asks for its configuration (call with the lock held).

        From the old PS's checkpoint: it waits, started, until the switch is released, then
        restores. Over the network (``copy_from``): it first gets what to copy from and copies
        while training goes on; it is on standby once it says it has copied; released (the
        workers paused), it gets the same sources again to fetch what changed since."""
        config = {**switch.job_config, "generation": switch.generation}
        if switch.copy_from is None:
            switch.standby.add(index)
            return Message("config", config if switch.released else {"wait": True}, ())
        sources = {
            "from": [list(a) for a in switch.copy_from],
            "from_num_ps": len(switch.copy_from),
        }
        if switch.released:
            return Message("config", {**config, "migrate": sources}, ())
        if meta.get("copied") is True:
            switch.standby.add(index)
            return Message("config", {"wait": True}, ())
        return Message("config", {"wait": True, "copy": {**config, **sources}}, ())

    def _ready(self, peer: PeerInfo, meta: dict[str, Any]) -> Message:
        generation = _int(meta, "generation", READY)
        worker = _name(meta, "worker", READY)
        with self.state.lock:
            switch = self.state.switch
            if switch is not None and generation == switch.generation:
                switch.ready.add(worker)
        return Message("ok", {}, ())

    def _get_shard(self, peer: PeerInfo, meta: dict[str, Any]) -> Message:
        worker = _name(meta, "worker", GET_SHARD)
        holder = lease_holder(meta)
        peer.state["leases_for"] = holder
        peer.state["worker"] = worker
        with self.state.lock:
            self.state.workers.setdefault(worker, WorkerStats())
            pausing = self._pausing()
            if pausing is not None:
                # No new lease while the PS change: what a worker holds is trained afterwards.
                return Message("shard", {"shard": None, "finished": False, SWITCH: pausing}, ())
            shard = self.state.ledger.lease(holder, self.clock())
            finished = self.state.ledger.finished
            skip = 0 if shard is None else self.state.ledger.skip.get(shard.id, 0)
        if shard is None:
            return Message("shard", {"shard": None, "finished": finished}, ())
        body: dict[str, Any] = {
            "id": shard.id,
            "source": shard.source,
            "start": shard.start,
            "end": shard.end,
            "epoch": shard.epoch,
        }
        if skip:
            body["skip"] = skip
        if self.state.locate is not None:
            span = self.state.locate(RowRange(shard.source, shard.start, shard.end))
            if span is not None:
                body["span"] = [int(x) for x in span]
        return Message("shard", {"shard": body, "finished": False}, ())

    def _report(self, peer: PeerInfo, meta: dict[str, Any]) -> Message:
        # Every key is checked before anything changes: a bad report changes nothing.
        worker = _name(meta, "worker", REPORT)
        holder = lease_holder(meta)
        shard, epoch = _int(meta, "shard", REPORT), _int(meta, "epoch", REPORT)
        counts = {}
        for key in ("samples", "steps", "bad_rows"):
            counts[key] = _int(meta, key, REPORT, default=0 if key == "bad_rows" else None)
            if counts[key] < 0:
                raise ValueError(f"{REPORT}: meta key {key!r} must be >= 0, got {counts[key]}")
        # Any float: a diverging run's NaN loss is news for its report, not a bad request.
        loss_sum = _number(meta, "loss_sum", REPORT, finite=False)
        with self.state.lock:
            accepted = self.state.ledger.complete(holder, shard, epoch)
            stats = self.state.workers.setdefault(worker, WorkerStats())
            # Samples trained count even when the shard is not accepted (its lease expired):
            # the work was done and the PS were updated; only the shard is handed out again.
            # An accepted shard leased from a skip counts the rows the PS held already too.
            stats.samples += counts["samples"]
            if accepted:
                stats.samples += self.state.ledger.skip.pop(shard, 0)
            stats.steps += counts["steps"]
            stats.loss_sum += loss_sum
            stats.bad_rows += counts["bad_rows"]
            stats.last_report = now = self.clock()
            if self.state.last_report_at is not None:
                gap = now - self.state.last_report_at
                self.state.longest_report_gap_s = max(self.state.longest_report_gap_s, gap)
            self.state.last_report_at = now
            pausing = self._pausing()
        reply: dict[str, Any] = {"accepted": accepted}
        if pausing is not None:
            reply[SWITCH] = pausing
        return Message("ok", reply, ())

    def _usage(self, peer: PeerInfo, meta: dict[str, Any]) -> Message:
        role = _name(meta, "role", USAGE)
        if role not in ("worker", "ps"):
            raise ValueError(f"{USAGE}: meta key 'role' must be 'worker' or 'ps', got {role!r:.60}")
        key = NodeId(
            "ps" if role == "ps" else "worker",
            _int(meta, "index", USAGE),
            _int(meta, "generation", USAGE, default=0),
        )
        cpu, rss = _number(meta, "cpu_seconds", USAGE), _number(meta, "rss_mb", USAGE)
        now = self.clock()
        # The pod's own clock when it read its usage; arrival time from a pod that sends none.
        at = _number(meta, "at", USAGE) if "at" in meta else now
        reading = (now, cpu, rss, at)
        with self.state.lock:
            readings = self.state.usage.setdefault(key, [])
            if readings and reading[1] < readings[-1][1]:
                readings.clear()  # a new pod under the same name: its CPU time starts over
            readings.append(reading)
            del readings[:-2]
            if meta.get(LOADING) is True:
                self.state.loading[key] = now
            else:
                self.state.loading.pop(key, None)
        return Message("ok", {}, ())

    _handlers: ClassVar[dict[str, Callable[[MasterService, PeerInfo, dict[str, Any]], Message]]] = {
        REGISTER: _register,
        CONFIG: _config,
        GET_SHARD: _get_shard,
        REPORT: _report,
        READY: _ready,
        USAGE: _usage,
    }
