"""The entry point of a job's PS and worker processes.

    python -m dlrover_kfp.training.node ps 0 --master 10.0.0.5:41000
    python -m dlrover_kfp.training.node worker 3 --master 10.0.0.5:41000

The role and index are the first two arguments so that ``ps``/``top`` show which process is
which. The job secret comes from ``DLROVER_KFP_JOB_SECRET`` (never the command line, which every
user of the machine can read); everything else (the job spec, the PS addresses, the run
settings) comes from the master, so a pod needs nothing but its role, index and master address.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import queue
import secrets
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil  # type: ignore[import-untyped, unused-ignore]

from dlrover_kfp.core.documents import parse
from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.errors import DlroverKfpError
from dlrover_kfp.training import supervisor
from dlrover_kfp.training.cpu_limit import PodCpu, env_cpu
from dlrover_kfp.training.master_protocol import (
    CONFIG,
    GET_SHARD,
    LOADING,
    READY,
    REGISTER,
    REPORT,
    SWITCH,
    USAGE,
    USAGE_INTERVAL_S,
)
from dlrover_kfp.training.wire import (
    Connection,
    Server,
    WireTimeoutError,
    connect,
    secret_from_env,
)

# torch and what is built on it load only once the usage reports run (see main()): importing
# them takes ~2 s of CPU, 8 s and more in a quarter-core pod, and a pod silent for that long
# could not be told from a frozen one.
if TYPE_CHECKING:
    from dlrover_kfp.training.checkpoint import PsCheckpointer
    from dlrover_kfp.training.data import Batch
    from dlrover_kfp.training.ps_client import RemotePs
    from dlrover_kfp.training.ps_state import PsState
    from dlrover_kfp.training.step import Routed, WorkerModel

log = logging.getLogger("dlrover_kfp.node")

#: How long a starting process keeps trying to reach the master or a PS (they start in any order).
CONNECT_RETRY_S = 120.0
#: How long it keeps trying one that refuses the connection. The master launches pods only once
#: it listens, and gives out a PS's address only once it serves, so a refusal means the peer has
#: gone (a master killed while this pod started); the pod then exits as its master's pods do,
#: instead of waiting out CONNECT_RETRY_S.
CONNECT_REFUSED_S = 10.0
#: Environment variable that overrides the torch intra-op thread count (see torch_threads).
THREADS_ENV = "DLROVER_KFP_TORCH_THREADS"


def _reach(address: tuple[str, int], secret: bytes) -> Connection:
    """A connection to the master or a PS, retried as CONNECT_RETRY_S and CONNECT_REFUSED_S say."""
    return connect(address, secret, retry_for=CONNECT_RETRY_S, refused_for=CONNECT_REFUSED_S)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def torch_threads(role: str, env: Mapping[str, str], cpu: float | None = None) -> int:
    """torch intra-op threads for a process of ``role`` in a pod with ``env`` and ``cpu``
    cores now (:class:`~dlrover_kfp.training.cpu_limit.PodCpu`; the pod's
    ``DLROVER_KFP_POD_CPU`` when not given).

    A worker runs ``floor(cpu)`` threads, at least one: a fractional pod (0.25, 0.5) runs one
    thread throttled by its quota, and the part of a core above a whole number goes to the
    prefetch thread (reading and routing the next shard) and to the kernel's socket copies,
    not to a second intra-op thread. Measured on the small model (benchmarks/ps_throughput.py,
    1 worker + 1 PS): at a 1.5-core quota, 2 threads trained 49.9k samples/s at 26 µs of CPU a
    sample, while 1 thread at a 1-core quota trained 65-68k at 19 µs; the MLPs are too small
    to split, and idle OpenMP threads still cost quota. A PS runs one: its parallelism is one
    thread per worker connection (:mod:`.ps_server`), and a second level of threads inside each
    small kernel would only fight those for the same cores. ``DLROVER_KFP_TORCH_THREADS``
    overrides both (benchmarks compare thread counts with it).
    """
    if env.get(THREADS_ENV):
        return max(1, int(env[THREADS_ENV]))
    if role == "ps":
        return 1
    cores = env_cpu(env) if cpu is None else cpu
    return max(1, math.floor(cores + 1e-9))


def _set_threads(role: str, cpu: float) -> None:
    import torch  # noqa: PLC0415

    torch.set_num_threads(torch_threads(role, os.environ, cpu))
    torch.set_num_interop_threads(1)


def follow_cpu(name: str, cpu: PodCpu) -> None:
    """Between two batches: when the pod's CPU changed in place (its quota; looked at every
    :data:`~dlrover_kfp.training.cpu_limit.POLL_S` at most), the torch threads follow it by
    :func:`torch_threads`'s rule. The process goes on: no restart, no shard read again."""
    cores = cpu.changed()
    if cores is None:
        return
    import torch  # noqa: PLC0415

    threads = torch_threads("worker", os.environ, cores)
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    log.info("%s: CPU now %g cores: %d torch threads", name, cores, torch.get_num_threads())


