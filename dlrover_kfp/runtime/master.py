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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dlrover_kfp.core.shards import ShardLedger
from dlrover_kfp.training.master_protocol import CONFIG, GET_SHARD, REGISTER, REPORT
from dlrover_kfp.training.wire import Message, PeerInfo

__all__ = [
    "MasterService",
    "MasterState",
    "WorkerStats",
    "lease_holder",
]


def lease_holder(meta: dict[str, Any]) -> str:
    """Who holds a lease: the worker's name and, when it sent one, its incarnation token."""
    worker = str(meta["worker"])
    incarnation = meta.get("incarnation")
    return worker if incarnation is None else f"{worker}#{incarnation}"


@dataclass
class WorkerStats:
    """What one worker has reported: running totals, read by the sampler."""

    samples: int = 0
    steps: int = 0
    loss_sum: float = 0.0
    bad_rows: int = 0
    last_report: float = 0.0


@dataclass
class MasterState:
    """Everything the master's RPC handlers change, behind one lock."""

    ledger: ShardLedger
    num_ps: int
    job_config: dict[str, Any]
    ps_addresses: dict[int, tuple[str, int]] = field(default_factory=dict)
    workers: dict[str, WorkerStats] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

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
        worker = peer.state.get("leases_for")
        if worker is not None:
            with self.state.lock:
                self.state.ledger.requeue(worker)

    def _register(self, peer: PeerInfo, meta: dict[str, Any]) -> Message:
        index = int(meta["index"])
        if not 0 <= index < self.state.num_ps:
            raise ValueError(f"PS index {index} out of range for {self.state.num_ps} PS")
        host, port = meta["address"]
        with self.state.lock:
            self.state.ps_addresses[index] = (str(host), int(port))
        return Message("ok", {}, ())

    def _config(self, peer: PeerInfo, meta: dict[str, Any]) -> Message:
        with self.state.lock:
            if meta.get("role") == "worker" and not self.state.all_ps_registered:
                return Message("config", {"wait": True}, ())
            addresses = [list(self.state.ps_addresses[k]) for k in sorted(self.state.ps_addresses)]
        return Message("config", {**self.state.job_config, "ps": addresses}, ())

    def _get_shard(self, peer: PeerInfo, meta: dict[str, Any]) -> Message:
        worker = str(meta["worker"])
        holder = lease_holder(meta)
        peer.state["leases_for"] = holder
        with self.state.lock:
            self.state.workers.setdefault(worker, WorkerStats())
            shard = self.state.ledger.lease(holder, self.clock())
            finished = self.state.ledger.finished
        if shard is None:
            return Message("shard", {"shard": None, "finished": finished}, ())
        body = {
            "id": shard.id,
            "source": shard.source,
            "start": shard.start,
            "end": shard.end,
            "epoch": shard.epoch,
        }
        return Message("shard", {"shard": body, "finished": False}, ())

    def _report(self, peer: PeerInfo, meta: dict[str, Any]) -> Message:
        worker = str(meta["worker"])
        with self.state.lock:
            accepted = self.state.ledger.complete(
                lease_holder(meta), int(meta["shard"]), int(meta["epoch"])
            )
            stats = self.state.workers.setdefault(worker, WorkerStats())
            # Samples trained count even when the shard is not accepted (its lease expired):
            # the work was done and the PS were updated; only the shard is handed out again.
            stats.samples += int(meta["samples"])
            stats.steps += int(meta["steps"])
            stats.loss_sum += float(meta["loss_sum"])
            stats.bad_rows += int(meta.get("bad_rows", 0))
            stats.last_report = self.clock()
        return Message("ok", {"accepted": accepted}, ())

    _handlers: ClassVar[dict[str, Callable[[MasterService, PeerInfo, dict[str, Any]], Message]]] = {
        REGISTER: _register,
        CONFIG: _config,
        GET_SHARD: _get_shard,
        REPORT: _report,
    }
