"""PS start-up: how long a fresh PS takes to be ready to serve, against touching its memory once.

A PS is ready when its state is built (embedding rows initialised, Adagrad accumulator zeroed,
PS 0's dense parameters) and its flash-checkpoint buffer exists; before that it serves nothing.
Most of that is memory: on this VM new memory faults in at only 0.5-1.8 GB/s, so the floor for
any PS is the time to touch its resident bytes once. The target is

    ready / touch_once <= 1.5

Each round runs three fresh subprocesses, one after the other, in an order that rotates from
round to round (the machine is shared and noisy, and a process pays for the memory that the
one before it has just freed; one untimed touch comes first of all):

(a) ``write``, the reference of the target: allocates and writes once, with ``np.empty`` and
    ``ndarray.fill``, exactly the bytes the PS holds resident when ready: the anonymous part
    (weights + accumulator, + dense and dense accumulator on PS 0) as one numpy array (numpy
    advises huge pages for it, as the PS does for its tables) and the snapshot buffer's
    capacity as a file in the same tmpfs the PS uses (tmpfs pages fault in slower than
    anonymous ones, so the reference writes where the PS does). Each buffer is split over as
    many threads as the PS may use (``DLROVER_KFP_POD_CPU``, default 1). Timed inside the
    process, from the allocation to the last write: interpreter start and imports are not
    part of "touching memory".
(b) ``ps``: what ``python -m dlrover_kfp.training.node ps`` does from process start until it
    would listen: import the node module, ``ps_server.build_state`` (a fresh start, no
    restore) and ``PsCheckpointer`` with ``ps_server.snapshot_copy_threads`` into a temporary
    checkpoint directory and the shm directory, as ``ps_server.serve`` does. Timed by this
    process from spawning the child to reading its "ready" line, so interpreter start and
    imports count against the PS. After the timed part, the child copies its state into the
    snapshot buffer once (``ShmSnapshot.snapshot``, no persist) to show that the buffer was
    touched: that copy should run at memcpy speed (10-17 GB/s), not at fault speed.
(c) ``populate``: (a)'s bytes touched the cheapest way we know, as the PS touches them
    (``MADV_POPULATE_WRITE``, after ``posix_fallocate`` for the tmpfs file): the floor of any
    PS, printed for information; the target is against (a).

What is counted as resident, and why: the arrays a PS must have mapped to serve without
faulting (weights, accumulator, dense parameters on PS 0) and the snapshot buffer, which is
touched at start so that later snapshots copy at memcpy speed. Not counted: the interpreter
and torch's libraries (file-backed, and their cost is the import time, which (b) includes),
and scratch of a few MB.

    python benchmarks/ps_startup.py --model small
    python benchmarks/ps_startup.py --model medium --repeats 6  # ~4 min here
    python benchmarks/ps_startup.py --model medium --pod-cpu 2  # a PS pod with 2 CPUs

The subprocesses hold the same bytes (13.3 GB for medium) one after the other, never two at
once; the benchmark checks ``MemAvailable`` before each round. Shared-memory files it creates
are removed after each subprocess, also when one fails.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SEED = 0
READY = "READY"
_TOUCH_PREFIX = "dlrover-kfp-ps-startup-touch."


# ------------------------------------------------------------------------------ subprocesses


def _split(buffer: np.ndarray, threads: int, work: Callable[[np.ndarray], None]) -> None:
    """Run ``work`` on ``threads`` page-aligned parts of ``buffer`` at once (it must release the
    GIL, as ``ndarray.fill`` and ``memory.populate`` do)."""
    n = buffer.size
    bounds = [n * i // threads // 4096 * 4096 for i in range(threads)] + [n]
    workers = [
        threading.Thread(target=work, args=(buffer[a:b],))
        for a, b in itertools.pairwise(bounds[1:])
    ]
    for w in workers:
        w.start()
    work(buffer[: bounds[1]])
    for w in workers:
        w.join()


def child_touch(anon_bytes: int, shm_bytes: int, shm_dir: str, threads: int, method: str) -> None:
    """``write``: np.empty + fill, a plain first write of every byte. ``populate``: the
    cheapest way we know, as the PS does it (MADV_POPULATE_WRITE; posix_fallocate first for
    the tmpfs file): the floor for any PS, not the target's reference."""
    import mmap  # noqa: PLC0415

    from dlrover_kfp.training import memory  # noqa: PLC0415

    def fill(part: np.ndarray) -> None:
        part.fill(1)

    def populate(part: np.ndarray) -> None:
        memory.populate(part)

    touch = fill if method == "write" else populate
    path = Path(shm_dir) / f"{_TOUCH_PREFIX}{os.getpid()}"
    started = time.perf_counter()
    anon = (
        np.empty(anon_bytes, dtype=np.uint8)
        if method == "write"
        else memory.anonymous(anon_bytes, np.uint8)
    )
    _split(anon, threads, touch)
    anon_s = time.perf_counter() - started
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, shm_bytes)
        if method == "populate":
            os.posix_fallocate(fd, 0, shm_bytes)
        mm = mmap.mmap(fd, shm_bytes, flags=mmap.MAP_SHARED)
        shm = np.frombuffer(mm, dtype=np.uint8)
        _split(shm, threads, touch)
        touch_s = time.perf_counter() - started
        del shm
        mm.close()
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    print(json.dumps({"touch_s": touch_s, "anon_s": anon_s, "shm_s": touch_s - anon_s}))