def fetch_config(
    master: Connection,
    role: str,
    index: int,
    generation: int = 0,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The job configuration from the master, waiting until it can give one.

    A PS started for a live change of the PS set passes its ``generation``: it waits here,
    started and ready, until the master releases it (runtime/master.py); a PS restarted in its
    pod says so in ``extra`` and waits until the master has rolled the job back.
    """
    meta = {"role": role, "index": index, "generation": generation, **(extra or {})}
    while True:
        reply = master.request(CONFIG, meta)
        if not reply.meta.get("wait"):
            return dict(reply.meta)
        time.sleep(0.05)


def job_spec(config: dict[str, Any]) -> JobSpec:
    return parse(JobSpec, config["spec"], "job spec from the master")


def advertise_host(master_host: str) -> str:
    """The address peers should use to reach this process: the interface that reaches the master."""
    if master_host in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master_host, 9))  # no packet is sent for UDP connect
        return str(probe.getsockname()[0])


# --- worker ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Work:
    shard: dict[str, Any]
    batch: Batch
    #: the shard's mini-batches, routed by the prefetch thread (torch.unique releases the GIL,
    #: so this runs beside the training thread on a pod with more than one core)
    steps: list[Routed]
    #: the number of PS they were routed for (a live change of the PS set may change it)
    num_ps: int


@dataclass(frozen=True, slots=True)
class _Switch:
    """The master asks for a change of the PS set to ``generation`` (put in the work queue so
    that a training thread waiting for a shard wakes up)."""

    generation: int


class _SwitchNotice:
    """The newest PS generation the master announced; set by either thread (an int is
    written whole), read by the training thread between shards."""

    def __init__(self) -> None:
        self.generation = 0

    def announce(self, generation: int) -> bool:
        """Record ``generation``; True if it is new."""
        if generation > self.generation:
            self.generation = generation
            return True
        return False


def _log_bytes_read(name: str, dataset: object, rows: int) -> None:
    """One line with the data bytes this worker read (file datasets count them): a worker
    should read its shards' bytes and little more (docs/data.md)."""
    counter = getattr(dataset, "counter", None)
    if counter is not None:
        log.info(
            "%s: data read: %d bytes in %d reads for %d rows",
            name,
            counter.bytes,
            counter.reads,
            rows,
        )


def _route_shard(
    model: WorkerModel, batch: Batch, batch_size: int, shard: dict[str, Any]
) -> list[Routed]:
    """The shard's mini-batches from its ``skip`` (the rows PS 0 holds already: a shard in
    flight at the checkpoint a rollback restored), each tagged with the shard and where its
    rows lie (PS 0 counts what it applied, core/applied.py)."""
    from dlrover_kfp.training.step import PushTag  # noqa: PLC0415 (torch: lazily)

    skip = _skip(shard, len(batch))
    steps = []
    for start in range(skip, len(batch), batch_size):
        end = min(start + batch_size, len(batch))
        tag = PushTag(
            int(shard["epoch"]), int(shard["id"]), start, end - start, len(batch), end == len(batch)
        )
        steps.append(model.route(batch.slice(start, end), tag))
    return steps


def _skip(shard: dict[str, Any], rows: int) -> int:
    """The rows of a leased shard to leave out: its ``skip``, unless that leaves nothing (a
    shard must train a batch to be reported; then it trains whole)."""
    skip = int(shard.get("skip", 0))
    return skip if 0 <= skip < rows else 0


_Item = _Work | _Switch | BaseException | None


def _prefetch(
    name: str,
    incarnation: str,
    master: Connection,
    config: dict[str, Any],
    model: WorkerModel,
    out: queue.Queue[_Item],
    notice: _SwitchNotice,
) -> None:
    """Lease shards, read their rows and route their mini-batches one shard ahead of training
    (on its own connection to the master)."""
    from dlrover_kfp.training.data import RowRange  # noqa: PLC0415
    from dlrover_kfp.training.datasets import check_fingerprint, open_dataset  # noqa: PLC0415

    try:
        spec = job_spec(config)
        batch_size = spec.training.batch_size
        dataset = open_dataset(spec.data, spec.model, config["base_dir"], eager=False)
        check_fingerprint(dataset, config.get("data_files"))
        rows_read = 0
        while True:
            reply = master.request(GET_SHARD, {"worker": name, "incarnation": incarnation})
            shard = reply.meta["shard"]
            if SWITCH in reply.meta and notice.announce(int(reply.meta[SWITCH])):
                out.put(_Switch(int(reply.meta[SWITCH])))
            if shard is None:
                if reply.meta["finished"]:
                    _log_bytes_read(name, dataset, rows_read)
                    out.put(None)
                    return
                time.sleep(0.02)  # every shard is leased (or the PS change); wait
                continue
            rows = RowRange(int(shard["source"]), int(shard["start"]), int(shard["end"]))
            batch = dataset.read(rows, span=shard.get("span"))
            rows_read += rows.rows
            num_ps = model.servers.num_ps
            out.put(_Work(shard, batch, _route_shard(model, batch, batch_size, shard), num_ps))
    except BaseException as exc:  # handed to the training thread, which exits non-zero
        out.put(exc)


@dataclass(slots=True)
class _ShardProgress:
    """A leased shard while its batches train: reported once its last push was applied."""

    work: _Work
    batches: int
    trained: int = 0
    loss_sum: float = 0.0
    pushes: int = 0  # RemotePs.pushes_sent after its last batch


def _batches(
    work: queue.Queue[_Item],
    on_idle: Callable[[], None],
    notice: _SwitchNotice,
    on_switch: Callable[[int], None],
    reroute: Callable[[_Work], _Work],
    generation: int,
) -> Iterator[tuple[Routed, tuple[_ShardProgress, int]] | None]:
    """Every mini-batch of every leased shard, in order, tagged with its shard and size.

    Between two shards, when the next one has not arrived yet, yields ``None`` (the pipeline
    then completes the step in flight) and calls ``on_idle`` (the worker waits for its pushes
    and reports its shards) before it blocks: the master may be holding the next shard back
    until this worker's last one is reported (the end of an epoch).

    Between two shards, when the master announced a new PS generation, does the same and then
    ``on_switch`` (the worker moves to the new PS); a shard routed for another number of PS
    is routed again (``reroute``). ``generation`` is the one the worker starts with."""
    switched = generation
    while True:
        if notice.generation > switched:
            switched = notice.generation
            yield None
            on_idle()
            on_switch(switched)
        try:
            item = work.get_nowait()
        except queue.Empty:
            yield None
            on_idle()
            item = work.get()
        if item is None:
            return
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, _Switch):
            continue  # the loop's top handles it (the notice was set first)
        item = reroute(item)
        progress = _ShardProgress(item, len(item.steps))
        for routed in item.steps:
            yield routed, (progress, len(routed.batch))


