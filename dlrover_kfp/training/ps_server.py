"""A parameter server: serves lookups and applies pushes for the rows it owns, one at a time.

Requests (over :mod:`dlrover_kfp.training.wire`):

* ``lookup``  arrays ``(slots,)``, meta ``{"dense": bool}`` -> ``rows`` ``(rows[, dense])``
* ``push``    arrays ``(slots, grads[, dense_grad])`` -> ``ok``
* ``checkpoint`` meta ``{"step": n}`` -> ``ok`` ``{"blocked_s": t}``: copy the state into shared
  memory now (training on this PS pauses for the copy only) and persist it in the background;
* ``checkpoint_status`` -> ``{"done": bool, "part": {...}}`` once the persist has finished;
* ``stats`` -> counters; ``shutdown`` -> ``ok``, then the server stops.

One thread serves every connection in arrival order, so a lookup never sees half an update and
a checkpoint is a consistent copy of this PS (the PS of a job are copied at nearly the same
moment, not atomically together: the usual semantics of asynchronous PS training).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from dlrover_kfp.backends.api import POD_CPU_ENV
from dlrover_kfp.core.documents import parse
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training import checkpoint as ckpt
from dlrover_kfp.training.ps_state import PsConfig, PsState
from dlrover_kfp.training.wire import Message, PeerInfo, Server

log = logging.getLogger("dlrover_kfp.ps")


class PsService:
    """The request handlers of one PS around its :class:`PsState`."""

    def __init__(self, state: PsState, checkpointer: ckpt.PsCheckpointer | None) -> None:
        self.state = state
        self.checkpointer = checkpointer
        self.server: Server | None = None
        self.lookups = 0
        self.pushes = 0
        self.rows_served = 0
        self.busy_s = 0.0

    def handle(self, peer: PeerInfo, msg: Message) -> Message | None:
        began = time.perf_counter()
        try:
            return self._dispatch(msg)
        finally:
            self.busy_s += time.perf_counter() - began

    def _dispatch(self, msg: Message) -> Message | None:
        kind = msg.kind
        if kind == "lookup":
            slots = torch.from_numpy(msg.arrays[0])
            rows = self.state.lookup(slots).numpy()
            self.lookups += 1
            self.rows_served += len(rows)
            if msg.meta.get("dense"):
                if self.state.dense is None:
                    raise ValueError(f"PS {self.state.config.ps_index} holds no dense parameters")
                # A copy: the reply may leave after other requests have updated the vector.
                return Message("rows", {}, (rows, self.state.dense.numpy().copy()))
            return Message("rows", {}, (rows,))
        if kind == "push":
            slots = torch.from_numpy(msg.arrays[0])
            if len(slots):
                self.state.apply_sparse(slots, torch.from_numpy(msg.arrays[1]))
            if len(msg.arrays) > 2:
                self.state.apply_dense(torch.from_numpy(msg.arrays[2]))
            self.pushes += 1
            return Message("ok", {}, ())
        if kind == "checkpoint":
            if self.checkpointer is None:
                raise ValueError("this PS was started without a checkpoint directory")
            blocked = self.checkpointer.snapshot(int(msg.meta["step"]), self.state)
            return Message("ok", {"blocked_s": blocked}, ())
        if kind == "checkpoint_status":
            if self.checkpointer is None:
                raise ValueError("this PS was started without a checkpoint directory")
            return Message("checkpoint_status", self.checkpointer.status(), ())
        if kind == "stats":
            return Message("stats", self.stats(), ())
        if kind == "shutdown":
            if self.server is not None:
                self.server.stop()
            return Message("ok", {}, ())
        raise ValueError(f"unknown request {kind!r}")

    def stats(self) -> dict[str, Any]:
        return {
            "ps_index": self.state.config.ps_index,
            "lookups": self.lookups,
            "pushes": self.pushes,
            "rows_served": self.rows_served,
            "busy_s": self.busy_s,
            "state_bytes": self.state.nbytes,
        }


def build_state(index: int, config: dict[str, Any]) -> PsState:
    """This PS's state: restored from the job's checkpoint when asked to, else initialised."""
    model = parse(ModelSpec, config["spec"]["model"], "job spec from the master", prefix="model.")
    ps_config = PsConfig(
        model=model,
        num_ps=int(config["num_ps"]),
        ps_index=index,
        learning_rate=float(config["spec"]["training"]["learning_rate"]),
        seed=int(config["seed"]),
    )
    if config.get("restore") and config.get("checkpoint_dir"):
        restored = ckpt.restore_ps_state(config["checkpoint_dir"], ps_config, config["job_id"])
        if restored is not None:
            return restored
    return PsState(ps_config)


def snapshot_copy_threads(env: Mapping[str, str]) -> int:
    """Threads for the snapshot copy: the pod's whole CPU (at most 4), since training is paused.

    Two threads cut the pause for 1 GiB from ~0.09 s to ~0.06 s here; more than the pod's CPU
    would only be throttled.
    """
    try:
        cpu = float(env.get(POD_CPU_ENV, "1"))
    except ValueError:
        cpu = 1.0
    return max(1, min(4, math.ceil(cpu)))


def serve(
    index: int,
    config: dict[str, Any],
    secret: bytes,
    register: Callable[[int], None],
    *,
    bind_host: str = "127.0.0.1",
) -> None:
    """Build the state, listen, tell the master where, and serve until ``shutdown``."""
    state = build_state(index, config)
    checkpointer = None
    if config.get("checkpoint_dir"):
        checkpointer = ckpt.PsCheckpointer(
            config["checkpoint_dir"],
            str(config["job_id"]),
            index,
            state,
            copy_threads=snapshot_copy_threads(os.environ),
        )
    service = PsService(state, checkpointer)
    server = Server((bind_host, 0), secret, service.handle)
    service.server = server
    register(server.address[1])
    log.info(
        "PS %d: %d rows x %d (%.1f MiB) on port %d",
        index,
        state.weights.shape[0],
        state.weights.shape[1],
        state.nbytes / 2**20,
        server.address[1],
    )
    try:
        server.serve_forever()
    finally:
        if checkpointer is not None:
            checkpointer.close()
        server.close()
