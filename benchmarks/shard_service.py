"""Shard service: this project's job master against DLRover 0.6.1's master, in pairs/s.

One *pair* is what a worker does per data shard: lease a shard, then report it done. Both
masters are measured in the same run, one after the other (never at the same time), with the
same load: ``--clients`` client processes (default 4) over loopback, each looping lease +
report as fast as the master answers. Every client first connects and does one pair, then all
start together; pairs finished in the first ``--warmup`` seconds (default 2) are not counted,
then pairs are counted for ``--seconds`` (default 20). The figure is the clients' total pairs
over that window, per second.

* **Ours**: :class:`dlrover_kfp.runtime.master.MasterService` over a
  :class:`~dlrover_kfp.runtime.master.MasterState` and a
  :class:`~dlrover_kfp.core.shards.ShardLedger`, served by the authenticated
  :class:`dlrover_kfp.training.wire.Server` in this process (``--server loop``, the default:
  the single-threaded selector loop the job master runs on; ``--server threaded``: one thread
  per connection, as the PS serves). Clients connect with
  :func:`~dlrover_kfp.training.wire.connect` and the job secret from the environment, and send
  ``get_shard`` then ``report`` exactly as a worker does (``dlrover_kfp/training/node.py``).
* **DLRover 0.6.1**: its master, ``python -m dlrover.python.master.main --platform local``
  (gRPC service), started as a subprocess. Clients use its public client API,
  ``dlrover.python.elastic_agent.sharding.client.ShardingClient``: the constructor registers
  the dataset (``report_dataset_shard_params``), then each pair is ``fetch_shard()`` (one
  ``get`` RPC) and ``report_batch_done()`` (one ``report`` RPC: a shard is one batch here).

Both masters hold the same data: 10,000 shards of 1 row per epoch and 1,000,000 epochs, so
the clients never run out of shards during the window, and no per-epoch list is large enough
to slow either master down. Our ledger starts epoch ``e + 1`` only once every shard of epoch
``e`` is reported; a lease asked for in between finds nothing free (one of the last shards is
still with another client), and our client then retries after 1 ms, as a worker does after
20 ms. Such empty leases are printed; they are a few dozen per window. DLRover queues the next
epoch's shards as soon as the current epoch's are all leased, so its clients never wait.

DLRover runs in its own virtual environment, outside this repository::

    python3.11 -m venv /tmp/dlrover-venv
    /tmp/dlrover-venv/bin/pip install "dlrover[k8s]==0.6.1" protobuf

Without that interpreter (``--dlrover-python``, default ``/tmp/dlrover-venv/bin/python``) only
our half runs. Target: ours at least 5x DLRover's pairs/s.

    python benchmarks/shard_service.py [--clients 4] [--seconds 20] [--dlrover-python PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_kfp.core.shards import ShardLedger
from dlrover_kfp.runtime.master import MasterService, MasterState
from dlrover_kfp.training.master_protocol import GET_SHARD, REPORT
from dlrover_kfp.training.wire import (
    SECRET_ENV_VAR,
    Server,
    connect,
    new_secret,
    secret_from_env,
    secret_to_env,
)

SHARDS_PER_EPOCH = 10_000  # of 1 row each
EPOCHS = 1_000_000
TARGET = 5.0
DEFAULT_DLROVER_PYTHON = "/tmp/dlrover-venv/bin/python"
DLROVER_DATASET = "bench"
MASTER_START_TIMEOUT_S = 120.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PREFIX = "BENCH "  # client lines the driver reads; anything else on stdout is ignored

# The DLRover client, run by the DLRover venv's interpreter. It speaks the same line protocol
# as our client (see `client_ours`): "BENCH ready", then reads "warm_at end_at" (monotonic
# clock, shared by all processes on Linux), then prints "BENCH pairs N empty E".
DLROVER_CLIENT = f"""
import sys, time
from dlrover.python.elastic_agent.sharding.client import ShardingClient

client = ShardingClient(
    dataset_name={DLROVER_DATASET!r},
    batch_size=1,
    num_epochs={EPOCHS},
    dataset_size={SHARDS_PER_EPOCH},
    shuffle=False,
    num_minibatches_per_shard=1,
)


def pair():
    shard = client.fetch_shard()
    if shard is None:
        raise SystemExit("DLRover master returned no shard")
    if not client.report_batch_done():  # True: the shard's task was reported to the master
        raise SystemExit("DLRover client did not report the shard done")


pair()
print({PREFIX!r} + "ready", flush=True)
warm_at, end_at = (float(x) for x in sys.stdin.readline().split())
n = 0
while True:
    pair()
    t = time.monotonic()
    if t >= end_at:
        break
    if t >= warm_at:
        n += 1