def _connect_ps(config: dict[str, Any], secret: bytes, synchronous: bool) -> RemotePs:
    """Connections to the PS the master's configuration names, in PS-index order."""
    from dlrover_kfp.training.ps_client import RemotePs  # noqa: PLC0415

    return RemotePs(
        [_reach((str(h), int(p)), secret) for h, p in config["ps"]],
        synchronous=synchronous,
    )


def run_worker(
    index: int, master_address: tuple[str, int], secret: bytes, cpu: PodCpu | None = None
) -> None:
    import torch  # noqa: PLC0415

    from dlrover_kfp.training.step import WorkerModel  # noqa: PLC0415

    name = NodeId.worker(index).key  # what it reports under to the master
    cpu = cpu if cpu is not None else PodCpu(os.environ)
    # This process's own lease holder id (see runtime/master.py): a relaunch gets a new one.
    incarnation = f"{os.getpid()}-{secrets.token_hex(4)}"
    master = _reach(master_address, secret)
    config = fetch_config(master, "worker", index)
    spec = job_spec(config)
    synchronous = bool(config["synchronous"])
    servers = _connect_ps(config, secret, synchronous)
    model = WorkerModel(spec.model, servers, seed=int(config["seed"]))
    lease_conn = _reach(master_address, secret)
    work: queue.Queue[_Item] = queue.Queue(maxsize=1)
    notice = _SwitchNotice()
    generation = int(config.get("generation", 0))
    notice.announce(generation)
    threading.Thread(
        target=_prefetch,
        args=(name, incarnation, lease_conn, config, model, work, notice),
        daemon=True,
        name="prefetch",
    ).start()
    log.info(
        "%s: training against %d PS (%s, %d torch threads)",
        name,
        servers.num_ps,
        "synchronous" if synchronous else "pipelined",
        torch.get_num_threads(),
    )

    def report(shard: _ShardProgress) -> None:
        reply = master.request(
            REPORT,
            {
                "worker": name,
                "incarnation": incarnation,
                "shard": shard.work.shard["id"],
                "epoch": shard.work.shard["epoch"],
                "samples": len(shard.work.batch) - _skip(shard.work.shard, len(shard.work.batch)),
                "steps": shard.batches,
                "loss_sum": shard.loss_sum,
                "bad_rows": shard.work.batch.bad_rows,
            },
        )
        if SWITCH in reply.meta:
            notice.announce(int(reply.meta[SWITCH]))

    unreported: deque[_ShardProgress] = deque()

    def report_all() -> None:
        servers.flush()
        while unreported:
            report(unreported.popleft())

    def switch(generation: int) -> None:
        """Every push applied and every shard reported (``report_all`` just ran): tell the
        master, wait for the new PS set, and train against it from the next step."""
        nonlocal servers
        paused = time.monotonic()
        master.request(READY, {"worker": name, "generation": generation})
        new_config = fetch_config(master, "worker", index)
        servers.close()
        servers = _connect_ps(new_config, secret, synchronous)
        model.servers = servers
        log.info(
            "%s: PS generation %d (%d PS), paused %.2fs",
            name,
            int(new_config.get("generation", 0)),
            servers.num_ps,
            time.monotonic() - paused,
        )

    def reroute(item: _Work) -> _Work:
        if item.num_ps == servers.num_ps:
            return item
        steps = _route_shard(model, item.batch, spec.training.batch_size, item.shard)
        return _Work(item.shard, item.batch, steps, servers.num_ps)

    batches = _batches(work, report_all, notice, switch, reroute, generation)
    # Synchronous: each lookup after the previous push was applied (bit-exact order).
    steps: Iterator[tuple[tuple[_ShardProgress, int], float]] = (
        ((item[1], model.train_step(item[0])) for item in batches if item is not None)
        if synchronous
        else model.train_pipelined(batches)
    )
    for (shard, size), loss in steps:
        follow_cpu(name, cpu)
        shard.loss_sum += loss * size
        shard.trained += 1
        if shard.trained == shard.batches:
            shard.pushes = servers.pushes_sent
            unreported.append(shard)
        # A shard is reported done only once all its updates are applied on every PS.
        while unreported and servers.applied(unreported[0].pushes):
            report(unreported.popleft())
    report_all()
    servers.close()
    master.close()
    lease_conn.close()
    log.info("%s: no shards left, exiting", name)


