"""The oracle: the best a job's hidden truth allows within its quota, found by searching the truth.

No policy can do this: it reads the job's :class:`~dlrover_kfp.sim.cluster.truth.JobTruth`
(throughput function and memory curve), which the simulator keeps from every policy. It is the
yardstick the comparison measures plans against ("the plans' throughput as a fraction of the
oracle's best in quota"), and, run as a reference policy (:mod:`.policies.oracle`), what a
planner that knew the truth from the first second would get on the same cluster.

**What it searches.** Configurations ``(w, p, λw, λp)``: every worker count ``w`` and PS count
``p`` the job's elastic bounds allow (``spec.elastic``), CPU per worker and per PS on a grid of
:data:`CPU_STEP` cores from one step up to the node's size. A configuration is *in quota* when

    w · λw + p · λp          ≤ quota.cpu
    w · Mw + p · Mp(p)       ≤ quota.memory          (MiB)
    Mw, Mp(p)                ≤ the node's memory,  λw, λp ≤ the node's CPU

where ``Mw`` is the truth's worker memory and ``Mp(p)`` what the largest PS needs at the end of
the job with ``p`` PS (``MemoryTruth.ps_used_mb(1, p, 0)``: the truth's imbalance, the process
runtime, and the flash checkpoint's snapshot share when the runtime keeps one, as
:func:`~dlrover_kfp.sim.cluster.engine.request_would_hold` counts it). A plan gives every PS the
same memory, so every PS gets the largest one's. PS memory only grows with progress, so the end
is the peak: an oracle configuration never OOMs.

**How.** Every family's step time ``T`` increases with the worker's time ``a`` and with the PS
service time (``closed_loop_step``, with c = w·busy and b = a + c + wait:
2·∂T/∂a = 1 + (a + wait − c)/√(b² − 4ac) ≥ 0 because b² − 4ac = (a + wait − c)² + 4c·wait,
and likewise in c and wait), and ``a`` and ``busy`` never grow as λw and λp grow (thread caps,
Amdahl, the trainer's throttling below one core), so throughput ``X = w·B/T`` never falls when
a pod gets more CPU. The best in quota therefore lies on the CPU frontier: for each
``(w, p, λp)`` the largest grid λw the quota leaves,

    λw = min(node_cpu, ⌊(quota.cpu − p·λp) / (w · step)⌋ · step)

one evaluation each, vectorised; λp stops at the first grid level at or above the PS's thread
cap, past which every family's PS gains nothing (~7 000 evaluations per job, ~1 ms). The
cheapest configuration reaching a share ``a`` of the best (least CPU, then least memory) takes,
for each ``(w, p, λp)``, the least grid λw whose throughput reaches ``a · best`` (a binary
search, the same monotonicity).

The truths answer one configuration at a time in plain floats (the simulator's hot loop);
:func:`throughput_many` is the same equations on numpy arrays, one per family, checked equal to
``evaluate`` by tests/sim/test_oracle.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.sim.cluster.trace import TraceJob
from dlrover_kfp.sim.cluster.truth import (
    MemoryTruth,
    PsContentionTruth,
    RooflineTruth,
    ThroughputTruth,
    TrainerTruth,
)

Array = npt.NDArray[np.floating[Any]]

#: CPU grid of the search (cores): the smallest pod a spec allows (``spec.MIN_NODE_CPU``) and
#: the step users write. Measured on 100 synthetic jobs per family (seed 7): a 0.25-core grid
#: raises the best by 0.2-0.6 % on average, at most 3.4 % (a job of few pods, where half a core
#: is a large share).
CPU_STEP = 0.5

#: The shares of the best the oracle's cheap configurations reach (the issue's a = 0.9, 0.7).
SHARES = (0.9, 0.7)


@dataclass(frozen=True, slots=True)
class Configuration:
    """A shape and the truth's throughput on it (no stragglers, no hot PS)."""

    workers: NodeGroup
    ps: NodeGroup
    #: samples/s of all workers together, on the truth
    throughput: float

    @property
    def cpu(self) -> float:
        return self.workers.total_cpu + self.ps.total_cpu

    @property
    def memory_mb(self) -> int:
        return self.workers.total_memory_mb + self.ps.total_memory_mb


@dataclass(frozen=True, slots=True)
class OracleAnswer:
    """The best configuration in quota, and the cheapest reaching each share of it."""

    best: Configuration
    #: ``(share, cheapest configuration whose throughput >= share x best)``, per share asked
    cheapest: tuple[tuple[float, Configuration], ...]

    def at(self, share: float) -> Configuration:
        for a, config in self.cheapest:
            if a == share:
                return config
        raise KeyError(f"share {share:g} was not searched (searched {self.shares})")

    @property
    def shares(self) -> tuple[float, ...]:
        return tuple(a for a, _ in self.cheapest)


