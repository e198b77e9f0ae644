"""The history store under concurrent recording: many processes, one database, no loss.

What it measures: ``--processes`` writer processes (default 8) each record ``--profiles``
distinct profiles (default 200) into the same history, one transaction per profile: every
fourth with :func:`~dlrover_kfp.history.record_profile` (open the store, migrate, record,
close: the post-run step of a pipeline), the others with ``record`` on one open store. Every process
also records ``--shared`` profiles (default 20) that the *next* process records too, with the
same run_id and the same content, at about the same moment: recording is idempotent on run_id,
so each of those must be stored once, and exactly one of the two calls may say "new". The
processes open the database together, so on a fresh database they also race to create the
schema.

Afterwards every profile must be present exactly once and read back equal to what was
recorded, the "new" answers must add up to the number of distinct runs, and no record call may
have failed. Printed: profiles/s (record calls of all processes per second of the recording
phase), failures, and the slowest record call.

Backends: a SQLite file (always) and, when ``--postgres URL`` or
``DLROVER_KFP_TEST_POSTGRES_URL`` names a server, PostgreSQL too (each run in a fresh schema,
dropped afterwards). ``eval "$(bash .ci/postgres.sh)"`` starts a throwaway server.

    python benchmarks/history_concurrency.py [--processes 8] [--profiles 200] [--shared 20]
        [--postgres URL] [--out docs/results/load-history.json]

Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa

from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.errors import DlroverKfpError, NotFoundError
from dlrover_kfp.history import open_history, record_profile
from tests.factories import make_profile

POSTGRES_ENV = "DLROVER_KFP_TEST_POSTGRES_URL"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "load-history.json"
#: How the driver hands the store's URL to its writer processes.
URL_ENV = "HISTORY_LOAD_URL"
PREFIX = "HISTORY "  # the line of the writers' stdout that the driver reads
T0 = 1_793_491_200.0  # 2026-11-01T00:00:00Z
#: How long a writer may take in all before the run is declared hung (seconds).
WRITER_TIMEOUT_S = 600.0
SCENARIOS = ("ads-ctr", "feed-rank", "search-ads", None)


def own_ids(process: int, profiles: int) -> list[str]:
    return [f"p{process}-{i:04d}" for i in range(profiles)]


def shared_ids(process: int, processes: int, shared: int) -> tuple[list[str], list[str]]:
    """The runs ``process`` shares with the next process (its own) and with the previous one
    (the previous process's own): each shared run is recorded by two processes (by the one
    process twice when there is only one)."""
    mine = [f"shared-{process}-{k:03d}" for k in range(shared)]
    before = (process - 1) % processes
    theirs = [f"shared-{before}-{k:03d}" for k in range(shared)]
    return mine, theirs


def profile_for(run_id: str) -> JobProfile:
    """The profile of ``run_id``: the same run_id always gives the same profile, so that two
    processes recording it record the same thing and a read-back can be compared."""
    n = sum(ord(c) * (k + 1) for k, c in enumerate(run_id))
    return make_profile(
        run_id,
        scenario=SCENARIOS[n % len(SCENARIOS)],
        name=f"job-{n % 37}",
        started_at=T0 + n % 100_000,
        table_sizes=(10_000 * (1 + n % 5), 5_000),
        dataset_rows=100_000 * (1 + n % 9),
        workers=1 + n % 8,
        ps=1 + n % 3,
        worker_cpu=float(1 + n % 4),
        throughput=5_000.0 + n % 20_000,
        oom_events=int(n % 11 == 0),
    )


# ------------------------------------------------------------------------------- the writers


def writer(
    url: str, process: int, processes: int, profiles: int, shared: int, barrier: Any, out: Any
) -> None:
    """One writer process: build its profiles, wait for the others, open the store, record."""
    mine, theirs = shared_ids(process, processes, shared)
    # The shared runs first, alternating: process k records shared-k-0 first and shared-(k-1)-0
    # second, while process k+1 records shared-(k+1)-0 first and shared-k-0 second, so the two
    # writers of each shared run reach it within a call of each other.
    order = [run_id for pair in zip(mine, theirs, strict=True) for run_id in pair]
    order += own_ids(process, profiles)
    made = [profile_for(run_id) for run_id in order]
    new, slowest, failures = 0, 0.0, []
    barrier.wait()
    try:
        with open_history(url) as store:
            for k, profile in enumerate(made):
                t = time.perf_counter()
                try:
                    # Every 4th as the pipeline's record step does it: open, migrate, record,
                    # close; the others through one open store, as `history import` does.
                    new += record_profile(url, profile) if k % 4 == 0 else store.record(profile)
                except DlroverKfpError as exc:
                    failures.append(f"{profile.run_id}: {type(exc).__name__}: {exc}")
                slowest = max(slowest, time.perf_counter() - t)
    except DlroverKfpError as exc:
        failures.append(f"open: {type(exc).__name__}: {exc}")
    out.put({"new": new, "calls": len(made), "failures": failures, "slowest_s": slowest})


def writers(url: str, processes: int, profiles: int, shared: int) -> dict[str, Any]:
    """Fork the writers from this process, release them together, collect what they did.

    Forked, not spawned: this process has imported the store once, and its children start
    with it in memory, instead of each paying for the imports (most of a small run's time).
    It is single-threaded (a command-line process of its own), so forking it is safe.
    """
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(processes + 1), ctx.Queue()
    procs = [
        ctx.Process(target=writer, args=(url, k, processes, profiles, shared, barrier, out))
        for k in range(processes)
    ]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=WRITER_TIMEOUT_S)
    start = time.perf_counter()
    answers = [out.get(timeout=WRITER_TIMEOUT_S) for _ in procs]
    seconds = time.perf_counter() - start
    for proc in procs:
        proc.join(timeout=WRITER_TIMEOUT_S)
    return {"answers": answers, "seconds": seconds}


# -------------------------------------------------------------------------------- the driver


def run(url: str, *, processes: int, profiles: int, shared: int) -> dict[str, Any]:
    """Run the writers against ``url`` (in a process of their own) and check the store."""
    done = subprocess.run(
        [sys.executable, __file__, "--writers", str(processes), str(profiles), str(shared)],
        capture_output=True,
        text=True,
        timeout=WRITER_TIMEOUT_S,
        env={**os.environ, URL_ENV: url},  # not on the command line: it may hold a password
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(PREFIX)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"the writers failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
        )
    report = json.loads(lines[-1][len(PREFIX) :])
    answers, seconds = report["answers"], float(report["seconds"])

    distinct = {run_id for k in range(processes) for run_id in own_ids(k, profiles)}
    distinct |= {run_id for k in range(processes) for run_id in shared_ids(k, processes, shared)[0]}
    calls = sum(int(a.get("calls", 0)) for a in answers)
    failures = [f for a in answers for f in a["failures"]]
    new = sum(int(a["new"]) for a in answers)
    problems: list[str] = []
    with open_history(url) as store:
        stored = store.count()
        listed = [s.run_id for s in store.list(limit=len(distinct) + 100)]
        missing, differ = [], []
        for run_id in sorted(distinct):
            try:
                if store.get(run_id) != profile_for(run_id):
                    differ.append(run_id)
            except NotFoundError:
                missing.append(run_id)
    if stored != len(distinct):
        problems.append(f"{stored} profiles stored for {len(distinct)} distinct runs")
    if len(listed) != len(set(listed)) or set(listed) != distinct:
        problems.append(
            f"summaries: {len(listed)} rows, {len(set(listed))} distinct, "
            f"{len(distinct - set(listed))} missing, {len(set(listed) - distinct)} unknown"
        )
    if new != len(distinct):
        problems.append(f"{new} record calls answered 'new' for {len(distinct)} distinct runs")
    if missing:
        problems.append(f"{len(missing)} runs missing, e.g. {missing[:3]}")
    if differ:
        problems.append(f"{len(differ)} profiles read back different, e.g. {differ[:3]}")
    if failures:
        problems.append(f"{len(failures)} record calls failed, e.g. {failures[:3]}")
    return {
        "processes": processes,
        "profiles_per_process": profiles,
        "shared_per_process": shared,
        "record_calls": calls,
        "distinct_runs": len(distinct),
        "stored": stored,
        "seconds": round(seconds, 3),
        "profiles_per_s": round(calls / seconds, 1),
        "slowest_record_ms": round(max(float(a["slowest_s"]) for a in answers) * 1000, 1),
        "failures": len(failures),
        "failure_examples": failures[:5],
        "problems": problems,
        "ok": not problems,
    }


@contextlib.contextmanager
def fresh_postgres_schema(url: str) -> Iterator[str]:
    """``url`` with its ``search_path`` set to a brand-new schema, dropped afterwards."""
    schema = f"load_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(url)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        scoped = sa.make_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
        yield scoped.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()


def describe(name: str, result: dict[str, Any]) -> str:
    return (
        f"{name}: {result['processes']} processes x {result['profiles_per_process']} profiles "
        f"(+{result['shared_per_process']} shared with the next), "
        f"{result['record_calls']:,} record calls, {result['distinct_runs']:,} distinct runs, "
        f"{result['stored']:,} stored; {result['profiles_per_s']:,.0f} profiles/s over "
        f"{result['seconds']:.1f} s, slowest call {result['slowest_record_ms']:.0f} ms, "
        f"failures {result['failures']}; checks "
        + ("passed" if result["ok"] else "FAILED: " + "; ".join(result["problems"]))
    )


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--writers":
        processes, profiles, shared = (int(a) for a in sys.argv[2:])
        report = writers(os.environ[URL_ENV], processes, profiles, shared)
        print(PREFIX + json.dumps(report), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--profiles", type=int, default=200, help="distinct profiles a process")
    parser.add_argument("--shared", type=int, default=20, help="runs shared with the next one")
    parser.add_argument("--postgres", default=None, help=f"a server URL (default ${POSTGRES_ENV})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON result")
    args = parser.parse_args()
    if args.processes < 1 or args.profiles < 0 or args.shared < 0:
        parser.error("--processes must be >= 1, --profiles and --shared >= 0")
    postgres = args.postgres or os.environ.get(POSTGRES_ENV, "").strip() or None
    print(
        f"machine: {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}; load average "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    results: dict[str, Any] = {}
    kw = {"processes": args.processes, "profiles": args.profiles, "shared": args.shared}
    with tempfile.TemporaryDirectory(prefix="history-load-") as tmp:
        results["sqlite"] = run(f"sqlite:///{tmp}/history.db", **kw)
    print(describe("sqlite", results["sqlite"]), flush=True)
    if postgres is None:
        print(f"postgresql: skipped (set {POSTGRES_ENV} or pass --postgres URL)")
    else:
        with fresh_postgres_schema(postgres) as url:
            results["postgresql"] = run(url, **kw)
        print(describe("postgresql", results["postgresql"]))
    results["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    results["command"] = "python benchmarks/history_concurrency.py " + " ".join(
        a
        for a in sys.argv[1:]
        if "://" not in a  # never a URL: it may hold a password
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r["ok"] for r in results.values() if isinstance(r, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