# --- entry point -----------------------------------------------------------------------------


def _copied_state(
    master: Connection, index: int, generation: int, secret: bytes
) -> tuple[dict[str, Any], PsState | None, dict[str, float] | None, PsCheckpointer | None]:
    """The configuration of a PS started for a change of the PS set (generation > 0) and, when
    the master moves the state over the network, the state copied from the old PS with what
    the move carried (for REGISTER's ``moved``) and its flash-checkpoint buffer.

    The master (runtime/master.py) answers ``{"wait": true, "copy": {config, "from",
    "from_num_ps"}}`` while training goes on: the PS copies its rows then (ps_transfer's first
    pass) and asks again with ``"copied": true``; it waits until the workers are paused and
    gets the full configuration with ``"migrate"``: it fetches the rows updated since (the
    second pass) and serves. A final configuration without ``"migrate"`` is the stop-first
    path: the copy (if any) is dropped and the state restored from the checkpoint, as at any
    start. A source that does not answer ends this process with a TransferError (exit 2): the
    master abandons the change.

    The buffer (pre-touched shared memory the size of the state: ~0.5-1 s a GiB) is built on
    standby, after the copy and before the release, so that the workers' pause does not wait
    for it. The release is polled every 50 ms: the master answers every request from one
    thread (its wire server), so an answer held until the release would hold every worker's
    request behind it; a poll costs the pause 25 ms on average."""
    from dlrover_kfp.training import ps_server, ps_transfer  # noqa: PLC0415

    meta: dict[str, Any] = {"role": "ps", "index": index, "generation": generation}
    copied: tuple[PsState, ps_transfer.TransferStats] | None = None
    checkpointer: PsCheckpointer | None = None
    while True:
        reply = dict(master.request(CONFIG, meta).meta)
        if not reply.get("wait"):
            break
        plan = reply.get("copy")
        if isinstance(plan, dict) and copied is None:
            sources, from_num_ps = _sources(plan)
            config = ps_server.ps_config(index, plan)
            copied = ps_transfer.copy_rows(config, sources, from_num_ps, secret, generation)
            meta["copied"] = True
            # On standby from here: the buffer is built before the master hears it (the
            # next request), while training goes on.
            checkpointer = ps_server.new_checkpointer(index, plan, copied[0])
            continue
        time.sleep(0.05)
    migrate = reply.get("migrate")
    if not isinstance(migrate, dict):
        _unlink(checkpointer)  # the stop-first path: the state is restored, its buffer built then
        return reply, None, None, None
    sources, from_num_ps = _sources(migrate)
    if copied is None:  # released before it was asked to copy: all of it now
        copied = ps_transfer.copy_rows(
            ps_server.ps_config(index, reply), sources, from_num_ps, secret, generation
        )
    state, first = copied
    if state.config != ps_server.ps_config(index, reply):
        _unlink(checkpointer)
        raise ps_transfer.TransferError(
            f"PS {index}: the copy was made for {state.config}, the master now configures "
            f"{ps_server.ps_config(index, reply)}"
        )
    second = ps_transfer.finish_copy(state, sources, from_num_ps, secret, generation)
    log.info(
        "PS %d: moved %d rows, %.1f MiB from %d old PS: copied in %.2fs while training, "
        "%d rows updated meanwhile sent again in %.3fs",
        index,
        first.rows,
        (first.bytes + second.bytes) / 2**20,
        from_num_ps,
        first.seconds,
        second.rows,
        second.seconds,
    )
    moved = {
        "rows": float(first.rows),
        "bytes": float(first.bytes + second.bytes),
        "copy_s": first.seconds,
        "finish_s": second.seconds,
        "resent_rows": float(second.rows),
        "resent_bytes": float(second.bytes),
    }
    return reply, state, moved, checkpointer