def child_ps(config_json: str, spawned_at: float) -> None:
    def since() -> float:
        return time.time() - spawned_at

    # What the PS entry point imports (node imports ps_server, checkpoint, torch, ...).
    import dlrover_kfp.training.node  # noqa: F401, PLC0415
    from dlrover_kfp.training import checkpoint as ckpt  # noqa: PLC0415
    from dlrover_kfp.training import ps_server  # noqa: PLC0415

    imported = since()
    config = json.loads(config_json)
    state = ps_server.build_state(0, config)
    built = since()
    checkpointer = ckpt.PsCheckpointer(
        config["checkpoint_dir"],
        str(config["job_id"]),
        0,
        state,
        copy_threads=ps_server.snapshot_copy_threads(os.environ),
    )
    ready = since()
    print(READY, flush=True)
    stats = checkpointer.flash.shm.snapshot(1, state.arrays())
    print(
        json.dumps(
            {
                "import_s": imported,
                "build_state_s": built - imported,
                "checkpointer_s": ready - built,
                "ready_s": ready,
                "state_bytes": state.nbytes,
                "shm_bytes": checkpointer.flash.shm.capacity,
                "snapshot_s": stats.copy_s,
                "snapshot_bytes": stats.nbytes,
            }
        ),
        flush=True,
    )
    checkpointer.close()
    checkpointer.flash.shm.unlink()


# ------------------------------------------------------------------------------ the parent


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            parsed: dict[str, Any] = json.loads(line)
            return parsed
    raise RuntimeError(f"no result from the subprocess; its output:\n{text}")


def run_touch(
    method: str, anon: int, shm: int, shm_dir: Path, threads: int, env: dict[str, str]
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "touch", "--anon-bytes", str(anon)]
    cmd += ["--shm-bytes", str(shm), "--shm-dir", str(shm_dir), "--threads", str(threads)]
    cmd += ["--method", method]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    finally:
        for stale in shm_dir.glob(f"{_TOUCH_PREFIX}*"):  # a child killed before its cleanup
            stale.unlink(missing_ok=True)
    if done.returncode != 0:
        raise RuntimeError(f"touch subprocess failed:\n{done.stderr}")
    return _last_json(done.stdout)


