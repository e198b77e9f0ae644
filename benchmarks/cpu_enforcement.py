"""How closely a local pod's CPU use follows its limit: busy pods under cgroup CFS quotas.

Each pod spins more processes than it has cores (``ceil(cpu) + 1``; threads would share one
GIL), so without a limit it would take what the machine has idle; the backend's own accounting
(the group's ``cpuacct.usage`` or ``cpu.stat``) then reports what it used over the window. One
pod at a time, so the machine's two cores never run short and the quota is the only thing that
binds.

    python benchmarks/cpu_enforcement.py                  # 0.25, 0.5, 1.0, 1.5 cores, 10 s each
    python benchmarks/cpu_enforcement.py --cpus 0.5 --seconds 30

Prints, per limit, the cores used over the whole window and the range over 1 s sub-windows.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_kfp.backends import LocalBackend, PodSpec

SPIN = (
    "import os, sys\n"
    "for _ in range(int(sys.argv[1]) - 1):\n"
    "    if os.fork() == 0:\n"
    "        break\n"
    "while True:\n"
    "    pass\n"
)


def measure(backend: LocalBackend, cpu: float, seconds: float) -> tuple[float, list[float]]:
    """Cores used by a spinning pod at ``cpu`` over ``seconds``, and per 1 s sub-window."""
    name = f"busy-{str(cpu).replace('.', '-')}"
    processes = math.ceil(cpu) + 1
    backend.launch(
        PodSpec(
            name=name,
            role="worker",
            index=0,
            command=(sys.executable, "-c", SPIN, str(processes)),
            cpu=cpu,
            memory_mb=256,
        )
    )
    try:
        time.sleep(1.0)  # interpreter start-up is not what is measured
        backend.usage()
        windows: list[float] = []
        for _ in range(round(seconds)):
            time.sleep(1.0)
            (u,) = [u for u in backend.usage() if u.name == name]
            windows.append(u.cpu_cores)
        return sum(windows) / len(windows), windows
    finally:
        backend.delete(name, grace_s=1.0)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", default="0.25,0.5,1.0,1.5", help="comma-separated limits")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="cpu_enforcement-") as tmp,
        LocalBackend(Path(tmp)) as backend,
    ):
        print(f"limits: {backend.enforcement}")
        print(f"{'limit':>6}  {'used':>6}  {'used/limit':>10}  1 s windows (min - max)")
        for cpu in (float(c) for c in args.cpus.split(",")):
            mean, windows = measure(backend, cpu, args.seconds)
            print(
                f"{cpu:>6g}  {mean:>6.3f}  {mean / cpu:>10.3f}  "
                f"{min(windows):.3f} - {max(windows):.3f}"
            )


if __name__ == "__main__":
    main()
