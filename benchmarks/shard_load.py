"""The job master's shard service under load: many worker processes, some killed mid-run.

What it measures: the real job master RPC service as a run starts it
(:class:`~dlrover_kfp.runtime.master.MasterService` over a
:class:`~dlrover_kfp.runtime.master.MasterState` and a
:class:`~dlrover_kfp.core.shards.ShardLedger`, served by the single-threaded
:class:`~dlrover_kfp.training.wire.Server` loop on a thread of this process, exactly as
``dlrover_kfp/runtime/job.py`` creates it) against ``--clients`` client *processes* (default 64)
that connect with the job secret and loop ``get_shard`` + ``report`` for ``--seconds`` (default
60), sending what a real worker sends (``dlrover_kfp/training/node.py``: worker, incarnation,
shard, epoch, samples, steps, loss_sum, bad_rows). ``--kill N`` (default 4) clients are killed
with SIGKILL at evenly spaced moments in the middle half of the run; their leases must come back
to the queue (the master sees the dropped connection).

Why it exists: the service's correctness claims (no shard lost, none completed twice, a dead
worker's leases requeued) are cheap to state and easy to break under contention, so they are
checked here at a load far above a real job's, with the latency each request sees.

Each client times every request with ``time.perf_counter`` and appends every accepted report's
(epoch, shard) to a file of its own with one unbuffered write, so that even a killed client's
completions are counted (at most its last one, accepted but not yet written, is missing).
Completions are also counted on the master's side, by the ledger itself (a subclass whose
``complete`` counts what it accepts). At the end, with every client gone:

* lost shards = shards of the epoch - TODO - DOING - DONE (must be 0), and DOING is empty (every
  departed client's leases came back);
* shards done twice, per (epoch, shard), from the clients' files and from the ledger (must be 0);
* the ledger's invariants (:func:`ledger_problems`).

Pairs/s is counted by the ledger between the common start and the end of the window. Latency
percentiles merge every surviving client's requests (a killed client's timings die with it).

    python benchmarks/shard_load.py [--clients 64] [--seconds 60] [--kill 4]
        [--shards 200000] [--epochs 1000] [--out docs/results/load-shards.json]

Exit status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import secrets
import signal
import struct
import subprocess
import sys
import tempfile
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_kfp.core.shards import Shard, ShardLedger
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

ROWS_PER_SHARD = 512
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "load-shards.json"
PREFIX = "LOAD "  # the lines of a client's stdout that the driver reads
#: One accepted report in a client's completion file: (epoch, shard id).
RECORD = struct.Struct("<II")
#: How long a killed client's leases may take to come back before the check fails (seconds).
REQUEUE_TIMEOUT_S = 10.0
#: How long a client waits between two empty leases (every shard of the epoch is leased; the
#: next epoch opens once they are all reported). A worker waits 20 ms (node.py).
EMPTY_WAIT_S = 0.02
#: How long a client may take to finish after the end of the window (seconds): its last pair
#: and writing its timings.
CLIENT_END_TIMEOUT_S = 60.0
#: After freezing a client, how long to let the master answer what it had already sent.
SETTLE_S = 0.02


# ------------------------------------------------------------------------------ the client


def client(name: str, incarnation: str, port: int, out_dir: Path) -> None:
    """One worker-like client (its own process): lease, report, time both, record acceptances."""
    conn = connect(("127.0.0.1", port), secret_from_env(), timeout=120.0)
    who = {"worker": name, "incarnation": incarnation}
    get_s: array[float] = array("d")
    report_s: array[float] = array("d")
    empty = rejected = 0
    fd = os.open(out_dir / f"{name}.done", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def pair(timed: bool, end_at: float = float("inf")) -> bool:
        """Lease a shard and report it; False when the job is finished or the time is up
        while no shard is free (a lost lease would otherwise stall the epoch's end forever)."""
        nonlocal empty, rejected
        while True:
            t0 = time.perf_counter()
            answer = conn.request(GET_SHARD, who).meta
            t1 = time.perf_counter()
            if timed:
                get_s.append(t1 - t0)
            shard = answer["shard"]
            if shard is not None:
                break
            if answer["finished"] or time.monotonic() >= end_at:
                return False
            empty += 1
            time.sleep(EMPTY_WAIT_S)
        meta = {
            **who,
            "shard": shard["id"],
            "epoch": shard["epoch"],
            "samples": shard["end"] - shard["start"],
            "steps": 1,
            "loss_sum": 0.693 * (shard["end"] - shard["start"]),
            "bad_rows": 0,
        }
        t0 = time.perf_counter()
        reply = conn.request(REPORT, meta).meta
        t1 = time.perf_counter()
        if timed:
            report_s.append(t1 - t0)
        if reply["accepted"]:
            os.write(fd, RECORD.pack(shard["epoch"], shard["id"]))
        else:
            rejected += 1
        return True

    pair(timed=False)  # connected and served once: ready
    print(PREFIX + "ready", flush=True)
    end_at = float(sys.stdin.readline())
    while time.monotonic() < end_at and pair(True, end_at):
        pass
    conn.close()
    os.close(fd)
    (out_dir / f"{name}.get").write_bytes(get_s.tobytes())
    (out_dir / f"{name}.report").write_bytes(report_s.tobytes())
    print(f"{PREFIX}empty {empty} rejected {rejected}", flush=True)


# ------------------------------------------------------------------------------ the master


@dataclass
class CountingLedger(ShardLedger):
    """A :class:`ShardLedger` that counts the leases it grants and, per (epoch, shard), the
    completions it accepts: the master's own record, to hold the clients' against."""

    accepted: Counter[tuple[int, int]] = field(default_factory=Counter)
    leases: int = 0

    def lease(self, worker: str, now: float) -> Shard | None:
        shard = super().lease(worker, now)
        if shard is not None:
            self.leases += 1
        return shard

    def complete(self, worker: str, shard_id: int, epoch: int) -> bool:
        done = super().complete(worker, shard_id, epoch)
        if done:
            self.accepted[(epoch, shard_id)] += 1
        return done


def ledger_problems(ledger: CountingLedger) -> list[str]:
    """Broken invariants of ``ledger``, a fresh one (epoch 0, nothing done) when it started.

    Every shard of the current epoch is in exactly one of TODO, DOING, DONE (none in two, none
    in none, none twice in TODO); a lease is filed under its shard's id and epoch; the DONE set
    holds the completions of the current epoch, and the rows done are those of every completed
    shard. Call with the master's lock held.
    """
    problems = []
    n = len(ledger.ranges)
    todo, doing, done = list(ledger.todo), set(ledger.doing), set(ledger.done)
    if len(set(todo)) != len(todo):
        problems.append(f"{len(todo) - len(set(todo))} shard(s) twice in TODO")
    overlap = (set(todo) & doing) | (set(todo) & done) | (doing & done)
    if overlap:
        problems.append(f"shards in two states at once: {sorted(overlap)[:10]}")
    if not ledger.finished:
        missing = set(range(n)) - set(todo) - doing - done
        if missing:
            problems.append(f"{len(missing)} shard(s) in no state: {sorted(missing)[:10]}")
    stray = [i for i in set(todo) | doing | done if not 0 <= i < n]
    if stray:
        problems.append(f"unknown shard ids: {sorted(stray)[:10]}")
    for shard_id, lease in ledger.doing.items():
        if lease.shard.id != shard_id or lease.shard.epoch != ledger.epoch:
            problems.append(f"lease of shard {shard_id} holds {lease.shard}")
    this_epoch = {i for (e, i) in ledger.accepted if e == ledger.epoch}
    if this_epoch != done:
        problems.append(
            f"epoch {ledger.epoch}: {len(this_epoch):,} completions accepted, "
            f"{len(done):,} shards done"
        )
    per_epoch = Counter(e for (e, _) in ledger.accepted)
    for e in range(ledger.epoch):
        if per_epoch[e] != n:
            problems.append(f"epoch {e} closed with {per_epoch[e]:,} of {n:,} shards completed")
    rows = sum(
        (ledger.ranges[i][2] - ledger.ranges[i][1]) * times
        for (_, i), times in ledger.accepted.items()
    )
    if ledger.rows_done != rows:
        problems.append(f"rows done {ledger.rows_done:,}, completed shards hold {rows:,}")
    return problems


def holds_lease(ledger: ShardLedger, holder: str) -> int:
    """How many shards ``holder`` has leased (call with the master's lock held)."""
    return sum(1 for lease in ledger.doing.values() if lease.worker == holder)


@dataclass
class Client:
    name: str
    incarnation: str
    proc: subprocess.Popen[str]
    killed_at: float | None = None

    @property
    def holder(self) -> str:
        return f"{self.name}#{self.incarnation}"


def read_tagged(stream: IO[str], what: str) -> str:
    """The next line that starts with PREFIX, without it; EOF first raises."""
    for line in stream:
        if line.startswith(PREFIX):
            return line[len(PREFIX) :].strip()
    raise RuntimeError(f"{what}: the process ended without answering")


def percentiles(values: array[float]) -> dict[str, float]:
    """p50, p99 and max of ``values`` (seconds), in milliseconds."""
    if not values:
        return {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "n": len(ordered),
        "p50_ms": round(at(0.50), 3),
        "p99_ms": round(at(0.99), 3),
        "max_ms": round(ordered[-1] * 1000, 3),
    }


def read_floats(path: Path) -> array[float]:
    values: array[float] = array("d")
    if path.exists():
        values.frombytes(path.read_bytes())
    return values


def read_records(path: Path) -> list[tuple[int, int]]:
    data = path.read_bytes() if path.exists() else b""
    whole = len(data) - len(data) % RECORD.size
    return [RECORD.unpack_from(data, k) for k in range(0, whole, RECORD.size)]


def run_load(
    *,
    clients: int,
    seconds: float,
    kill: int,
    shards: int,
    epochs: int,
    log: IO[str],
    progress: IO[str] | None = None,
) -> dict[str, Any]:
    """Run the load and return every figure and check (see the module docstring)."""
    if not 0 <= kill < clients:
        raise ValueError(f"--kill must be in 0..clients-1, got {kill} for {clients} clients")

    def say(text: str) -> None:
        if progress is not None:
            print(text, file=progress, flush=True)

    ledger = CountingLedger(
        tuple((0, i * ROWS_PER_SHARD, (i + 1) * ROWS_PER_SHARD) for i in range(shards)),
        epochs=epochs,
    )
    state = MasterState(ledger=ledger, num_ps=0, job_config={})
    service = MasterService(state)
    secret = new_secret()
    # As job.py starts the master: the single-threaded loop, on a thread of its own.
    server = Server(("127.0.0.1", 0), secret, service.handle, on_disconnect=service.on_disconnect)
    server.serve_in_thread(name="master")
    env = {**os.environ, SECRET_ENV_VAR: secret_to_env(secret)}
    port = str(server.address[1])
    procs: list[Client] = []
    with tempfile.TemporaryDirectory(prefix="shard-load-") as tmp:
        out_dir = Path(tmp)
        try:
            started = time.monotonic()
            for k in range(clients):
                name, incarnation = f"worker-{k}", f"{k}-{secrets.token_hex(4)}"
                proc = subprocess.Popen(
                    [sys.executable, __file__, "--client", name, incarnation, port, tmp],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    env=env,
                )
                procs.append(Client(name, incarnation, proc))
            for c in procs:
                assert c.proc.stdout is not None
                if read_tagged(c.proc.stdout, c.name) != "ready":
                    raise RuntimeError(f"{c.name}: unexpected first answer")
            say(f"{clients} clients connected in {time.monotonic() - started:.1f} s")
            load_before = os.getloadavg()
            go = time.monotonic()
            end_at = go + seconds
            with state.lock:
                before = sum(ledger.accepted.values())
            for c in procs:
                assert c.proc.stdin is not None
                c.proc.stdin.write(f"{end_at!r}\n")
                c.proc.stdin.flush()
            kills = _kill_some(procs, kill, go, seconds, state, ledger)
            time.sleep(max(end_at - time.monotonic(), 0.0))
            with state.lock:
                after = sum(ledger.accepted.values())
            load_during = os.getloadavg()
            empty = rejected = 0
            for c in procs:
                if c.killed_at is not None:
                    continue
                out, _ = c.proc.communicate(timeout=CLIENT_END_TIMEOUT_S)
                if c.proc.returncode != 0:
                    raise RuntimeError(f"{c.name} exited with {c.proc.returncode}")
                answer = read_tagged(io.StringIO(out), c.name).split()
                empty += int(answer[1])
                rejected += int(answer[3])
            # Every connection has ended; wait for the loop to have seen each one drop.
            deadline = time.monotonic() + REQUEUE_TIMEOUT_S
            while server.connections and time.monotonic() < deadline:
                time.sleep(0.01)
            get_s: array[float] = array("d")
            report_s: array[float] = array("d")
            client_done: Counter[tuple[int, int]] = Counter()
            for c in procs:
                get_s.extend(read_floats(out_dir / f"{c.name}.get"))
                report_s.extend(read_floats(out_dir / f"{c.name}.report"))
                client_done.update(read_records(out_dir / f"{c.name}.done"))
            with state.lock:
                total = len(ledger.ranges)
                todo, doing, done = len(ledger.todo), len(ledger.doing), len(ledger.done)
                completions = sum(ledger.accepted.values())
                leased = ledger.leases
                problems = ledger_problems(ledger)
                ledger_twice = sum(n - 1 for n in ledger.accepted.values() if n > 1)
                unknown_to_ledger = sum((client_done - ledger.accepted).values())
                unrecorded = sum((ledger.accepted - client_done).values())
                epoch = ledger.epoch
        finally:
            for c in procs:
                if c.proc.poll() is None:
                    c.proc.kill()
                    c.proc.wait()
            server.close()
    lost = total - todo - doing - done if not ledger.finished else 0
    client_twice = sum(n - 1 for n in client_done.values() if n > 1)
    if doing:
        problems.append(f"{doing} shard(s) still leased with every client gone")
    if unknown_to_ledger:
        problems.append(f"{unknown_to_ledger} completion(s) accepted by no ledger record")
    if unrecorded > len(kills):
        problems.append(f"{unrecorded} ledger completions missing from the clients' files")
    problems += [f"{k['worker']}: leases not back after kill" for k in kills if not k["requeued"]]
    returned = leased - completions - doing
    if returned != sum(k["leases_held"] for k in kills):
        problems.append(
            f"{leased:,} leases, {completions:,} completed, {doing} held: {returned} came back, "
            f"the killed clients held {sum(k['leases_held'] for k in kills)}"
        )
    if rejected:
        problems.append(f"{rejected} report(s) of a leased shard rejected")
    return {
        "clients": clients,
        "duration_s": seconds,
        "killed": len(kills),
        "shards_per_epoch": total,
        "rows_per_shard": ROWS_PER_SHARD,
        "epochs_started": epoch + 1,
        "pairs_per_s": round((after - before) / seconds, 1),
        "get_shard": percentiles(get_s),
        "report": percentiles(report_s),
        "shards_leased": leased,
        "shards_done": completions,
        "leases_returned": leased - completions - doing,
        "shards_lost": lost,
        "shards_done_twice": {"clients": client_twice, "ledger": ledger_twice},
        "ledger_completions_without_client_record": unrecorded,
        "empty_leases": empty,
        "rejected_reports": rejected,
        "kills": kills,
        "ledger_problems": problems,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_end": [round(x, 2) for x in load_during],
        "ok": not problems and lost == 0 and client_twice == 0 and ledger_twice == 0,
    }


def _stop_holding_a_lease(victim: Client, state: Any, ledger: ShardLedger) -> int:
    """Freeze ``victim`` (SIGSTOP) at a moment it holds a lease, as a worker dies mid-shard;
    return how many it holds. Between a lease and its report the window is short, so this
    tries up to 200 times; requests already sent are given time to be answered first."""
    held = 0
    for _ in range(200):
        victim.proc.send_signal(signal.SIGSTOP)
        time.sleep(SETTLE_S)
        with state.lock:
            held = holds_lease(ledger, victim.holder)
        if held:
            break
        victim.proc.send_signal(signal.SIGCONT)
        time.sleep(0.001 + 0.004 * random.random())
    return held


def _kill_some(
    procs: list[Client],
    kill: int,
    go: float,
    seconds: float,
    state: Any,
    ledger: ShardLedger,
) -> list[dict[str, Any]]:
    """SIGKILL ``kill`` clients spread over the middle half of the window, each while it holds
    a lease; for each, how many leases it held and how long they took to come back."""
    out: list[dict[str, Any]] = []
    if not kill:
        return out
    step = max(1, len(procs) // kill)
    victims = [procs[(k * step + step // 2) % len(procs)] for k in range(kill)]
    for k, victim in enumerate(victims):
        moment = go + seconds * (0.25 + 0.5 * (k + 1) / (kill + 1))
        time.sleep(max(moment - time.monotonic(), 0.0))
        held = _stop_holding_a_lease(victim, state, ledger)
        victim.proc.kill()
        victim.killed_at = time.monotonic()
        victim.proc.wait()
        requeued_after = None
        deadline = victim.killed_at + REQUEUE_TIMEOUT_S
        while time.monotonic() < deadline:
            with state.lock:
                left = holds_lease(ledger, victim.holder)
            if not left:
                requeued_after = time.monotonic() - victim.killed_at
                break
            time.sleep(0.001)
        out.append(
            {
                "worker": victim.name,
                "at_s": round(victim.killed_at - go, 2),
                "leases_held": held,
                "requeued": requeued_after is not None,
                "requeued_after_ms": None
                if requeued_after is None
                else round(requeued_after * 1000, 1),
            }
        )
    return out


# ---------------------------------------------------------------------------------- report


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPUs ({model}), {platform.system()} {platform.release()}"


def describe(result: dict[str, Any]) -> str:
    g, r = result["get_shard"], result["report"]
    twice = result["shards_done_twice"]
    lines = [
        f"clients {result['clients']} ({result['killed']} killed), "
        f"duration {result['duration_s']:g} s",
        f"pairs/s {result['pairs_per_s']:,.0f} (get_shard + report)",
        f"get_shard latency: p50 {g['p50_ms']:.2f} ms, p99 {g['p99_ms']:.2f} ms, "
        f"max {g['max_ms']:.1f} ms over {g['n']:,} requests",
        f"report latency:    p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
        f"max {r['max_ms']:.1f} ms over {r['n']:,} requests",
        f"shards leased {result['shards_leased']:,}, done {result['shards_done']:,}, "
        f"lost {result['shards_lost']}, done twice {twice['clients']} (clients) / "
        f"{twice['ledger']} (ledger); epochs started {result['epochs_started']}",
        f"empty leases {result['empty_leases']:,}, rejected reports {result['rejected_reports']}",
    ]
    for k in result["kills"]:
        lines.append(
            f"killed {k['worker']} at {k['at_s']:.1f} s holding {k['leases_held']} lease(s): "
            + (f"back in {k['requeued_after_ms']:.1f} ms" if k["requeued"] else "NOT back")
        )
    lines.append(
        "load average (1/5/15 min) before "
        + " ".join(f"{x:.2f}" for x in result["load_average_before"])
        + ", at the end "
        + " ".join(f"{x:.2f}" for x in result["load_average_end"])
    )
    for problem in result["ledger_problems"]:
        lines.append(f"PROBLEM: {problem}")
    lines.append("checks: " + ("all passed" if result["ok"] else "FAILED"))
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == "--client":
        name, incarnation, port, out_dir = sys.argv[2:]
        client(name, incarnation, int(port), Path(out_dir))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--kill", type=int, default=4, help="clients to SIGKILL mid-run")
    parser.add_argument("--shards", type=int, default=200_000, help="shards per epoch")
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON result")
    args = parser.parse_args()
    if args.clients < 1 or args.seconds <= 0 or args.shards < 1 or args.epochs < 1:
        parser.error("--clients, --seconds, --shards and --epochs must be positive")
    if not 0 <= args.kill < args.clients:
        parser.error(f"--kill must be in 0..{args.clients - 1}")
    print(f"machine: {machine()}, Python {platform.python_version()}")
    with tempfile.NamedTemporaryFile("a+", prefix="shard-load-", suffix=".log") as log:
        try:
            result = run_load(
                clients=args.clients,
                seconds=args.seconds,
                kill=args.kill,
                shards=args.shards,
                epochs=args.epochs,
                log=log,
                progress=sys.stdout,
            )
        except Exception:
            log.flush()
            log.seek(0)
            tail = log.read()[-4000:]
            if tail:
                print("--- last output of the clients ---", file=sys.stderr)
                print(tail, file=sys.stderr)
            raise
    result["machine"] = machine()
    result["command"] = "python benchmarks/shard_load.py " + " ".join(sys.argv[1:])
    print(describe(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