def run_ps(config: dict[str, Any], shm_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    from dlrover_kfp.training.checkpoint import cleanup_shm  # noqa: PLC0415

    child_env = dict(env, DLROVER_KFP_SHM_DIR=str(shm_dir))
    spawned_at = time.time()
    started = time.perf_counter()
    cmd = [sys.executable, __file__, "--child", "ps", "--config", json.dumps(config)]
    cmd += ["--spawned-at", repr(spawned_at)]
    proc = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready_s = math.nan
        lines = []
        for line in proc.stdout:
            if line.strip() == READY:
                ready_s = time.perf_counter() - started
            lines.append(line)
        if proc.wait() != 0 or math.isnan(ready_s):
            raise RuntimeError(f"PS subprocess failed (exit {proc.returncode})")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cleanup_shm(str(config["job_id"]), shm_dir)
        shutil.rmtree(config["checkpoint_dir"], ignore_errors=True)
    result = _last_json("".join(lines))
    result["parent_ready_s"] = ready_s
    return result


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _summary(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))} - " + (
        f"{fmt.format(max(values))}]"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("small", "medium"), default="small")
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds (default 3; a multiple of 3 is fairest)"
    )
    parser.add_argument("--num-ps", type=int, default=1, help="the job's PS; PS 0 is measured")
    parser.add_argument("--pod-cpu", help="DLROVER_KFP_POD_CPU for both subprocesses")
    parser.add_argument("--shm-dir", default=None, help="tmpfs directory (default /dev/shm)")
    parser.add_argument("--child", choices=("touch", "ps"), help=argparse.SUPPRESS)
    parser.add_argument("--anon-bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--shm-bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--method", default="write", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--spawned-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "touch":
        child_touch(args.anon_bytes, args.shm_bytes, args.shm_dir, args.threads, args.method)
        return 0
    if args.child == "ps":
        child_ps(args.config, args.spawned_at)
        return 0

    from ps_throughput import MODELS, job_spec  # noqa: PLC0415

    from dlrover_kfp.core.documents import to_dict  # noqa: PLC0415
    from dlrover_kfp.training.checkpoint import PartMeta, StateSpec, default_shm_dir  # noqa: PLC0415
    from dlrover_kfp.training.model import dense_parameter_count  # noqa: PLC0415
    from dlrover_kfp.training.ps_state import startup_threads  # noqa: PLC0415

    env = dict(os.environ)
    if args.pod_cpu is not None:
        env["DLROVER_KFP_POD_CPU"] = args.pod_cpu
    threads = startup_threads(env)
    size = MODELS[args.model]
    spec = job_spec(size, size.job_rows, 1, args.num_ps)
    shm_dir = Path(args.shm_dir) if args.shm_dir else default_shm_dir()
    tables = tuple(spec.model.table_sizes)
    meta = PartMeta("bench", args.num_ps, 0, sum(tables), size.dim, tables)
    state_spec = StateSpec.for_ps(meta, dense_parameter_count(spec.model))
    anon_bytes, shm_bytes = state_spec.nbytes, state_spec.capacity()
    resident = anon_bytes + shm_bytes
    available = _mem_available()
    print(
        f"PS 0 of {args.num_ps}, {args.model} model: {len(tables)} tables x {tables[0]:,} rows "
        f"x {size.dim}; resident when ready {resident / 1e9:.2f} GB = state "
        f"{anon_bytes / 1e9:.2f} GB (weights, accumulator, dense) + snapshot buffer "
        f"{shm_bytes / 1e9:.2f} GB in {shm_dir}"
    )
    print(
        f"pod CPU {env.get('DLROVER_KFP_POD_CPU', '(unset)')} -> {threads} thread(s) at start; "
        f"MemAvailable {available / 1e9:.1f} GB"
    )
    if available and resident * 1.1 > available:
        print("not enough free memory for one subprocess at a time; stopping", file=sys.stderr)
        return 1
    print(
        f"{platform.node()}: {os.cpu_count()} CPUs, Linux {platform.release()}, "
        f"Python {platform.python_version()}, numpy {np.__version__}, "
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    )

    touches: list[dict[str, Any]] = []
    floors: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    print(
        f"\n{'round':>5} {'touch':>6} {'ready':>6} {'ratio':>6} {'floor':>6}   (s)   "
        "touch = anon + tmpfs; ready = import + build_state + checkpointer; 1st snapshot copy"
    )
    # Untimed: the first process to touch this much memory after a pause is much slower than
    # the next (10-14 s against ~1.3 s for the anonymous part of the medium model, measured),
    # and whichever kind came first would carry that.
    run_touch("write", anon_bytes, shm_bytes, shm_dir, threads, env)
    kinds = ("write", "ps", "populate")
    for r in range(args.repeats):
        # Each kind runs first, second and third in turn: a process pays for the memory that
        # the one before it has just freed (the host takes freed pages back), so the order
        # rotates and, over a multiple of 3 rounds, every kind sees every position equally.
        done: dict[str, dict[str, Any]] = {}
        for kind in kinds[r % 3 :] + kinds[: r % 3]:
            if kind == "ps":
                config = {
                    "spec": to_dict(spec),
                    "num_ps": args.num_ps,
                    "seed": SEED,
                    "synchronous": False,
                    "checkpoint_dir": tempfile.mkdtemp(prefix="ps-startup-ckpt-"),
                    "job_id": f"ps-startup-{os.getpid()}-{r}",
                }
                done[kind] = run_ps(config, shm_dir, env)
            else:
                done[kind] = run_touch(kind, anon_bytes, shm_bytes, shm_dir, threads, env)
        touch, res, floor = done["write"], done["ps"], done["populate"]
        if res["state_bytes"] + res["shm_bytes"] != resident:
            raise RuntimeError(
                f"the PS holds {res['state_bytes']} + {res['shm_bytes']} bytes, "
                f"the touch reference wrote {resident}"
            )
        touches.append(touch)
        results.append(res)
        floors.append(floor)
        t, ready = float(touch["touch_s"]), float(res["parent_ready_s"])
        print(
            f"{r + 1:>5} {t:>6.2f} {ready:>6.2f} {ready / t:>6.2f} {floor['touch_s']:>6.2f}   "
            f"      {touch['anon_s']:.2f} + {touch['shm_s']:.2f}; "
            f"{res['import_s']:.2f} + {res['build_state_s']:.2f} + {res['checkpointer_s']:.2f}; "
            f"{res['snapshot_bytes'] / res['snapshot_s'] / 1e9:.1f} GB/s",
            flush=True,
        )
        if r + 1 < args.repeats and _mem_available() < resident * 1.1:
            print("MemAvailable fell below what one subprocess needs; stopping", file=sys.stderr)
            break

    def col(rows: list[dict[str, Any]], key: str) -> list[float]:
        return [float(x[key]) for x in rows]

    def per_round(num: list[float], den: list[float]) -> list[float]:
        return [x / y for x, y in zip(num, den, strict=True)]

    touch_s, floor_s = col(touches, "touch_s"), col(floors, "touch_s")
    ready_s = col(results, "parent_ready_s")
    after_imports = [x - y for x, y in zip(ready_s, col(results, "import_s"), strict=True)]
    print(f"\nmedian [min - max] over {len(results)} rounds")
    rates = [resident / t / 1e9 for t in touch_s]
    print(f"  touch once (write)  {_summary(touch_s)} s ({_summary(rates)} GB/s)")
    print(f"    anonymous part    {_summary(col(touches, 'anon_s'))} s")
    print(f"    tmpfs part        {_summary(col(touches, 'shm_s'))} s")
    print(f"  PS ready            {_summary(ready_s)} s")
    print(f"    imports           {_summary(col(results, 'import_s'))} s")
    print(f"    build_state       {_summary(col(results, 'build_state_s'))} s")
    print(f"    PsCheckpointer    {_summary(col(results, 'checkpointer_s'))} s")
    print(f"  ready / touch once  {_summary(per_round(ready_s, touch_s))}   (target <= 1.5)")
    print(f"    without imports   {_summary(per_round(after_imports, touch_s))}")
    rates = [resident / t / 1e9 for t in floor_s]
    print(f"  touch by populate   {_summary(floor_s)} s ({_summary(rates)} GB/s): the floor")
    print(f"  ready / floor       {_summary(per_round(ready_s, floor_s))}")
    print(f"    without imports   {_summary(per_round(after_imports, floor_s))}")
    copy_rates = [x["snapshot_bytes"] / x["snapshot_s"] / 1e9 for x in results]
    print(f"  first snapshot copy {_summary(copy_rates, '{:.1f}')} GB/s into the touched buffer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
