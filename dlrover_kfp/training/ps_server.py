"""A parameter server: serves lookups and applies pushes for the rows it owns, in parallel.

Requests (over :mod:`dlrover_kfp.training.wire`):

* ``lookup``  arrays ``(slots,)``, meta ``{"dense": bool}`` -> ``rows`` ``(rows[, dense])``
* ``push``    arrays ``(slots, grads[, dense_grad])``, meta ``{"tag": [epoch, shard, offset,
  rows, shard_rows, last]}`` on PS 0 -> ``ok``; PS 0 counts the rows it applied per shard pass
  (:mod:`dlrover_kfp.core.applied`) and returns the tally with each checkpoint
* ``checkpoint`` meta ``{"step": n}`` -> ``ok`` ``{"blocked_s": t}``: copy the state into shared
  memory now (training on this PS pauses for the copy only) and persist it in the background;
* ``checkpoint_status`` -> ``{"done": bool, "part": {...}}`` once the persist has finished;
* ``stats`` -> counters; ``shutdown`` -> ``ok``, then the server stops;
* ``restart`` -> ``ok``, then the server stops and the process exits to be started again in its
  pod (:mod:`.supervisor`), restoring the step the master rolls the job back to;
* ``restore`` meta ``{"choice": {...} | null}`` -> ``ok`` ``{"source", "seconds"}``: roll the
  running state back to its part of the committed checkpoint ``choice`` (null: the job's start)
  while no request runs (the gate, as for a checkpoint), from this PS's own snapshot buffer when
  it holds exactly that part, else the volume; the process, its port and its buffer stay;
* ``transfer_*``: this PS's rows to the PS that replace it (:mod:`.transfer_protocol`).

**Parallelism.** Every connection (one per worker, plus the master's) is served on its own
thread (``Server(threaded=True)``), and the heavy work of a request (``index_select``, the
Adagrad arithmetic, ``index_add_``, socket I/O) runs in torch kernels and syscalls that release
the GIL; so lookups and pushes of different workers run at once, and a PS given more cores
serves more workers. torch itself runs one intra-op thread per connection thread: parallelism
comes from the workers' concurrent requests, not from splitting one request's small kernels.

**Consistency (what a lookup sees).** A connection's requests are handled in order, so a worker
always reads rows that include every push it sent before its lookup. Across workers, the
embedding rows follow Hogwild (Recht et al., 2011), as asynchronous PS training usually does:

* a lookup that runs while another worker's push updates the same rows may return a *torn*
  row, some of its ``d`` floats before that update and some after (each float is read and
  written whole). Both values are valid recent parameters of the same row; the gradient is
  computed at a point between two consecutive updates;
* two pushes that update the same row at once add into it with ``index_add_``, element by
  element; an element updated by both at the same instant can lose one of the two additions
  (and the same holds for the Adagrad accumulator). With Zipf-distributed ids the head rows are
  touched by every push, so this happens, rarely, on exactly the rows that get the most updates.

``tests/integration/test_async_training.py`` measures that this does not hurt: with several
workers the final held-out loss stays within a stated tolerance of the synchronous run's.
The dense parameters (on PS 0) are small and shared by every step, so they are kept exact: a
lock makes each dense update and each copy of the dense vector whole.

A checkpoint must be a consistent copy, so it takes the PS's gate exclusively: it waits for the
requests in flight, blocks new ones while it copies, then lets them go (the PS of a job are
copied at nearly the same moment, not atomically together: the usual semantics of asynchronous
PS training).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from dlrover_kfp.core.applied import AppliedTally
from dlrover_kfp.core.documents import parse
from dlrover_kfp.core.partition import Partition, overlap
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.training import checkpoint as ckpt
from dlrover_kfp.training import transfer_protocol as transfer
from dlrover_kfp.training.cpu_limit import env_cpu
from dlrover_kfp.training.ps_state import PsConfig, PsState
from dlrover_kfp.training.wire import Message, PeerInfo, Server

log = logging.getLogger("dlrover_kfp.ps")

#: The request that makes a PS restart in its pod (runtime/checkpoints.py sends it).
RESTART = "restart"
#: The request that rolls a running PS back to a committed checkpoint (runtime/checkpoints.py).
RESTORE = "restore"


class Gate:
    """Many requests at once, or one checkpoint alone (a readers-writer lock that prefers the
    writer, so that a stream of requests cannot starve a checkpoint)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._active = 0
        self._exclusive = False
        self._waiting_exclusive = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self._waiting_exclusive:
                self._cond.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                if not self._active:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting_exclusive += 1
            while self._exclusive or self._active:
                self._cond.wait()
            self._waiting_exclusive -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class PsService:
    """The request handlers of one PS around its :class:`PsState`; thread-safe (see the module
    docstring for what concurrent requests see)."""

    def __init__(self, state: PsState, checkpointer: ckpt.PsCheckpointer | None) -> None:
        self.state = state
        self.checkpointer = checkpointer
        self.server: Server | None = None
        self.gate = Gate()
        self._dense_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self.lookups = 0
        self.pushes = 0
        self.rows_served = 0
        self.transfer_bytes = 0
        self.busy_s = 0.0
        #: the master asked this PS to restart in its pod (a ``restart`` request)
        self.restart_asked = False

    def handle(self, peer: PeerInfo, msg: Message) -> Message | None:
        began = time.perf_counter()
        try:
            if msg.kind == "checkpoint":
                with self.gate.exclusive():
                    return self._checkpoint(msg)
            if msg.kind == RESTORE:
                with self.gate.exclusive():
                    return self._restore(msg)
            with self.gate.shared():
                return self._dispatch(msg)
        finally:
            elapsed = time.perf_counter() - began
            with self._stats_lock:
                self.busy_s += elapsed

    def _slots(self, msg: Message) -> torch.Tensor:
        """The request's first array as row slots, checked: 1-D integers within this PS."""
        if not msg.arrays:
            raise ValueError(f"{msg.kind}: expected the slots as the first array, got none")
        slots = msg.arrays[0]
        if slots.ndim != 1 or slots.dtype.kind != "i":
            raise ValueError(
                f"{msg.kind}: slots must be a 1-D integer array, got {slots.dtype} {slots.shape}"
            )
        rows = self.state.weights.shape[0]
        if len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= rows):
            raise ValueError(
                f"{msg.kind}: slots must be in [0, {rows}) on PS {self.state.config.ps_index}, "
                f"got {int(slots.min())}..{int(slots.max())}"
            )
        return torch.from_numpy(slots)

    def _checked_push(self, msg: Message) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Slots, gradients and the dense gradient of a push, every one checked before any is
        applied: a push is applied whole or not at all."""
        slots = self._slots(msg)
        if len(msg.arrays) not in (2, 3):
            raise ValueError(f"push: expected 2 or 3 arrays, got {len(msg.arrays)}")
        grads = msg.arrays[1]
        expected = (len(slots), self.state.weights.shape[1])
        if grads.dtype != np.float32 or grads.shape != expected:
            raise ValueError(
                f"push: gradients must be float32 {expected}, got {grads.dtype} {grads.shape}"
            )
        dense_grad = None
        if len(msg.arrays) == 3:
            dense = self.state.dense
            if dense is None:
                raise ValueError(f"PS {self.state.config.ps_index} holds no dense parameters")
            given = msg.arrays[2]
            if given.dtype != np.float32 or given.shape != tuple(dense.shape):
                raise ValueError(
                    f"push: the dense gradient must be float32 {tuple(dense.shape)}, "
                    f"got {given.dtype} {given.shape}"
                )
            dense_grad = torch.from_numpy(given)
        sparse = torch.from_numpy(grads)
        # One sum per array (~20 µs for a step's push) rather than isfinite over every element
        # (~30x more): a NaN or an infinity anywhere makes the sum non-finite, and it would make
        # the rows it touches NaN for the rest of the job.
        for name, tensor in (("gradients", sparse), ("dense gradient", dense_grad)):
            if tensor is not None and tensor.numel() and not torch.isfinite(tensor.sum()):
                raise ValueError(f"push: the {name} hold NaN or infinite values")
        return slots, sparse, dense_grad

    def _dispatch(self, msg: Message) -> Message | None:
        kind = msg.kind
        if kind == "lookup":
            slots = self._slots(msg)
            rows = self.state.lookup(slots).numpy()
            with self._stats_lock:
                self.lookups += 1
                self.rows_served += len(rows)
            if msg.meta.get("dense"):
                if self.state.dense is None:
                    raise ValueError(f"PS {self.state.config.ps_index} holds no dense parameters")
                # A copy, whole: the reply may leave after other requests updated the vector.
                with self._dense_lock:
                    dense = self.state.dense.numpy().copy()
                return Message("rows", {}, (rows, dense))
            return Message("rows", {}, (rows,))
        if kind == "push":
            slots, grads, dense_grad = self._checked_push(msg)
            tag = _push_tag(msg.meta)
            if len(slots):
                self.state.apply_sparse(slots, grads)
            if dense_grad is not None:
                with self._dense_lock:
                    self.state.apply_dense(dense_grad)
            with self._stats_lock:
                self.pushes += 1
                if tag is not None:
                    self.state.applied.add(*tag)
            return Message("ok", {}, ())
        if kind.startswith("transfer_"):
            return self._transfer(kind, msg.meta)
        if kind in ("checkpoint", RESTORE):  # only through handle(), holding the gate
            raise RuntimeError(f"{kind} must be dispatched by handle()")
        if kind == "checkpoint_status":
            if self.checkpointer is None:
                raise ValueError("this PS was started without a checkpoint directory")
            return Message("checkpoint_status", self.checkpointer.status(), ())
        if kind == "stats":
            return Message("stats", self.stats(), ())
        if kind in ("shutdown", RESTART):
            # restart: the master rolls every PS back to one committed step; this process
            # ends and its pod's supervisor starts it again (serve() returns True).
            self.restart_asked = self.restart_asked or kind == RESTART
            if self.server is not None:
                self.server.stop()
            return Message("ok", {}, ())
        raise ValueError(f"unknown request {kind!r}")

    def _transfer(self, kind: str, meta: dict[str, Any]) -> Message:
        """The old PS's side of a PS change (:mod:`.transfer_protocol`)."""
        state = self.state
        if kind == transfer.TRACK:
            state.track(_meta_int(meta, "generation", 0))
            return Message("ok", {"rows": int(state.weights.shape[0])}, ())
        if kind == transfer.UNTRACK:
            if state.tracking == _meta_int(meta, "generation", 0):
                state.untrack()
            return Message("ok", {}, ())
        if kind == transfer.ROWS:
            reply = self._transfer_rows(meta)
        elif kind == transfer.DENSE:
            if state.dense is None or state.dense_accum is None:
                raise ValueError(f"PS {state.config.ps_index} holds no dense parameters")
            with self._dense_lock:  # the pair whole, as one dense update left it
                arrays = (state.dense.numpy().copy(), state.dense_accum.numpy().copy())
            with self._stats_lock:  # the workers are paused: the tally of exactly these
                applied = state.applied.to_dict()
            reply = Message(transfer.DENSE, {"applied": applied}, arrays)
        else:
            raise ValueError(f"unknown request {kind!r}")
        with self._stats_lock:
            self.transfer_bytes += sum(a.nbytes for a in reply.arrays)
        return reply

    def _transfer_rows(self, meta: dict[str, Any]) -> Message:
        """Rows ``[start, start + count)`` of this PS's overlap with the requester, all of them
        or (``dirty``) those updated since the requester's ``transfer_track``."""
        state = self.state
        mine = state.config.partition
        new = Partition(mine.total_rows, _meta_int(meta, "num_ps", 1))
        part = overlap(mine, state.config.ps_index, new, _meta_int(meta, "index", 0))
        start, count = _meta_int(meta, "start", 0), _meta_int(meta, "count", 0)
        limit = transfer.MAX_TRANSFER_BYTES // transfer.row_bytes(int(state.weights.shape[1]))
        if count > limit:
            raise ValueError(f"{transfer.ROWS}: count {count} exceeds {limit} rows a request")
        generation = _meta_int(meta, "generation", 0)
        state.check_tracking(generation)
        old_slots, new_slots = (torch.from_numpy(a) for a in part.slots(start, count))
        if meta.get("dirty") is True:
            marked = state.marked(old_slots, generation)
            old_slots, new_slots = old_slots[marked], new_slots[marked]
        weights = state.weights.index_select(0, old_slots)
        accum = state.accum.index_select(0, old_slots)
        return Message(transfer.ROWS, {}, (new_slots.numpy(), weights.numpy(), accum.numpy()))

    def _checkpoint(self, msg: Message) -> Message:
        if self.checkpointer is None:
            raise ValueError("this PS was started without a checkpoint directory")
        step = msg.meta.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63:
            raise ValueError(f"checkpoint: meta key 'step' must be an integer >= 0, got {step!r}")
        blocked = self.checkpointer.snapshot(step, self.state)
        # Taken under the gate with the state: the tally of exactly the pushes the copy holds.
        with self._stats_lock:
            applied = self.state.applied.to_dict()
        return Message("ok", {"blocked_s": blocked, "applied": applied}, ())

    def _restore(self, msg: Message) -> Message:
        """The state rolled back to the committed checkpoint the master names, in place.

        Another PS of the job crashed and the master rolls every PS back to the same committed
        step: this one, still running, restores its part without a new process (the start of
        one, the interpreter and torch, is seconds at a fraction of a core), from the snapshot
        in its own buffer when that is the committed part, else from the volume
        (:meth:`~.checkpoint.PsCheckpointer.restore`). With no checkpoint committed yet
        (``choice`` null) the job starts over: the state is initialised as at a start."""
        if self.checkpointer is None:
            raise ValueError("this PS was started without a checkpoint directory")
        raw = msg.meta.get("choice")
        if raw is not None and not isinstance(raw, dict):
            raise ValueError(f"{RESTORE}: meta key 'choice' must be an object or null, got {raw!r}")
        began = time.perf_counter()
        if raw is None:
            fresh = PsState(self.state.config).arrays()
            self.state.untrack()
            for name, tensor in self.state.arrays().items():
                tensor.copy_(fresh[name])
            source = "start"
            with self._stats_lock:
                self.state.applied = AppliedTally()
        else:
            choice = ckpt.CheckpointChoice.from_dict(raw)
            source = "memory" if self.checkpointer.restore(self.state, choice) else "volume"
        seconds = time.perf_counter() - began
        log.info("PS %d: rolled back from %s in %.3fs", self.state.config.ps_index, source, seconds)
        return Message("ok", {"source": source, "seconds": seconds}, ())

    def stats(self) -> dict[str, Any]:
        return {
            "ps_index": self.state.config.ps_index,
            "lookups": self.lookups,
            "pushes": self.pushes,
            "rows_served": self.rows_served,
            "busy_s": self.busy_s,
            "state_bytes": self.state.nbytes,
            "transfer_bytes": self.transfer_bytes,
            "applied": self.state.applied.to_dict(),
        }


