"""The pause of one PS move, three ways side by side in one run: network, shared memory, restart.

    python benchmarks/ps_move_pause.py                  # a 1.0 GiB PS, 3 rounds (2.5 min here)
    python benchmarks/ps_move_pause.py --gib 0.125 --rounds 1   # a quick check (~30 s)

Workers pause while a PS moves, and the pause is what a move costs training. Each method moves
the same PS (one PS of a job, ``--gib`` GiB of embedding rows and Adagrad accumulators, d = 16,
plus the dense parameters), between real PS processes (``python -m dlrover_kfp.training.node
ps``, as a pod runs them), driven by the real master service (``MasterService`` with a
``PsSwitch``, ``CheckpointCoordinator``) from this process, which plays the master's part of
``runtime/elastic.py``. A pushing client (a thread of this process, its own connection, as a
worker) pushes ``--push-rows`` random rows at ``--push-rate`` pushes a second to the old PS
from before the move starts until the pause.

**The pause** runs from the moment pushes stop (the pusher's last push applied: the workers
have paused) until the new PS has answered its first request (a lookup, on a new connection,
as a worker's after the switch). Per method, in the pause:

1. ``network`` (today's live move, ``ps_transfer``): before the pause the new PS process starts
   and copies every row while the pushes go on (``copy_rows``: the old PS marks each row
   updated from then on); in the pause it fetches the rows marked since and the dense
   parameters (``finish_copy``) and serves.
2. ``shm`` (the live move until 8976ee5, rebuilt here only as the baseline; it needs one
   ``/dev/shm`` for both pods, which no cluster has): before the pause the new PS process
   starts (torch loaded) and waits; in the pause the old PS snapshots into shared memory
   (the checkpoint module's flash snapshot, ``CheckpointCoordinator.snapshot``), the new PS
   restores from that snapshot (``restore_ps_state``) and serves; the old PS persists behind.
3. ``restart`` (stop-and-restart, ``migration="restart"``): in the pause the old PS writes a
   checkpoint to disk and it is committed (``CheckpointCoordinator.checkpoint``), the old PS
   stops, a new PS process starts (interpreter and torch import counted), restores from disk
   and serves. The checkpoint was just written on this machine, so the restore reads the page
   cache: a best case for this method (a pod on another node reads the volume).

Columns: ``pause``; ``registered``, the pause until the master heard from the new PS (the rest
is the first lookup); ``moving``, the part that moved the state (network: ``finish_copy``, as
the new PS reports it; shm: the snapshot; restart: the checkpoint written and committed);
``ready->serving``, from the new PS's own log, its state ready (moved or restored) to serving:
a new PS reserves and touches its own flash-checkpoint buffer before it serves; the new PS of
a live move does it on standby, before the pause (``node._copied_state``), the others in the
pause. The new PS of a live move also asks the master for its release every 50 ms.

The pushes' ids are uniform over the PS's rows, the worst case for rows sent again (Zipf ids,
as real ones, hit the same head rows again and mark fewer); the default of 100 pushes of
4,096 rows a second is ~400k row updates a second, a third of one worker at full speed here
(docs/training-benchmarks.md: ~129 steps/s of ~11k unique rows). Rows sent again grow with
``--push-rate`` x the copy's length.

Also reported: what moved (rows and bytes copied, rows updated during the copy and sent again),
the copy phase's length and rate, and whether the new PS's rows (a random sample, and the dense
parameters) equal the old PS's bit for bit. Methods run in an order that rotates each round;
each run starts a fresh old PS from the same seed. Ratios are per round (same round's runs),
median over rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_kfp.core.documents import to_dict
from dlrover_kfp.core.pod_env import POD_CPU_ENV, POD_SHM_ENV
from dlrover_kfp.core.shards import ShardLedger
from dlrover_kfp.core.spec import ModelSpec
from dlrover_kfp.files import memory_dir
from dlrover_kfp.runtime.checkpoints import CheckpointCoordinator
from dlrover_kfp.runtime.master import MasterService, MasterState, PsSwitch
from dlrover_kfp.training.wire import Server, connect, new_secret, secret_to_env
from dlrover_kfp.training.wire.auth import SECRET_ENV_VAR

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("network", "shm", "restart")
DIM = 16
#: bytes per row of the state: weights and Adagrad accumulator, float32 each
ROW_STATE_BYTES = 2 * 4 * DIM
LEARNING_RATE = 0.05
SEED = 0
#: rows read back from old and new PS to check the move (and the first request's size)
SAMPLE_ROWS = 4096
#: seconds a PS process may take to start, build or restore 1 GiB, or copy it, on a busy VM
PS_TIMEOUT_S = 300.0
#: memory a run holds at once, in states: old PS (state + its shm buffer), new PS (the same),
#: the shm method's snapshot read into fresh memory, and slack
MEMORY_STATES = 5.5
_RESTORED = re.compile(r"restored step \d+ from \S+ \((\w+),")
#: a PS log line's time (node.main's logging format: asctime, milliseconds)
_LOGGED_AT = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
#: the lines where a new PS has its state (moved over the network, or restored) and serves
_STATE_READY = re.compile(r"PS 0: (moved \d+ rows|restored step)")
_SERVING = re.compile(r"PS 0: \d+ rows x \d+ .* on port \d+")


# ----------------------------------------------------------------------------- bookkeeping


@dataclass(frozen=True, slots=True)
class Move:
    """One move of one method: its pause and what it moved."""

    method: str
    #: pushes stopped -> the new PS answered its first request
    pause_s: float
    #: pushes stopped -> the new PS registered with the master
    registered_s: float
    #: the new PS's sampled rows and dense parameters equal the old PS's
    exact: bool
    #: where the new PS's state came from: network, shm or disk
    source: str
    #: the part of the pause that moved the state: the rows marked since the copy and the
    #: dense part (network), the snapshot into shm (shm), the checkpoint committed (restart)
    moving_s: float
    #: from the new PS's log: its state ready (moved or restored) -> it serves; its own
    #: checkpoint buffer reserved and touched, its server, its registration (NaN: not logged)
    buffer_s: float
    state_bytes: int
    rows: int = 0
    copy_bytes: int = 0
    copy_s: float = 0.0
    resent_rows: int = 0
    resent_bytes: int = 0
    pushes_during_copy: int = 0
    pushed_rows_during_copy: int = 0


def median_and_range(values: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def ratios(rounds: Sequence[dict[str, Move]], over: str = "network") -> dict[str, list[float]]:
    """Per round, each other method's pause over ``over``'s: the same round's runs, so that
    a machine that slows down between rounds slows both sides of a ratio alike."""
    out: dict[str, list[float]] = {}
    for moves in rounds:
        base = moves[over].pause_s
        for method, move in moves.items():
            if method != over:
                out.setdefault(f"{method}/{over}", []).append(move.pause_s / base)
    return out


def state_rows(gib: float) -> int:
    """Rows of a PS whose weights and accumulators take ``gib`` GiB."""
    return int(gib * 2**30) // ROW_STATE_BYTES


# ----------------------------------------------------------------------------- the pods


@dataclass
class Pod:
    """A PS process, its log and its own shared-memory directory (a pod's ``/dev/shm``)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    shm_dir: Path

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def restored_from(self) -> str:
        found = _RESTORED.search(self.log.read_text(errors="replace"))
        return found.group(1) if found else "?"

    def buffer_s(self) -> float:
        """Seconds from the log line that says the state is ready to the one that says it
        serves (both written by the PS process, one clock): NaN when either is missing."""
        return ready_to_serving(self.log.read_text(errors="replace"))


def ready_to_serving(log: str) -> float:
    """Seconds between a PS log's state-ready line and its serving line, NaN without them."""
    ready = serving = None
    for line in log.splitlines():
        at = _LOGGED_AT.match(line)
        if at is None:
            continue
        if ready is None and _STATE_READY.search(line):
            ready = datetime.datetime.strptime(at.group(1), "%Y-%m-%d %H:%M:%S,%f")
        elif ready is not None and _SERVING.search(line):
            serving = datetime.datetime.strptime(at.group(1), "%Y-%m-%d %H:%M:%S,%f")
            break
    if ready is None or serving is None:
        return math.nan
    return (serving - ready).total_seconds()


@dataclass
class Bench:
    """What every run shares: the arguments, the secret, the work folders."""

    args: argparse.Namespace
    model: ModelSpec
    secret: bytes
    work: Path
    shm_root: Path

    def job_config(self, checkpoint_dir: Path) -> dict[str, Any]:
        """The configuration the master gives a PS (runtime/job.py's ``job_config``)."""
        return {
            "spec": {"model": to_dict(self.model), "training": {"learning_rate": LEARNING_RATE}},
            "num_ps": 1,
            "synchronous": False,
            "seed": SEED,
            "checkpoint_dir": str(checkpoint_dir),
            "job_id": "ps-move-pause",
        }

    def launch(self, name: str, master: Server, shm_dir: Path, generation: int = 0) -> Pod:
        """``python -m dlrover_kfp.training.node ps 0``, as a pod starts it."""
        shm_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        env = {
            **os.environ,
            SECRET_ENV_VAR: secret_to_env(self.secret),
            POD_SHM_ENV: str(shm_dir),
            "PYTHONPATH": str(ROOT),
        }
        if self.args.pod_cpu is not None:
            env[POD_CPU_ENV] = str(self.args.pod_cpu)
        host, port = master.address
        cmd = [sys.executable, "-m", "dlrover_kfp.training.node", "ps", "0"]
        cmd += ["--master", f"{host}:{port}", "--generation", str(generation)]
        log = self.work / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=out)
        return Pod(name, proc, log, shm_dir)


