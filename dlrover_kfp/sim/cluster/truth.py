"""The hidden truth of a simulated job: how fast it trains on a shape, what its pods really use.

A policy never reads these objects; the simulator does, to turn a plan into the throughput and
the per-pod CPU and memory that the job master then observes. They are contracts (frozen,
strict, unknown keys rejected) because they are stored in the trace file next to the job spec.

Three throughput families, told apart by ``family``:

* ``ps-contention`` (:class:`PsContentionTruth`): the form of :mod:`dlrover_kfp.sim.workload`:
  thread caps, sub-linear worker scaling, super-linear PS contention in w/p, a fan-out cost per
  PS. Close to, but not inside, the planner's model form.
* ``roofline`` (:class:`RooflineTruth`): a different shape that the planner's form

      T = θ0 + θ1·B/λw + θ2·(w/p)·B/λp + θ3·(w/p) + θ4·p

  cannot express: a max() of compute and network time (they overlap), Amdahl's law for the
  worker, a per-PS NIC ceiling, a PS queue that blows up as its utilisation nears 1 and a
  log2(p) fan-out.
* ``trainer`` (:class:`TrainerTruth`): the shape of this package's own trainer as measured
  (benchmarks/data/resource_curves_small), fitted by :mod:`.trainer_fit`.

The results run the same trace with each family.

Both answer in plain float arithmetic (the simulator calls them about a million times per run):
``throughput`` in samples/s for all workers together, ``usage`` in cores used per worker and per
PS, never more than requested. ``evaluate`` gives all three from one computation.

Memory (:class:`MemoryTruth`) is not a throughput input, it is a constraint: workers use a
constant amount, the PS hold the embedding rows touched so far, which grow with training
progress and saturate.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Protocol

from pydantic import Field, Strict, model_validator
from pydantic.dataclasses import dataclass

from dlrover_kfp.core.documents import register_union_tags
from dlrover_kfp.core.types import CONTRACT_CONFIG, NonNegFloat, PosFloat

#: Resident memory of a PS process with nothing loaded (MiB): the trainer's measured figure.
RUNTIME_MB = 384

#: A fraction in [0, 1).
Fraction = Annotated[float, Strict(), Field(ge=0, lt=1)]


def closed_loop_step(a: float, wait: float, busy: float, workers: int) -> float:
    """Step time T of ``workers`` workers that each compute for ``a`` seconds, then wait for a
    reply from a PS whose utilisation is ρ = workers · busy / T.

    ``busy`` is the PS time one request occupies (all its work, counted in ρ); ``wait`` the part
    of it the worker waits for (its critical path; the rest, such as applying gradients after
    the reply, runs while the worker computes). M/M/1-like response time::

        T = a + wait / (1 − ρ),  ρ = w · busy / T
        ⇔  T² − (a + w · busy + wait) · T + a · w · busy = 0,  T the larger root

    The larger root exceeds w · busy, so ρ < 1 always: the queue is capped by construction and
    as w grows T → w · busy, the PS's capacity.
    """
    b = a + workers * busy + wait
    return 0.5 * (b + math.sqrt(b * b - 4.0 * a * workers * busy))


class _Evaluates(Protocol):
    def evaluate(
        self, workers: int, ps: int, worker_cpu: float, ps_cpu: float, batch: int
    ) -> tuple[float, float, float]: ...


class _Readings:
    """``throughput`` and ``usage`` of a truth, both read from the ``evaluate`` every truth
    class defines."""

    def throughput(
        self: _Evaluates, workers: int, ps: int, worker_cpu: float, ps_cpu: float, batch: int
    ) -> float:
        """Samples per second of all workers together."""
        return self.evaluate(workers, ps, worker_cpu, ps_cpu, batch)[0]

    def usage(
        self: _Evaluates, workers: int, ps: int, worker_cpu: float, ps_cpu: float, batch: int
    ) -> tuple[float, float]:
        """Cores used per worker and per PS (each at most what the pod requested)."""
        _, worker_used, ps_used = self.evaluate(workers, ps, worker_cpu, ps_cpu, batch)
        return worker_used, ps_used


register_union_tags("ps-contention", "roofline", "trainer")


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class PsContentionTruth(_Readings):
    """Per-worker step time of an asynchronous PS job with thread caps and PS contention.

    With w workers, p PS, λw / λp cores per worker / PS and B samples per worker step::

        ew = min(λw, worker_threads)              cores a worker can keep busy
        ep = min(λp, ps_threads)                  cores a PS can keep busy
        t_compute = compute · B / ew^0.9          sub-linear gain from more worker threads
        A = base + t_compute + rtt · (w/p)^1.3 + fanout · p
        S = ps_cost · B / (p · ep)                one worker's request at one PS (its B/p rows)
        T = A + S / (1 − ρ),  ρ = w · S / T       the PS as a closed-loop queue (closed_loop_step)
        X = w · B / T                             samples/s, all workers together

    A worker waits for its own request and the queue in front of it, S / (1 − ρ), no more: the
    PS's wait is consistent with its utilisation ρ (a PS 20 % busy adds 1.25 S, not w · S).
    Usage is the busy fraction of the step times the cores busy meanwhile::

        worker cores = ew · t_compute / T
        PS cores     = ρ · ep  = ps_cost · X / p   (the PS work rate)
    """

    #: seconds per step that no resource shortens (graph launch, input pipeline)
    base: PosFloat
    #: core-seconds of worker compute per sample (at one core)
    compute: PosFloat
    #: threads a worker can keep busy; CPU beyond this is wasted
    worker_threads: PosFloat
    #: core-seconds of PS work per sample, all PS together (split evenly across them)
    ps_cost: PosFloat
    #: threads a PS can keep busy
    ps_threads: PosFloat
    #: seconds of round trips per step at w/p = 1, growing as (w/p)^1.3 (contention)
    rtt: NonNegFloat
    #: seconds per step per PS (a worker talks to every PS)
    fanout: NonNegFloat
    family: Literal["ps-contention"] = "ps-contention"

    def evaluate(
        self, workers: int, ps: int, worker_cpu: float, ps_cpu: float, batch: int
    ) -> tuple[float, float, float]:
        """``(samples/s, cores used per worker, cores used per PS)``; zeros if nothing runs."""
        if workers < 1 or ps < 1 or worker_cpu <= 0 or ps_cpu <= 0:
            return 0.0, 0.0, 0.0
        ew = worker_cpu if worker_cpu < self.worker_threads else self.worker_threads
        ep = ps_cpu if ps_cpu < self.ps_threads else self.ps_threads
        ratio = workers / ps
        t_compute = self.compute * batch / ew**0.9
        a = self.base + t_compute + self.rtt * ratio**1.3 + self.fanout * ps
        s = self.ps_cost * batch / (ps * ep)
        step = closed_loop_step(a, s, s, workers)
        return workers * batch / step, ew * t_compute / step, workers * s * ep / step


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class RooflineTruth(_Readings):
    """Per-worker step time as a roofline (compute and network overlap) plus a PS queue.

    With w workers, p PS, λw / λp cores per worker / PS and B samples per worker step::

        t_compute = compute · B · (σ / min(1, λw) + (1 − σ) / λw)
                    Amdahl: the serial fraction σ runs on one core, the rest on λw cores
        t_network = wire · B · max(1, w/p)
                    the worker's own NIC moves B samples' rows in wire · B seconds; each PS
                    NIC is shared by w/p workers, so beyond w = p the PS side is the ceiling
        A = base + max(t_compute, t_network) + fanout · log2(p)
        ep = min(λp, ps_threads)
        S = ps_cost · B / (p · ep)          service time of one worker's request at one PS
        ρ = w · S / T                       PS utilisation: w requests per step, S each
        T = A + S / (1 − ρ)                 M/M/1-like response time of the PS

    The last two lines are a closed loop (a worker waits for its reply before its next step),
    solved exactly: T is the larger root of T² − (A + (w+1)·S)·T + A·w·S = 0. So ρ < 1 always
    and the queue is capped by construction: as w grows, T → w·S and X → p·ep / ps_cost, the
    PS set's capacity. X = w · B / T.

    Usage: worker cores = compute · B / T (the work rate: busy fraction t_compute / T times
    the cores busy meanwhile, compute · B / t_compute ≤ λw); PS cores = ρ · ep.
    """

    #: seconds per step that no resource shortens
    base: PosFloat
    #: core-seconds of worker compute per sample
    compute: PosFloat
    #: Amdahl serial fraction σ of the worker's compute
    serial: Fraction
    #: seconds one sample's embedding traffic (pull and push) takes on one NIC
    wire: PosFloat
    #: core-seconds of PS work per sample, all PS together (split evenly across them)
    ps_cost: PosFloat
    #: threads a PS can keep busy
    ps_threads: PosFloat
    #: seconds per step per doubling of the PS count (tree fan-out of requests)
    fanout: NonNegFloat
    family: Literal["roofline"] = "roofline"

    def evaluate(
        self, workers: int, ps: int, worker_cpu: float, ps_cpu: float, batch: int
    ) -> tuple[float, float, float]:
        """``(samples/s, cores used per worker, cores used per PS)``; zeros if nothing runs."""
        if workers < 1 or ps < 1 or worker_cpu <= 0 or ps_cpu <= 0:
            return 0.0, 0.0, 0.0
        serial_speed = worker_cpu if worker_cpu < 1.0 else 1.0
        work = self.compute * batch
        t_compute = work * (self.serial / serial_speed + (1.0 - self.serial) / worker_cpu)
        ratio = workers / ps
        t_network = self.wire * batch * (ratio if ratio > 1.0 else 1.0)
        a = self.base + (t_compute if t_compute > t_network else t_network)
        a += self.fanout * math.log2(ps)
        ep = ps_cpu if ps_cpu < self.ps_threads else self.ps_threads
        s = self.ps_cost * batch / (ps * ep)
        step = closed_loop_step(a, s, s, workers)
        return workers * batch / step, work / step, workers * s * ep / step


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class TrainerTruth(_Readings):
    """The shape this package's own trainer was measured to have (benchmarks/data/), at the
    scale of a cluster job (:mod:`.trainer_fit` says what is measured and what is assumed).

    With w workers, p PS, λw / λp cores per worker / PS and B samples per worker step::

        speed(λw) = λw^alpha                          λw <= 1: a CPU quota below one core is
                                                      throttled in periods (measured alpha > 1)
                  = 1 / (σ + (1 − σ) / min(λw, threads))   above one core: Amdahl (assumed)
        t_compute = compute · B / speed(λw)
        A = base + t_compute
        ep = min(λp, ps_threads)
        busy = ps_work · B / (p · ep)                 PS time one request occupies
        wait = critical · busy                        the part the worker waits for (measured:
                                                      the PS applies gradients after replying)
        T = A + wait / (1 − ρ),  ρ = w · busy / T     closed loop (closed_loop_step)
        X = w · B / T

    Usage: worker cores = λw · t_compute / T below one core (busy while computing), compute ·
    B / T above (the work rate); PS cores = ρ · ep.
    """

    #: seconds per step that no resource shortens
    base: NonNegFloat
    #: core-seconds of worker compute per sample at one core
    compute: PosFloat
    #: exponent of the speed below one core
    alpha: PosFloat
    #: Amdahl serial fraction above one core
    serial: Fraction
    #: threads a worker can keep busy
    worker_threads: PosFloat
    #: core-seconds of PS work per sample, all PS together (split evenly across them)
    ps_work: PosFloat
    #: share of a request's PS work that the worker waits for
    critical: Annotated[float, Strict(), Field(ge=0, le=1)]
    #: threads a PS can keep busy
    ps_threads: PosFloat
    family: Literal["trainer"] = "trainer"

    def evaluate(
        self, workers: int, ps: int, worker_cpu: float, ps_cpu: float, batch: int
    ) -> tuple[float, float, float]:
        """``(samples/s, cores used per worker, cores used per PS)``; zeros if nothing runs."""
        if workers < 1 or ps < 1 or worker_cpu <= 0 or ps_cpu <= 0:
            return 0.0, 0.0, 0.0
        work = self.compute * batch
        if worker_cpu <= 1.0:
            t_compute = work / worker_cpu**self.alpha
            used = worker_cpu * t_compute
        else:
            threads = worker_cpu if worker_cpu < self.worker_threads else self.worker_threads
            t_compute = work * (self.serial + (1.0 - self.serial) / max(1.0, threads))
            used = work
        a = self.base + t_compute
        ep = ps_cpu if ps_cpu < self.ps_threads else self.ps_threads
        busy = self.ps_work * batch / (ps * ep)
        step = closed_loop_step(a, self.critical * busy, busy, workers)
        return workers * batch / step, used / step, workers * busy * ep / step


ThroughputTruth = Annotated[
    PsContentionTruth | RooflineTruth | TrainerTruth, Field(discriminator="family")
]


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class MemoryTruth:
    """Memory a job's pods really use (MiB).

    Workers use ``worker_mb`` each, whatever the progress. The PS together hold the embedding
    rows touched so far; with training progress f in [0, 1]::

        total(f) = ps_start_mb + (ps_end_mb − ps_start_mb) · (1 − e^(−k·f)) / (1 − e^(−k))

    (fast growth early, as new ids keep arriving, saturating as the tables fill). Each PS adds
    the process runtime (RUNTIME_MB). PS 0 holds ``1 + imbalance`` times its even share (a hot
    shard), the other PS split the rest evenly.
    """

    #: MiB used by each worker, constant
    worker_mb: PosFloat
    #: MiB held by all PS together at the start of training (progress 0), runtime excluded
    ps_start_mb: NonNegFloat
    #: MiB held by all PS together at the end of training (progress 1), runtime excluded
    ps_end_mb: NonNegFloat
    #: how fast the rows touched saturate (larger: earlier)
    k: PosFloat = 3.0
    #: PS 0 holds (1 + imbalance) × its even share
    imbalance: NonNegFloat = 0.0
    #: MiB a flash checkpoint's snapshot buffer takes, all PS together (sized at PS start for
    #: every row; only runtimes that keep one, the elastic ones, hold it)
    snapshot_mb: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _grows(self) -> MemoryTruth:
        if self.ps_end_mb < self.ps_start_mb:
            raise ValueError(
                f"ps_end_mb: {self.ps_end_mb:g} is below ps_start_mb {self.ps_start_mb:g} "
                "(PS memory only grows)"
            )
        return self

    def ps_total_mb(self, progress: float) -> float:
        """MiB of state held by all PS together at ``progress`` (0..1), runtime excluded."""
        f = 0.0 if progress < 0.0 else min(progress, 1.0)
        grown = -math.expm1(-self.k * f) / -math.expm1(-self.k)
        return self.ps_start_mb + (self.ps_end_mb - self.ps_start_mb) * grown

    def ps_used_mb(
        self, progress: float, ps_count: int, index: int = 0, *, snapshot: bool = False
    ) -> float:
        """MiB used by PS ``index`` (0: the largest one) of ``ps_count``, runtime included,
        and its even share of the snapshot buffer if ``snapshot``."""
        total = self.ps_total_mb(progress)
        extra = RUNTIME_MB + (self.snapshot_mb / max(1, ps_count) if snapshot else 0.0)
        if ps_count <= 1:
            return extra + total
        first = min(total, (1.0 + self.imbalance) * total / ps_count)
        share = first if index == 0 else (total - first) / (ps_count - 1)
        return extra + share

    def ps_peak_mb(self, ps_count: int) -> float:
        """MiB the largest PS of ``ps_count`` uses at the end of training."""
        return self.ps_used_mb(1.0, ps_count)


@dataclass(frozen=True, kw_only=True, config=CONTRACT_CONFIG)
class JobTruth:
    """Everything the simulator knows about a job and its policies do not."""

    throughput: ThroughputTruth
    memory: MemoryTruth
