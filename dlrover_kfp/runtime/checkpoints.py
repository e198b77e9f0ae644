"""The master's side of flash checkpoints: ask every PS to snapshot, then commit when all persisted.

A checkpoint runs on its own thread so that the master's loop keeps sampling while the PS write
to disk; a checkpoint that comes due while the previous one is still persisting is skipped (the
PS would otherwise block training until the earlier write is done). The master's own state (the
data-shard ledger) goes into the manifest's ``extra``, so a restored job resumes its data where
the restored parameters left it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from dlrover_kfp.errors import DlroverKfpError
from dlrover_kfp.training import checkpoint as ckpt
from dlrover_kfp.training.wire import Connection, connect

log = logging.getLogger("dlrover_kfp.checkpoints")

#: Seconds between polls of the PS's persist status.
_POLL_S = 0.05

#: Seconds any one request to a PS may take (connect, ``checkpoint``, ``checkpoint_status``,
#: ``shutdown``). The longest answer is the snapshot's copy into shared memory, which blocks
#: training: ~0.09 s per GiB measured (training/ps_server.py), under 3 s for a 32 GiB PS; the
#: rest answer in milliseconds. A PS that takes 10 s is frozen (SIGSTOPped, its node hung): the
#: request fails, the checkpoint with it, and nothing of the master waits on it longer.
RPC_TIMEOUT_S = 10.0
#: Seconds a checkpoint's persist may take (polled, each poll bounded by RPC_TIMEOUT_S): the
#: PS write their part to disk behind training, at disk speed, so this bounds a slow disk, not
#: a frozen PS.
PERSIST_TIMEOUT_S = 600.0


class CheckpointCoordinator:
    """Coordinates the job's PS through one control connection each."""

    def __init__(
        self,
        root: Path,
        ps_addresses: Sequence[tuple[str, int]],
        secret: bytes,
        *,
        keep: int = 3,
        timeout_s: float = PERSIST_TIMEOUT_S,
        rpc_timeout_s: float = RPC_TIMEOUT_S,
        prune_tmp: bool = True,
    ) -> None:
        """``prune_tmp``: remove every unfinished ``step-N.tmp`` (a crashed run's); not while
        another coordinator of the job may still be writing one (a live PS switch's).
        ``timeout_s`` bounds a checkpoint's persist, ``rpc_timeout_s`` every single request."""
        self.root = root
        self.keep = keep
        self.timeout_s = timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        root.mkdir(parents=True, exist_ok=True)
        ckpt.prune_checkpoints(root, keep, all_tmp=prune_tmp)
        self.connections: list[Connection] = [
            connect(address, secret, timeout=rpc_timeout_s) for address in ps_addresses
        ]
        #: set by :meth:`close`: a checkpoint still waiting for its persist gives up
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.committed: list[tuple[int, Path]] = []
        #: the extra (shard ledger, counts, PS 0's applied tally) of the last committed checkpoint
        self.committed_extra: dict[str, Any] | None = None
        self.blocked_s: list[float] = []
        self.error: BaseException | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def checkpoint(self, step: int, *, extra: dict[str, Any], wait: bool = True) -> bool:
        """Start a checkpoint of ``step``; False if the previous one is still in flight.

        With ``wait`` it returns once the checkpoint is committed (and raises what failed).
        """
        if self.busy and not wait:
            return False
        self._start(step, extra)
        if wait:
            self.join()
            if self.error is not None:
                raise self.error
        return True

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def take_failure(self) -> BaseException | None:
        """What made the last background checkpoint fail, once it has ended (then cleared, so
        each failure is reported once); None while one runs or when it committed. A failed
        checkpoint commits nothing: the previous committed one stays the one to restore."""
        if self.busy:
            return None
        error, self.error = self.error, None
        return error

    def snapshot(self, step: int, *, extra: dict[str, Any]) -> None:
        """Start a checkpoint of ``step`` and return once every PS has its snapshot in shared
        memory (a PS restores from that at once); persisting and committing go on behind.

        Used while the workers are paused: the pause lasts the copy, not the write to disk.
        """
        snapped = self._start(step, extra)
        thread = self._thread
        while not snapped.wait(0.05) and thread is not None and thread.is_alive():
            pass
        if self.error is not None:
            raise self.error

    def _start(self, step: int, extra: dict[str, Any]) -> threading.Event:
        """Run a checkpoint of ``step`` on its own thread, after the previous one; the event
        is set once every PS has taken its snapshot."""
        self.join()
        self.error = None  # the previous checkpoint's outcome is not this one's
        snapped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(step, extra, snapped), name="checkpoint", daemon=True
        )
        self._thread.start()
        return snapped

    def _run(self, step: int, extra: dict[str, Any], snapped: threading.Event) -> None:
        try:
            with self._lock:
                replies = [conn.request("checkpoint", {"step": step}) for conn in self.connections]
                blocked = [float(reply.meta["blocked_s"]) for reply in replies]
                snapped.set()
                # PS 0's rows applied per shard, taken with its snapshot (core/applied.py):
                # restored with the state, so a rollback forgets what the state forgets.
                applied = replies[0].meta.get("applied") if replies else None
                if applied is not None:
                    extra = {**extra, "applied": applied}
                self.blocked_s.append(max(blocked))
                parts = [self._wait_persisted(conn, step) for conn in self.connections]
                path = ckpt.commit(self.root, step, parts, extra, keep=self.keep)
                self.committed.append((step, path))
                self.committed_extra = extra
                log.info(
                    "checkpoint of step %d committed at %s (training paused %.3fs)",
                    step,
                    path,
                    max(blocked),
                )
        except BaseException as exc:
            self.error = exc
            log.error("checkpoint of step %d failed: %s", step, exc)
            # Its parts are never restored from; on a full disk they hold the space that the
            # next checkpoint and the run's profile need.
            ckpt.discard_unfinished(self.root, step)

    def _wait_persisted(self, conn: Connection, step: int) -> ckpt.PartRecord:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline and not self._closing.is_set():
            status = conn.request("checkpoint_status").meta
            if status["step"] == step and status["done"]:
                if status["error"]:
                    raise ckpt.CheckpointWriteError(f"PS persist failed: {status['error']}")
                return ckpt.PartRecord.from_dict(status["part"])
            time.sleep(_POLL_S)
        if self._closing.is_set():
            raise ckpt.CheckpointWriteError(f"step {step} abandoned: the coordinator closed")
        raise ckpt.CheckpointWriteError(f"step {step} not persisted within {self.timeout_s:.0f}s")

    def shutdown_ps(self, indices: Collection[int] | None = None) -> None:
        """Stop every PS (after the final checkpoint), or those of ``indices``."""
        self.join()
        for k, conn in enumerate(self.connections):
            if indices is None or k in indices:
                conn.request("shutdown")

    def roll_back(
        self, indices: Collection[int]
    ) -> tuple[ckpt.CheckpointChoice | None, dict[int, tuple[str, float]]]:
        """Roll the running PS of ``indices`` back to the last committed checkpoint in place,
        then close: the checkpoint to restore (None: none committed, the job's start) and, per
        PS that restored, where from (``memory``: its own snapshot buffer, ``volume``,
        ``start``) and in how many seconds.

        Another PS of the job crashed; its pod's supervisor restarts it, and it restores the
        same step. A checkpoint in flight is given up first (it cannot commit: a PS it needs is
        gone), so the choice is the last one committed before the crash. A PS missing from the
        answer did not roll back in place: it died too (and restarts by itself), failed the
        restore (and was asked to restart), or a checkpoint thread still held its connection;
        the caller waits for it to register again. Each request's answer is bounded by
        ``rpc_timeout_s``: a restore reads the PS's part at memory speed (~1 s a GiB measured
        here) or the volume's."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join(self.rpc_timeout_s)
        held = self._thread is not None and self._thread.is_alive()
        if held:
            self.close()  # aborts the connections the thread waits on: nothing commits after
        choice = ckpt.select_checkpoint(self.root)  # committed ones only
        meta = {"choice": None if choice is None else choice.to_dict()}
        asked = [] if held else [k for k in range(len(self.connections)) if k in indices]
        for k in list(asked):  # all at once: the PS restore side by side, not one after another
            try:
                self.connections[k].send("restore", meta)
            except (DlroverKfpError, OSError) as exc:
                log.warning("PS %d did not take the restore request: %s", k, exc)
                asked.remove(k)
        restored: dict[int, tuple[str, float]] = {}
        for k in asked:
            conn = self.connections[k]
            try:
                reply = conn.recv()
                if reply.kind != "error":
                    restored[k] = (str(reply.meta["source"]), float(reply.meta["seconds"]))
                    continue
                # It runs but could not restore (its state is then half-written): its pod's
                # supervisor starts it again, and it restores as a restarted PS does.
                log.warning("PS %d failed to roll back: %s", k, reply.meta.get("message"))
                conn.request("restart")
            except (DlroverKfpError, OSError) as exc:
                log.warning("PS %d did not roll back in place: %s", k, exc)
        self.close()
        return choice, restored

    def close(self) -> None:
        """Let a checkpoint in flight end, for at most ``rpc_timeout_s``, then give it up (not
        committed) and close the connections: the master's cleanup, and a rollback after a
        PS died or froze, never wait longer on a PS than one request may take."""
        if self._thread is not None:
            self._thread.join(self.rpc_timeout_s)
        self._closing.set()
        for conn in self.connections:
            conn.abort()  # wakes the checkpoint thread if it still waits on a PS
        if self._thread is not None:
            self._thread.join(self.rpc_timeout_s)
            if self._thread.is_alive():
                log.warning("a checkpoint thread still runs after the coordinator closed")