def _unlink(checkpointer: PsCheckpointer | None) -> None:
    """Remove a buffer built for a copy that is not served: the pod's memory holds one."""
    if checkpointer is not None:
        checkpointer.flash.unlink()


def _sources(meta: dict[str, Any]) -> tuple[list[tuple[str, int]], int]:
    """The old PS's addresses (by index) and their count, as the master names them."""
    return [(str(h), int(p)) for h, p in meta["from"]], int(meta["from_num_ps"])


def _restored_state(
    master: Connection, index: int, generation: int, restarted: int, cause: str
) -> tuple[dict[str, Any], PsState | None, str]:
    """The configuration of a PS restarted inside its pod (:mod:`.supervisor`), the state it
    restores, and from where (for REGISTER's ``restored``: ``memory``, ``volume``, ``start``).

    It tells the master it is a restart (``restart``: how many times, ``cause``: why the last
    process ended) and waits: the master rolls the job back to its last committed checkpoint
    and then names it (``restore_choice``). This PS restores its own part of that step from
    the snapshot its previous process left in the pod's shared memory when that is exactly the
    committed part, else from the volume (:func:`~.checkpoint.restore_own_part`). Without a
    committed checkpoint the job starts over: the state is built as at any start."""
    from dlrover_kfp.training import checkpoint as ckpt  # noqa: PLC0415
    from dlrover_kfp.training import ps_server  # noqa: PLC0415

    extra = {"restart": restarted, "cause": cause[:64]}
    config = fetch_config(master, "ps", index, generation, extra)
    choice = config.get("restore_choice")
    if not (config.get("restore") and config.get("checkpoint_dir") and isinstance(choice, dict)):
        return config, None, "start"
    state, from_memory = ckpt.restore_own_part(
        config["checkpoint_dir"],
        ps_server.ps_config(index, config),
        str(config["job_id"]),
        ckpt.CheckpointChoice.from_dict(choice),
    )
    return config, state, "memory" if from_memory else "volume"