print({PREFIX!r} + "pairs " + str(n) + " empty 0", flush=True)
"""


# --------------------------------------------------------------------------------- clients


def client_ours(index: int, port: int) -> None:
    """One worker-like client of our master (run in a child process of this script)."""
    name = f"worker-{index}"
    incarnation = f"{os.getpid()}-{secrets.token_hex(4)}"
    conn = connect(("127.0.0.1", port), secret_from_env())
    lease = {"worker": name, "incarnation": incarnation}

    empty = 0

    def pair() -> None:
        nonlocal empty
        while True:
            answer = conn.request(GET_SHARD, lease).meta
            shard = answer["shard"]
            if shard is not None:
                break
            if answer["finished"]:
                raise SystemExit("our master ran out of shards")
            # Every shard of the epoch is leased: the next epoch starts once they are all
            # reported. A worker waits 20 ms here (node.py); 1 ms keeps the stall short.
            empty += 1
            time.sleep(0.001)
        reply = conn.request(
            REPORT,
            {
                **lease,
                "shard": shard["id"],
                "epoch": shard["epoch"],
                "samples": shard["end"] - shard["start"],
                "steps": 1,
                "loss_sum": 0.0,
                "bad_rows": 0,
            },
        )
        if not reply.meta["accepted"]:
            raise SystemExit(f"our master did not accept shard {shard['id']}")

    pair()
    print(PREFIX + "ready", flush=True)
    warm_at, end_at = (float(x) for x in sys.stdin.readline().split())
    n = 0
    while True:
        pair()
        t = time.monotonic()
        if t >= end_at:
            break
        if t >= warm_at:
            n += 1
    conn.close()
    print(f"{PREFIX}pairs {n} empty {empty}", flush=True)


# ---------------------------------------------------------------------------------- driver


def read_tagged(stream: IO[str], what: str) -> str:
    """The next line that starts with PREFIX, without it; EOF first raises."""
    for line in stream:
        if line.startswith(PREFIX):
            return line[len(PREFIX) :].strip()
    raise RuntimeError(f"{what}: the process ended without answering")


@dataclass(frozen=True)
class Result:
    pairs_per_s: float
    empty_leases: int
    server_cores: float  # CPU seconds per second over the counted window
    client_cores: float  # all clients together

    def __str__(self) -> str:
        return (
            f"{self.pairs_per_s:,.0f} pairs/s (CPU over the window: server "
            f"{self.server_cores:.2f} cores, clients {self.client_cores:.2f} cores)"
        )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def drive(
    commands: list[list[str]],
    envs: list[dict[str, str]],
    warmup: float,
    seconds: float,
    log: IO[str],
    server_pid: int,
) -> Result:
    """Start one client per command, run the window, and measure it."""
    procs = [
        subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env
        )
        for cmd, env in zip(commands, envs, strict=True)
    ]
    try:
        for k, proc in enumerate(procs):
            assert proc.stdout is not None
            ready = read_tagged(proc.stdout, f"client {k}")
            if ready != "ready":
                raise RuntimeError(f"client {k}: unexpected {ready!r}")
        warm_at = time.monotonic() + warmup
        end_at = warm_at + seconds
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{warm_at!r} {end_at!r}\n")
            proc.stdin.flush()
        time.sleep(max(warm_at - time.monotonic(), 0.0))
        server0 = cpu_seconds(server_pid)
        clients0 = sum(cpu_seconds(proc.pid) for proc in procs)
        time.sleep(max(end_at - time.monotonic(), 0.0))
        server_cores = (cpu_seconds(server_pid) - server0) / seconds
        client_cores = (sum(cpu_seconds(proc.pid) for proc in procs) - clients0) / seconds
        total = empty = 0
        for k, proc in enumerate(procs):
            assert proc.stdout is not None
            answer = read_tagged(proc.stdout, f"client {k}").split()
            if len(answer) != 4 or answer[0] != "pairs" or answer[2] != "empty":
                raise RuntimeError(f"client {k}: unexpected {' '.join(answer)!r}")
            total += int(answer[1])
            empty += int(answer[3])
            if proc.wait(timeout=60) != 0:
                raise RuntimeError(f"client {k} exited with {proc.returncode}")
        return Result(total / seconds, empty, server_cores, client_cores)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def bench_ours(clients: int, warmup: float, seconds: float, threaded: bool, log: IO[str]) -> Result:
    ledger = ShardLedger(tuple((0, i, i + 1) for i in range(SHARDS_PER_EPOCH)), epochs=EPOCHS)
    state = MasterState(ledger=ledger, num_ps=0, job_config={})
    service = MasterService(state)
    secret = new_secret()
    server = Server(
        ("127.0.0.1", 0),
        secret,
        service.handle,
        on_disconnect=service.on_disconnect,
        threaded=threaded,
    )
    server.serve_in_thread(name="master")
    try:
        env = {**os.environ, SECRET_ENV_VAR: secret_to_env(secret)}
        port = str(server.address[1])
        commands = [
            [sys.executable, __file__, "--client-ours", str(k), "--port", port]
            for k in range(clients)
        ]
        result = drive(commands, [env] * clients, warmup, seconds, log, os.getpid())
    finally:
        server.close()
    counted = round(result.pairs_per_s * seconds)
    if ledger.rows_done < counted:
        raise RuntimeError(f"the ledger has {ledger.rows_done} rows done for {counted} pairs")
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, master: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if master.poll() is not None:
            raise RuntimeError(f"the DLRover master exited with {master.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1.0):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the DLRover master did not listen on port {port} in {timeout:.0f} s")


@contextlib.contextmanager
def dlrover_master(python: str, port: int, env: dict[str, str], log: IO[str]) -> Iterator[int]:
    master = subprocess.Popen(
        [
            python,
            "-m",
            "dlrover.python.master.main",
            "--platform",
            "local",
            "--port",
            str(port),
            "--job_name",
            "bench",
        ],
        stdout=log,
        stderr=log,
        env=env,
        start_new_session=True,  # its own process group: we end it and whatever it started
    )
    try:
        wait_for_port(port, master, MASTER_START_TIMEOUT_S)
        yield master.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(master.pid, signal.SIGTERM)
        try:
            master.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(master.pid, signal.SIGKILL)
            master.wait()


def bench_dlrover(python: str, clients: int, warmup: float, seconds: float, log: IO[str]) -> Result:
    port = free_port()
    base = {**os.environ, "DLROVER_LOG_LEVEL": "WARNING"}
    base.pop(SECRET_ENV_VAR, None)
    with tempfile.TemporaryDirectory(prefix="shard-bench-") as tmp:
        script = Path(tmp) / "dlrover_client.py"
        script.write_text(DLROVER_CLIENT)
        envs = [
            {
                **base,
                "DLROVER_MASTER_ADDR": f"127.0.0.1:{port}",
                "NODE_ID": str(k),
                "NODE_TYPE": "worker",
            }
            for k in range(clients)
        ]
        with dlrover_master(python, port, base, log) as master_pid:
            return drive([[python, str(script)]] * clients, envs, warmup, seconds, log, master_pid)


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} CPUs ({model}), {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def versions_in(python: str) -> str:
    """DLRover's and Python's versions in that interpreter, as it reports them."""
    code = (
        "import importlib.metadata as m, platform; "
        "print('dlrover', m.version('dlrover'), 'on Python', platform.python_version())"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return out.stdout.strip() or f"unknown versions ({python} -c failed)"


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--dlrover-python", default=DEFAULT_DLROVER_PYTHON)
    parser.add_argument(
        "--server",
        choices=("loop", "threaded"),
        default="loop",
        help="our wire.Server mode: the selector loop the job master runs on (default), or a "
        "thread per connection",
    )
    parser.add_argument("--skip-ours", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client-ours", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client_ours is not None:
        client_ours(args.client_ours, args.port)
        return
    if args.clients < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("--clients must be >= 1, --seconds > 0 and --warmup >= 0")

    print(f"machine: {machine()}")
    print(
        f"{args.clients} client processes over loopback, {args.warmup:g} s warm-up, "
        f"{args.seconds:g} s counted; 1 pair = lease a shard + report it done"
    )
    have_dlrover = Path(args.dlrover_python).exists()
    # "a+": the clients and the master share this file, each appending whole lines.
    with tempfile.NamedTemporaryFile("a+", prefix="shard-bench-", suffix=".log") as log:
        try:
            ours = None
            if not args.skip_ours:
                print(f"ours ({args.server} server), {load()} ...", flush=True)
                ours = bench_ours(
                    args.clients, args.warmup, args.seconds, args.server == "threaded", log
                )
                print(f"ours: {ours}; {ours.empty_leases} empty leases at epoch ends")
            if not have_dlrover:
                print(
                    f"dlrover 0.6.1: skipped, no interpreter at {args.dlrover_python} "
                    "(set up its venv as the module docstring says, or pass --dlrover-python)"
                )
                return
            print(f"dlrover: {versions_in(args.dlrover_python)}, {load()} ...", flush=True)
            theirs = bench_dlrover(
                args.dlrover_python, args.clients, args.warmup, args.seconds, log
            )
            print(f"dlrover 0.6.1: {theirs}")
            if ours is not None:
                ratio = ours.pairs_per_s / theirs.pairs_per_s
                verdict = "met" if ratio >= TARGET else "NOT met"
                print(f"ratio: {ratio:.2f} (target >= {TARGET:g}: {verdict})")
        except Exception:  # not swallowed: shown with the children's output, then re-raised
            log.flush()
            log.seek(0)
            tail = log.read()[-4000:]
            if tail:
                print("--- last output of the masters and clients ---", file=sys.stderr)
                print(tail, file=sys.stderr)
            raise


if __name__ == "__main__":
    main()