def stop(pod: Pod) -> None:
    """Wait for a PS that was asked to shut down; kill it if it does not end."""
    try:
        pod.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pod.proc.kill()
        pod.proc.wait()


def shutdown(address: tuple[str, int], secret: bytes) -> None:
    with contextlib.suppress(Exception), connect(address, secret, timeout=10) as conn:
        conn.request("shutdown")


class Master:
    """The real master service on a wire server, as ``JobRun.run`` serves it."""

    def __init__(self, job_config: dict[str, Any], secret: bytes) -> None:
        ledger = ShardLedger(ranges=((0, 0, 1),), epochs=1)
        self.state = MasterState(ledger=ledger, num_ps=1, job_config=job_config)
        self.service = MasterService(self.state)
        self.server = Server(
            ("127.0.0.1", 0),
            secret,
            self.service.handle,
            on_disconnect=self.service.on_disconnect,
        )
        self.server.serve_in_thread(name="master")

    def wait(self, done: Callable[[MasterState], Any], what: str, pods: Sequence[Pod]) -> Any:
        """Poll (every millisecond) until ``done(state)`` is true, under the state's lock; a
        pod that exits meanwhile, or a timeout, fails with the pod's log."""
        deadline = time.monotonic() + PS_TIMEOUT_S
        while True:
            with self.state.lock:
                value = done(self.state)
            if value:
                return value
            for pod in pods:
                if pod.proc.poll() is not None:
                    raise RuntimeError(
                        f"{pod.name} exited ({pod.proc.returncode}) before {what}:\n{pod.tail()}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {PS_TIMEOUT_S:.0f}s")
            time.sleep(0.001)

    def close(self) -> None:
        self.server.close()