def run_ps(
    index: int,
    master_address: tuple[str, int],
    secret: bytes,
    generation: int = 0,
    *,
    restarted: int = 0,
    cause: str = "",
) -> bool:
    """Serve as PS ``index`` until stopped; True when the master asked it to restart in its
    pod. ``restarted``: how often its pod's supervisor started it again (and ``cause``: why)."""
    from dlrover_kfp.training import ps_server  # noqa: PLC0415

    master = _reach(master_address, secret)
    state: PsState | None = None
    checkpointer: PsCheckpointer | None = None
    moved: dict[str, float] | None = None
    restored: str | None = None
    if restarted:
        config, state, restored = _restored_state(master, index, generation, restarted, cause)
    elif generation > 0:
        config, state, moved, checkpointer = _copied_state(master, index, generation, secret)
    else:
        config = fetch_config(master, "ps", index, generation)
    host = advertise_host(master_address[0])

    def register(port: int) -> None:
        meta: dict[str, Any] = {"index": index, "generation": generation, "address": [host, port]}
        if moved is not None:
            meta["moved"] = moved
        if restored is not None:
            meta["restored"] = restored
        master.request(REGISTER, meta)

    def stop_with_the_master(server: Server) -> None:
        """A PS lives as long as its master: when the master's connection closes (it exited
        or was killed), the PS stops, as a pod owned by a deleted master would be deleted.
        A master started again relaunches the job's PS from its checkpoint."""

        def watch() -> None:
            while True:
                try:
                    master.recv()
                except WireTimeoutError:
                    continue  # an idle master: it never sends unasked
                except Exception:  # closed or broken: the master is gone
                    break
            log.warning("PS %d: the master's connection closed; stopping", index)
            server.stop()

        threading.Thread(target=watch, name="master-watch", daemon=True).start()

    restart = ps_server.serve(
        index,
        config,
        secret,
        register,
        bind_host=host,
        on_serving=stop_with_the_master,
        state=state,
        checkpointer=checkpointer,
    )
    master.close()
    return restart


def own_usage() -> tuple[float, float, float]:
    """(CPU seconds, the pod's clock when they were read, resident MiB) of this process and its
    children: what the pod's cgroup would account for, measured from inside it.

    The process's own CPU time and the clock are read back to back (two clock_gettime calls,
    nanoseconds), before the slow part: scanning /proc for children and reading memory. The
    master divides CPU by the clock's interval; read in the other order, a reading held up
    between the two (the scan, the GIL, a throttled quota period) made the interval
    disagree with the CPU time's (0.66 core was read for a pod held to 0.5)."""
    cpu = time.process_time()  # every thread of this process
    at = time.monotonic()
    reaped = os.times()  # children already waited for
    seconds = cpu + reaped.children_user + reaped.children_system
    me = psutil.Process()
    rss = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            times = child.cpu_times()
            seconds += times.user + times.system
            rss += child.memory_info().rss
        except psutil.Error:  # ended in between
            continue
    return seconds, at, rss / (1 << 20)


def usage_report(role: str, index: int, generation: int) -> dict[str, Any]:
    """A ``usage`` request's meta: who reports, and :func:`own_usage` read now (the pod's own
    clock at the reading, ``at``, is what the master divides CPU by)."""
    cpu_seconds, at, rss_mb = own_usage()
    return {
        "role": role,
        "index": index,
        "generation": generation,
        "at": at,
        "cpu_seconds": cpu_seconds,
        "rss_mb": rss_mb,
    }


