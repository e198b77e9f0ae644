"""How long the cluster simulator takes: a 1,000-job trace, all four policies (target < 60 s).

    python benchmarks/simulate_speed.py [--jobs 1000] [--processes 2]

Prints the wall time of the whole comparison (policies in parallel processes, as
``dlrover-kfp simulate`` runs them) and, for the ratio, each policy's own time run alone.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from dlrover_kfp.sim.cluster.engine import ClusterSettings, FaultSettings
from dlrover_kfp.sim.cluster.runner import POLICIES, compare, run_policy
from dlrover_kfp.sim.cluster.trace import cluster_size_for, synthetic_trace

TARGET_S = 60.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    began = time.perf_counter()
    jobs = synthetic_trace(args.jobs, args.seed)
    nodes, cpu, memory = cluster_size_for(jobs)
    cluster = ClusterSettings(nodes=nodes, node_cpu=cpu, node_memory_mb=memory)
    print(f"trace: {len(jobs)} jobs in {time.perf_counter() - began:.2f}s; {nodes} nodes")
    faults = FaultSettings()
    began = time.perf_counter()
    compare(jobs, list(POLICIES), cluster, faults, args.seed, processes=args.processes)
    wall = time.perf_counter() - began
    print(
        f"all {len(POLICIES)} policies, {args.processes} processes: {wall:.1f}s "
        f"(target {TARGET_S:.0f}s, ratio {wall / TARGET_S:.2f})"
    )
    for name in POLICIES:
        began = time.perf_counter()
        run_policy(name, jobs, cluster, faults, args.seed)
        print(f"  {name:<12} alone: {time.perf_counter() - began:.1f}s")


if __name__ == "__main__":
    main()