class Pusher:
    """Pushes random rows to the old PS at a steady rate from a thread of its own, as workers
    do (one connection, each push applied before the next), until :meth:`stop`."""

    def __init__(
        self, address: tuple[str, int], secret: bytes, rows: int, args: argparse.Namespace
    ):
        self.conn = connect(address, secret, timeout=60)
        reply = self.conn.request("lookup", {"dense": True}, (np.zeros(1, np.int64),))
        self.dense_size = len(reply.arrays[1])
        self.rows_on_ps = rows
        self.push_rows = min(args.push_rows, rows)
        self.interval_s = 1.0 / args.push_rate
        #: (time, rows) of every push applied
        self.pushed: list[tuple[float, int]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pusher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng = np.random.default_rng(1)
        due = time.perf_counter()
        try:
            while not self._stop.is_set():
                # Unique slots, as workers aggregate duplicate ids before pushing.
                slots = np.unique(rng.integers(0, self.rows_on_ps, self.push_rows))
                grads = rng.standard_normal((len(slots), DIM), np.float32)
                dense = rng.standard_normal(self.dense_size, np.float32)
                self.conn.request("push", None, (slots, grads, dense))
                self.pushed.append((time.perf_counter(), len(slots)))
                due = max(due + self.interval_s, time.perf_counter() - self.interval_s)
                self._stop.wait(max(0.0, due - time.perf_counter()))
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def between(self, start: float, end: float) -> tuple[int, int]:
        """Pushes applied, and rows they updated, between ``start`` and ``end``."""
        inside = [rows for at, rows in self.pushed if start <= at <= end]
        return len(inside), sum(inside)

    def stop(self) -> None:
        """Returns once the last push is applied (its reply came back)."""
        self._stop.set()
        self._thread.join()
        self.conn.close()
        if self.error is not None:
            raise RuntimeError(f"the pusher failed: {self.error}") from self.error


def read_sample(address: tuple[str, int], secret: bytes, slots: np.ndarray) -> list[np.ndarray]:
    """The rows at ``slots`` and the dense parameters, copied out of the reply."""
    with connect(address, secret, timeout=60) as conn:
        reply = conn.request("lookup", {"dense": True}, (slots,))
        return [a.copy() for a in reply.arrays]


# ----------------------------------------------------------------------------- the methods


@dataclass
class Run:
    """One move: a master, an old PS being pushed to, and what the move leaves to clean."""

    bench: Bench
    folder: Path
    #: the job's checkpoint directory (the run's volume), on the local disk
    checkpoints: Path
    master: Master
    pods: list[Pod] = field(default_factory=list)
    coordinator: CheckpointCoordinator | None = None

    @property
    def secret(self) -> bytes:
        return self.bench.secret

    def start_old(self, shm_dir: Path) -> tuple[Pod, tuple[str, int]]:
        pod = self.bench.launch(f"{self.folder.name}-old", self.master.server, shm_dir)
        self.pods.append(pod)
        address = self.master.wait(lambda s: s.ps_addresses.get(0), "the old PS served", [pod])
        return pod, (str(address[0]), int(address[1]))

    def first_request(self, address: tuple[str, int], slots: np.ndarray) -> list[np.ndarray]:
        """The new PS's first request: the sample's rows, as a worker's first lookup."""
        return read_sample(address, self.secret, slots)


def _switch(run: Run, copy_from: list[tuple[str, int]] | None) -> PsSwitch:
    """A switch of PS 0 to generation 1 (elastic.py ``_switch_ps``'s configuration)."""
    config = {**run.master.state.job_config, "num_ps": 1, "restore": True, "restore_choice": None}
    switch = PsSwitch(1, 1, frozenset({0}), config, copy_from=copy_from)
    with run.master.state.lock:
        run.master.state.switch = switch
    return switch


def _exact(before: list[np.ndarray], after: list[np.ndarray]) -> bool:
    return len(before) == len(after) and all(
        np.array_equal(a, b) for a, b in zip(before, after, strict=True)
    )


def move_network(run: Run, slots: np.ndarray, rows: int, state_bytes: int) -> Move:
    _, old_address = run.start_old(run.folder / "shm-old")
    pusher = Pusher(old_address, run.secret, rows, run.bench.args)
    time.sleep(run.bench.args.warmup)
    switch = _switch(run, [old_address])
    new = run.bench.launch(f"{run.folder.name}-new", run.master.server, run.folder / "shm-new", 1)
    run.pods.append(new)
    run.master.wait(lambda s: 0 in switch.standby, "the new PS copied its rows", [new])
    copied = time.perf_counter()
    pusher.stop()
    want = read_sample(old_address, run.secret, slots)
    began = time.perf_counter()
    with run.master.state.lock:
        switch.pausing = switch.released = True
    address = run.master.wait(lambda s: switch.addresses.get(0), "the new PS registered", [new])
    registered = time.perf_counter() - began
    got = run.first_request(address, slots)
    pause = time.perf_counter() - began
    moved = switch.moved[0]
    # The copy ended just before the new PS said so (one request): the pushes of its span.
    pushes, pushed = pusher.between(copied - moved["copy_s"], copied)
    return Move(
        "network",
        pause,
        registered,
        _exact(want, got),
        "network",
        moving_s=moved["finish_s"],
        buffer_s=new.buffer_s(),
        state_bytes=state_bytes,
        rows=int(moved["rows"]),
        copy_bytes=int(moved["bytes"] - moved["resent_bytes"]),
        copy_s=moved["copy_s"],
        resent_rows=int(moved["resent_rows"]),
        resent_bytes=int(moved["resent_bytes"]),
        pushes_during_copy=pushes,
        pushed_rows_during_copy=pushed,
    )


def move_shm(run: Run, slots: np.ndarray, rows: int, state_bytes: int) -> Move:
    shared = run.folder / "shm-shared"  # one /dev/shm for both pods: the old, cluster-less world
    _, old_address = run.start_old(shared)
    run.coordinator = CheckpointCoordinator(run.checkpoints, [old_address], run.secret)
    pusher = Pusher(old_address, run.secret, rows, run.bench.args)
    time.sleep(run.bench.args.warmup)
    switch = _switch(run, None)
    new = run.bench.launch(f"{run.folder.name}-new", run.master.server, shared, 1)
    run.pods.append(new)
    run.master.wait(lambda s: 0 in switch.standby, "the new PS started", [new])
    pusher.stop()
    want = read_sample(old_address, run.secret, slots)
    began = time.perf_counter()
    with run.master.state.lock:
        switch.pausing = True
    run.coordinator.snapshot(1, extra={})
    snapshot = time.perf_counter() - began
    with run.master.state.lock:
        switch.released = True
    address = run.master.wait(lambda s: switch.addresses.get(0), "the new PS registered", [new])
    registered = time.perf_counter() - began
    got = run.first_request(address, slots)
    pause = time.perf_counter() - began
    run.coordinator.join()  # the old PS persisted behind; not part of the pause
    return Move(
        "shm",
        pause,
        registered,
        _exact(want, got),
        new.restored_from(),
        snapshot,
        new.buffer_s(),
        state_bytes,
    )


def move_restart(run: Run, slots: np.ndarray, rows: int, state_bytes: int) -> Move:
    old, old_address = run.start_old(run.folder / "shm-old")
    coordinator = run.coordinator = CheckpointCoordinator(
        run.checkpoints, [old_address], run.secret
    )
    pusher = Pusher(old_address, run.secret, rows, run.bench.args)
    time.sleep(run.bench.args.warmup)
    pusher.stop()
    want = read_sample(old_address, run.secret, slots)
    began = time.perf_counter()
    # elastic.py _restart_with: checkpoint, the PS stop, the new ones start from it.
    coordinator.checkpoint(1, extra={})
    committed = time.perf_counter() - began
    coordinator.shutdown_ps()
    stop(old)
    coordinator.close()
    state = run.master.state
    with state.lock:
        state.ps_addresses.clear()
        state.job_config = {**state.job_config, "restore": True, "restore_choice": None}
    new = run.bench.launch(f"{run.folder.name}-new", run.master.server, run.folder / "shm-new")
    run.pods.append(new)
    address = run.master.wait(lambda s: s.ps_addresses.get(0), "the new PS registered", [new])
    registered = time.perf_counter() - began
    got = run.first_request(address, slots)
    pause = time.perf_counter() - began
    return Move(
        "restart",
        pause,
        registered,
        _exact(want, got),
        new.restored_from(),
        committed,
        new.buffer_s(),
        state_bytes,
    )


MOVES = {"network": move_network, "shm": move_shm, "restart": move_restart}


def run_method(bench: Bench, method: str, round_: int) -> Move:
    """One move of ``method`` from a fresh old PS; every process and file it made is gone
    when it returns (a GiB of shared memory per snapshot otherwise stays allocated)."""
    folder = bench.shm_root / f"r{round_}-{method}"
    folder.mkdir()
    checkpoints = bench.work / f"ckpt-r{round_}-{method}"
    master = Master(bench.job_config(checkpoints), bench.secret)
    run = Run(bench, folder, checkpoints, master)
    rows = bench.model.embedding_rows
    slots = np.sort(np.random.default_rng(round_).choice(rows, min(SAMPLE_ROWS, rows), False))
    state_bytes = rows * ROW_STATE_BYTES
    try:
        return MOVES[method](run, slots.astype(np.int64), rows, state_bytes)
    finally:
        with master.state.lock:
            addresses = [*master.state.ps_addresses.values()]
            switch = master.state.switch
            if switch is not None:
                addresses += switch.addresses.values()
        for address in addresses:
            shutdown((str(address[0]), int(address[1])), bench.secret)
        if run.coordinator is not None:
            run.coordinator.close()
        for pod in run.pods:
            stop(pod)
        master.close()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(checkpoints, ignore_errors=True)


# ----------------------------------------------------------------------------- printing


def print_move(move: Move) -> None:
    mib = 2**20
    line = (
        f"  {move.method:<8} pause {move.pause_s:7.3f}s: registered {move.registered_s:.3f}s, "
        f"moving {move.moving_s:.3f}s, new PS ready->serving {move.buffer_s:.3f}s; "
        f"from {move.source}, {'EXACT' if move.exact else 'ROWS DIFFER'}"
    )
    if move.method == "network":
        line += (
            f"\n           copied {move.rows:,} rows ({move.copy_bytes / mib:,.0f} MiB) in "
            f"{move.copy_s:.2f}s ({move.copy_bytes / mib / move.copy_s:,.0f} MiB/s) under "
            f"{move.pushes_during_copy:,} pushes ({move.pushed_rows_during_copy:,} rows); "
            f"{move.resent_rows:,} rows ({move.resent_bytes / mib:,.1f} MiB) sent again"
        )
    print(line, flush=True)


def print_summary(rounds: list[dict[str, Move]]) -> None:
    print(f"\nmedian of {len(rounds)} round(s) (min-max), seconds:")
    print("  method   pause                  registered  moving  ready->serving  from     exact")
    for method in [m for m in METHODS if m in rounds[0]]:
        moves = [r[method] for r in rounds]
        med, lo, hi = median_and_range([m.pause_s for m in moves])
        reg = statistics.median(m.registered_s for m in moves)
        moving = statistics.median(m.moving_s for m in moves)
        buffer = statistics.median(m.buffer_s for m in moves)
        sources = ",".join(sorted({m.source for m in moves}))
        exact = all(m.exact for m in moves)
        print(
            f"  {method:<8} {med:6.3f} ({lo:.3f}-{hi:.3f})  {reg:10.3f}  {moving:6.3f}  "
            f"{buffer:14.3f}  {sources:<8} {'yes' if exact else 'NO'}"
        )
    net = [r["network"] for r in rounds]
    copy_s = statistics.median(m.copy_s for m in net)
    rate = statistics.median(m.copy_bytes / 2**20 / m.copy_s for m in net)
    resent = statistics.median(m.resent_rows for m in net)
    resent_mib = statistics.median(m.resent_bytes for m in net) / 2**20
    pushes = statistics.median(m.pushes_during_copy for m in net)
    print(
        f"  network: {net[0].rows:,} rows ({net[0].copy_bytes / 2**20:,.0f} MiB) copied in "
        f"{copy_s:.2f}s ({rate:,.0f} MiB/s) under {pushes:,.0f} pushes; {resent:,.0f} rows "
        f"({resent_mib:,.1f} MiB) sent again in the pause"
    )
    print("\npause ratios (per round, median):")
    for key, values in ratios(rounds).items():
        med = statistics.median(values)
        print(f"  {key:<16} {med:6.2f}x  ({', '.join(f'{v:.2f}' for v in values)})")


# ----------------------------------------------------------------------------- main


def mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="embedding state (weights+accum)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--methods", default=",".join(METHODS), help=f"a comma-separated subset of {METHODS}"
    )
    parser.add_argument("--push-rows", type=int, default=4096, help="rows per push")
    parser.add_argument("--push-rate", type=float, default=100.0, help="pushes a second")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of pushes first")
    parser.add_argument(
        "--pod-cpu", type=float, help="DLROVER_KFP_POD_CPU of the PS (default unset: 1)"
    )
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="checkpoints and logs here")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The methods to run; a bad value is a usage error (exit 2)."""
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or not methods:
        parser.error(f"--methods: unknown {unknown or 'none given'}; choose from {list(METHODS)}")
    if "network" not in methods:
        parser.error("--methods: the ratios are against network; include it")
    for name, value, least in (
        ("gib", args.gib, 0.0),
        ("push-rate", args.push_rate, 0.0),
        ("rounds", args.rounds, 0),
        ("push-rows", args.push_rows, 0),
    ):
        if not value > least:
            parser.error(f"--{name}: must be > {least:g}, got {value}")
    if args.warmup < 0:
        parser.error(f"--warmup: must be >= 0, got {args.warmup}")
    if state_rows(args.gib) < SAMPLE_ROWS:
        parser.error(f"--gib {args.gib}: fewer than {SAMPLE_ROWS} rows; at least 0.001")
    available = mem_available()
    need = MEMORY_STATES * args.gib * 2**30
    if available is not None and need > available:
        parser.error(
            f"--gib {args.gib}: a run holds about {need / 2**30:.1f} GiB at once, "
            f"{available / 2**30:.1f} GiB available"
        )
    return methods


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    methods = check_args(parser, args)
    rows = state_rows(args.gib)
    model = ModelSpec(table_sizes=(rows,), embedding_dim=DIM)
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, python "
        f"{platform.python_version()}, load {os.getloadavg()[0]:.2f}"
    )
    print(
        f"PS state: {rows:,} rows x {DIM} float32 x 2 (weights + Adagrad accumulator) = "
        f"{rows * ROW_STATE_BYTES / 2**30:.3f} GiB, + the dense part; pushes: "
        f"{args.push_rows:,} random rows at {args.push_rate:g}/s; methods {', '.join(methods)}"
    )
    work = Path(tempfile.mkdtemp(prefix="ps-move-pause-", dir=args.dir))
    shm_root = Path(tempfile.mkdtemp(prefix="ps-move-pause-", dir=memory_dir()))
    bench = Bench(args, model, new_secret(), work, shm_root)
    rounds: list[dict[str, Move]] = []
    try:
        for r in range(args.rounds):
            order = methods[r % len(methods) :] + methods[: r % len(methods)]
            print(f"\nround {r} (order {', '.join(order)}):", flush=True)
            moves = {}
            for method in order:
                moves[method] = run_method(bench, method, r)
                print_move(moves[method])
            rounds.append(moves)
        print_summary(rounds)
        return 0 if all(m.exact for r in rounds for m in r.values()) else 1
    finally:
        shutil.rmtree(shm_root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