def report_usage(
    master_address: tuple[str, int],
    secret: bytes,
    role: str,
    index: int,
    generation: int,
    interval_s: float = USAGE_INTERVAL_S,
) -> None:
    """Report this pod's usage to the master every ``interval_s``, on a connection of its own,
    until the master goes away. A backend whose cluster has no metrics API (no metrics-server)
    samples pods from these reports; where the backend measures pods itself they are unused."""
    try:
        conn = _reach(master_address, secret)
    except Exception:  # no master to report to: the main thread will say so
        return
    try:
        while True:
            # The rate's interval is the pod's clock, not the reports' arrivals.
            conn.request(USAGE, usage_report(role, index, generation))
            time.sleep(interval_s)
    except Exception:  # the master closed or restarted: the pod's main thread handles that
        return
    finally:
        conn.close()


#: How long :func:`announce` tries to reach the master: it must not hold the pod's start long.
ANNOUNCE_RETRY_S = 5.0


def announce(argv: Sequence[str]) -> None:
    """The pod's first word to the master, before its code loads: one ``usage`` report that
    says it is loading (:data:`~dlrover_kfp.training.master_protocol.LOADING`).

    The PS pod's supervisor calls it (training/supervisor.py ``--fork``) before it imports the
    PS's code: torch takes ~1.4 s of CPU here, 6 s in a quarter-core pod, several times that
    on a busy node, and the pod says nothing else meanwhile (its usage reports start in the
    forked PS). With this word the master knows the pod runs and is loading, and judges it
    against a loading budget instead of calling it frozen (runtime/ps_change.py). Synchronous,
    on a connection of its own that it closes: the supervisor forks later and must hold no
    thread. Never fails the pod: a master it cannot reach is the PS's own business to report."""
    try:
        args = build_parser().parse_args(list(argv))
        conn = connect(
            args.master,
            secret_from_env(),
            retry_for=ANNOUNCE_RETRY_S,
            refused_for=ANNOUNCE_RETRY_S,
        )
    except (Exception, SystemExit):  # bad arguments or no master: the PS will say so
        return
    try:
        report = usage_report(args.role, args.index, args.generation)
        conn.request(USAGE, {**report, LOADING: True})
    except Exception:  # the master went away: the PS's own start will find out
        return
    finally:
        conn.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dlrover_kfp.training.node",
        description="A PS or worker process of a dlrover-kfp training job.",
    )
    parser.add_argument("role", choices=("ps", "worker"))
    parser.add_argument("index", type=int)
    parser.add_argument("--master", type=_address, required=True, metavar="HOST:PORT")
    parser.add_argument(
        "--generation",
        type=int,
        default=0,
        help="a PS started for a live change of the PS set: the generation it belongs to",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s %(levelname)s {args.role}-{args.index}: %(message)s",
        stream=sys.stderr,
    )
    try:
        secret = secret_from_env()
        # First, before torch loads: the master judges a pod silent for a few report
        # intervals frozen, and a starting pod must not look like one.
        threading.Thread(
            target=report_usage,
            args=(args.master, secret, args.role, args.index, args.generation),
            name="usage",
            daemon=True,
        ).start()
        cpu = PodCpu(os.environ)
        _set_threads(args.role, cpu.cores)
        if args.role == "ps":
            restart = run_ps(
                args.index,
                args.master,
                secret,
                args.generation,
                restarted=supervisor.restarts(os.environ),
                cause=os.environ.get(supervisor.CAUSE_ENV, ""),
            )
            if restart:
                return supervisor.RESTART_EXIT
        else:
            run_worker(args.index, args.master, secret, cpu)
    except DlroverKfpError as exc:
        log.error("%s", exc)
        return 2 if not exc.retryable else 75
    return 0


if __name__ == "__main__":
    code = main()
    # Leave at once, without the interpreter's teardown: main() has closed what it opened
    # (connections, the PS's snapshot) and the log goes to stderr, flushed here.
    # - A failed process: its daemon threads (the prefetcher) may be inside torch, and the
    #   teardown under them aborts it ("terminate called without an active exception":
    #   SIGABRT, exit 134 instead of this code; seen in the chaos soak when a worker's PS
    #   was killed).
    # - A finished one: the teardown of a process that loaded torch took 1.1 s at half a
    #   core (from its last atexit hook to the backend seeing it exit), for the worker and
    #   then again for the PS, on the way to the run's end.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