# -- the truths on arrays --------------------------------------------------------------------


def _closed_loop_step(a: Array, wait: Array, busy: Array, workers: Array) -> Array:
    """:func:`~dlrover_kfp.sim.cluster.truth.closed_loop_step` on arrays: the larger root of
    T² − (a + w·busy + wait)·T + a·w·busy = 0."""
    b = a + workers * busy + wait
    return 0.5 * (b + np.sqrt(b * b - 4.0 * a * workers * busy))


def throughput_many(
    truth: ThroughputTruth, w: Array, p: Array, lw: Array, lp: Array, batch: int
) -> Array:
    """Samples/s of configurations ``(w, p, λw, λp)`` (arrays of one shape, all ≥ 1 worker,
    ≥ 1 PS, CPU > 0): the truth's ``evaluate`` equations (truth.py), element-wise."""
    if isinstance(truth, PsContentionTruth):
        ew = np.minimum(lw, truth.worker_threads)
        ep = np.minimum(lp, truth.ps_threads)
        t_compute = truth.compute * batch / ew**0.9
        a = truth.base + t_compute + truth.rtt * (w / p) ** 1.3 + truth.fanout * p
        s = truth.ps_cost * batch / (p * ep)
        return w * batch / _closed_loop_step(a, s, s, w)
    if isinstance(truth, RooflineTruth):
        work = truth.compute * batch
        t_compute = work * (truth.serial / np.minimum(lw, 1.0) + (1.0 - truth.serial) / lw)
        t_network = truth.wire * batch * np.maximum(w / p, 1.0)
        a = truth.base + np.maximum(t_compute, t_network) + truth.fanout * np.log2(p)
        s = truth.ps_cost * batch / (p * np.minimum(lp, truth.ps_threads))
        return w * batch / _closed_loop_step(a, s, s, w)
    if isinstance(truth, TrainerTruth):
        work = truth.compute * batch
        threads = np.maximum(1.0, np.minimum(lw, truth.worker_threads))
        above = work * (truth.serial + (1.0 - truth.serial) / threads)
        below = work / np.minimum(lw, 1.0) ** truth.alpha
        t_compute = np.where(lw <= 1.0, below, above)
        busy = truth.ps_work * batch / (p * np.minimum(lp, truth.ps_threads))
        step = _closed_loop_step(truth.base + t_compute, truth.critical * busy, busy, w)
        return w * batch / step
    raise TypeError(f"no array form for truth family {type(truth).__name__}")


# -- memory -----------------------------------------------------------------------------------


def worker_need_mb(memory: MemoryTruth) -> int:
    """MiB a worker pod must request: the truth's worker memory (constant over the job)."""
    return math.ceil(memory.worker_mb - 1e-9)


def ps_need_mb(memory: MemoryTruth, ps: int, *, snapshot: bool) -> int:
    """MiB every PS pod of ``ps`` must request: the largest PS's use at the end of the job (the
    peak), with the snapshot buffer's share when the runtime keeps one."""
    return math.ceil(memory.ps_used_mb(1.0, ps, 0, snapshot=snapshot) - 1e-9)


# -- the search -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Frontier:
    """Every ``(w, p, λp)`` in quota with the most grid λw the CPU quota leaves, evaluated."""

    w: Array
    p: Array
    lp: Array
    #: the most grid steps of λw (λw = k · step)
    k_max: Array
    x: Array
    worker_mb: int
    ps_mb: dict[int, int]