def _push_tag(meta: dict[str, Any]) -> tuple[int, int, int, int, int, bool] | None:
    """A push's shard tag ``[epoch, shard, offset, rows, shard_rows, last (0/1)]``, checked
    before anything is applied (a bad tag applies nothing)."""
    tag = meta.get("tag")
    if tag is None:
        return None
    if (
        not isinstance(tag, list)
        or len(tag) != 6
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in tag)
        or tag[2] + tag[3] > tag[4]
        or tag[5] > 1
    ):
        raise ValueError(
            "push: meta key 'tag' must be [epoch, shard, offset, rows, shard_rows, last] of "
            f"integers >= 0 (offset + rows <= shard_rows, last 0 or 1), got {tag!r:.80}"
        )
    return tag[0], tag[1], tag[2], tag[3], tag[4], bool(tag[5])


def _meta_int(meta: dict[str, Any], key: str, minimum: int) -> int:
    """``meta[key]`` as an integer >= ``minimum``, or a ValueError naming it."""
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value < 2**63:
        raise ValueError(f"meta key {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def ps_config(index: int, config: dict[str, Any]) -> PsConfig:
    """PS ``index``'s part of the job configuration the master gave."""
    model = parse(ModelSpec, config["spec"]["model"], "job spec from the master", prefix="model.")
    return PsConfig(
        model=model,
        num_ps=int(config["num_ps"]),
        ps_index=index,
        learning_rate=float(config["spec"]["training"]["learning_rate"]),
        seed=int(config["seed"]),
    )


def build_state(index: int, config: dict[str, Any]) -> PsState:
    """This PS's state: restored from the job's checkpoint when asked to, else initialised."""
    own = ps_config(index, config)
    if config.get("restore") and config.get("checkpoint_dir"):
        # The master names the checkpoint when every PS must roll back to the same one.
        choice = config.get("restore_choice")
        restored = ckpt.restore_ps_state(
            config["checkpoint_dir"],
            own,
            config["job_id"],
            choice=None if choice is None else ckpt.CheckpointChoice.from_dict(choice),
        )
        if restored is not None:
            return restored
    return PsState(own)


def snapshot_copy_threads(env: Mapping[str, str]) -> int:
    """Threads for the snapshot copy: the pod's whole CPU (``DLROVER_KFP_POD_CPU``, at most 4),
    since training is paused.

    Two threads cut the pause for 1 GiB from ~0.09 s to ~0.06 s here; more than the pod's CPU
    would only be throttled. The count is fixed when the PS starts (the copy's thread pool is
    made with the buffer). A PS's CPU does not change under it: a PS of a new size is a new pod
    (core/reconcile.py migrates PS; only workers are resized in place), and its serving threads
    are one per connection, not sized by CPU: the quota bounds how many run at once.
    """
    return max(1, min(4, math.ceil(env_cpu(env))))


def new_checkpointer(
    index: int, config: dict[str, Any], state: PsState
) -> ckpt.PsCheckpointer | None:
    """PS ``index``'s flash-checkpoint buffer, sized for ``state`` (None: the job keeps no
    checkpoints). Reserving and pre-touching it costs ~0.5-1 s a GiB
    (:class:`~.checkpoint.shm.ShmSnapshot`): a PS that can, builds it before it is awaited."""
    if not config.get("checkpoint_dir"):
        return None
    return ckpt.PsCheckpointer(
        config["checkpoint_dir"],
        str(config["job_id"]),
        index,
        state,
        copy_threads=snapshot_copy_threads(os.environ),
    )


def serve(
    index: int,
    config: dict[str, Any],
    secret: bytes,
    register: Callable[[int], None],
    *,
    bind_host: str = "127.0.0.1",
    on_serving: Callable[[Server], None] | None = None,
    state: PsState | None = None,
    checkpointer: ckpt.PsCheckpointer | None = None,
) -> bool:
    """Build the state (unless given: one copied from the PS this one replaces) and its
    checkpoint buffer (unless given: one the new PS of a move built on standby), listen, tell
    the master where, and serve until ``shutdown`` or ``restart`` (``on_serving`` gets the
    server once registered: to stop it from elsewhere). True when it was asked to restart."""
    if state is None:
        state = build_state(index, config)
    if checkpointer is None:
        checkpointer = new_checkpointer(index, config, state)
    service = PsService(state, checkpointer)
    server = Server((bind_host, 0), secret, service.handle, threaded=True)
    service.server = server
    register(server.address[1])
    if on_serving is not None:
        on_serving(server)
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
    return service.restart_asked