def _frontier(
    job: TraceJob, node_cpu: float, node_memory_mb: float, snapshot: bool, step: float
) -> _Frontier | None:
    quota, bounds, memory = job.quota, job.spec.elastic, job.truth.memory
    worker_mb = worker_need_mb(memory)
    ps_mb = {
        p: ps_need_mb(memory, p, snapshot=snapshot) for p in range(bounds.min_ps, bounds.max_ps + 1)
    }
    levels = int(node_cpu / step + 1e-9)  # grid steps a pod may have: λ = k · step, k ≤ this
    # Every family's PS keeps at most ps_threads cores busy (ep = min(λp, ps_threads)): a PS
    # core past the first grid level at or above it buys nothing and takes one from the
    # workers, so the search stops there (4-20 levels of the node's 128).
    ps_levels = min(levels, math.ceil(job.truth.throughput.ps_threads / step - 1e-9))
    if worker_mb > node_memory_mb or levels < 1:
        return None
    pairs = [
        (w, p)
        for p, pm in ps_mb.items()
        if pm <= node_memory_mb
        for w in range(bounds.min_workers, bounds.max_workers + 1)
        if w * worker_mb + p * pm <= quota.memory
    ]
    if not pairs:
        return None
    wp = np.asarray(pairs, dtype=np.float64)
    # λp from one step up to what leaves the workers one step each: p·λp ≤ quota.cpu − w·step
    lp_steps = np.minimum(
        np.floor((quota.cpu - wp[:, 0] * step) / (wp[:, 1] * step) + 1e-9), ps_levels
    )
    counts = np.maximum(lp_steps, 0).astype(np.int64)
    if not counts.any():
        return None
    pair = np.repeat(np.arange(len(pairs)), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    lp = step * (np.arange(len(pair)) - starts + 1)
    w, p = wp[pair, 0], wp[pair, 1]
    # λw = min(node_cpu, ⌊(quota.cpu − p·λp) / (w·step)⌋ · step), at least one step (above)
    k_max = np.minimum(np.floor((quota.cpu - p * lp) / (w * step) + 1e-9), levels)
    x = throughput_many(job.truth.throughput, w, p, k_max * step, lp, job.spec.training.batch_size)
    return _Frontier(w, p, lp, k_max, x, worker_mb, ps_mb)


def _configuration(f: _Frontier, i: int, lw: float, x: float) -> Configuration:
    w, p = int(f.w[i]), int(f.p[i])
    return Configuration(
        workers=NodeGroup(count=w, cpu=lw, memory_mb=f.worker_mb),
        ps=NodeGroup(count=p, cpu=float(f.lp[i]), memory_mb=f.ps_mb[p]),
        throughput=x,
    )


def best_throughput(
    job: TraceJob,
    node_cpu: float,
    node_memory_mb: float,
    *,
    snapshot: bool,
    step: float = CPU_STEP,
) -> float | None:
    """The most samples/s any configuration in ``job``'s quota reaches on its truth; None if no
    configuration fits (the quota is below the truth's memory for one worker and one PS)."""
    f = _frontier(job, node_cpu, node_memory_mb, snapshot, step)
    return None if f is None else float(f.x.max())


def _cheapest(f: _Frontier, job: TraceJob, target: float, step: float) -> Configuration:
    """The least-CPU (then least-memory) configuration whose throughput reaches ``target``: for
    each frontier point that reaches it, the least grid λw that still does (binary search: X
    never falls as λw grows)."""
    reach = f.x >= target
    w, p, lp = f.w[reach], f.p[reach], f.lp[reach]
    lo = np.ones_like(w)
    hi = f.k_max[reach].copy()
    truth, batch = job.truth.throughput, job.spec.training.batch_size
    while (lo < hi).any():
        mid = np.floor((lo + hi) / 2)
        ok = throughput_many(truth, w, p, mid * step, lp, batch) >= target
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid + 1)
    lw = lo * step
    x = throughput_many(truth, w, p, lw, lp, batch)
    cpu = w * lw + p * lp
    mem = w * f.worker_mb + p * np.array([f.ps_mb[int(n)] for n in p], dtype=np.float64)
    i = int(np.lexsort((-x, mem, cpu))[0])  # least CPU, then memory, then the faster
    indices = np.flatnonzero(reach)
    return _configuration(f, int(indices[i]), float(lw[i]), float(x[i]))


def oracle(
    job: TraceJob,
    node_cpu: float,
    node_memory_mb: float,
    *,
    snapshot: bool,
    shares: tuple[float, ...] = SHARES,
    step: float = CPU_STEP,
) -> OracleAnswer | None:
    """The best configuration in ``job``'s quota on its truth, and for each share ``a`` in
    ``shares`` the cheapest one (least CPU, then memory) with throughput ≥ a · best; None if no
    configuration fits. ``snapshot``: the runtime keeps flash-checkpoint snapshots (the
    elastic ones), which the PS memory must hold."""
    f = _frontier(job, node_cpu, node_memory_mb, snapshot, step)
    if f is None:
        return None
    i = int(np.argmax(f.x))
    best = _configuration(f, i, float(f.k_max[i] * step), float(f.x[i]))
    cheapest = tuple((a, _cheapest(f, job, a * best.throughput, step)) for a in shares)
    return OracleAnswer(best=best, cheapest=cheapest)


__all__ = [
    "CPU_STEP",
    "SHARES",
    "Configuration",
    "OracleAnswer",
    "best_throughput",
    "oracle",
    "ps_need_mb",
    "throughput_many",
    "worker_need_mb",
]
