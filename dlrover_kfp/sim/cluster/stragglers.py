"""Per-worker slowdowns drawn from real mini-batch times of Alibaba PAI jobs.

The data (``dlrover_kfp/sim/data``, CC BY 4.0, Alibaba Group; see its README) holds two kinds
of measurements, both of jobs with 10 workers:

* three jobs' per-worker mini-batch times, every 10th iteration (``pai_minibatch_time_job*``):
  job 1 gets a straggler (worker 6) in the middle of training, job 2 has stable but unequal
  workers, job 3 several slightly slow workers;
* the coefficient of variation (CoV: population standard deviation / mean) of the mini-batch
  time across the 10 workers, per iteration, of 100 jobs (``pai_minibatch_cov.csv``).

How the numbers come from the data:

**Persistent imbalance** (the *pattern* of a job file). For each worker, the median of its
mini-batch times over the whole job; divided by the median of those 10 medians. Job 1 gives
1.11, 1.10, 1.09, 1.00, ..., job 2 up to 1.08, job 3 up to 1.10: workers of one job differ by
up to ~10 % for the whole run.

**Stragglers** (from the CoV file). A job's typical spread is the median of its per-iteration
CoV. If that spread came from one slow worker among N = 10 others at speed 1, its slowdown s
would satisfy CoV = (s − 1)·√(N−1) / (N − 1 + s), that is

    s = 1 + CoV · N / (√(N−1) − CoV)            (capped at MAX_SLOWDOWN = 5)

This single-straggler reading matches the job files: in job 1, at the iterations where worker
6 is slow, the formula applied to that iteration's CoV gives 1.75 / 1.97 / 2.02 / 2.39 where
worker 6 measures 1.74 / 1.93 / 2.00 / 2.35 times the median. Over the 100 jobs: 49 % have
s > 1.3, 39 % > 1.5, 31 % > 2, 13 % reach the cap of 5.

:meth:`StragglerModel.slowdown_factors` gives a job's workers their persistent imbalance in
blocks of 10 (the size of the measured jobs): each block is a random job file's pattern
(floored at 1: only slowdowns matter), shuffled. The simulator draws it once per job and keeps
each worker slot's factor through restarts and resizes. Heavy stragglers are episodes
(below), for a share of jobs set in the simulator's fault settings; the CoV file's single-
straggler reading (:meth:`StragglerModel.straggler_share`) is kept as a reference for that
share, not drawn per block (an earlier version did, and gave every static job its slowest
worker's pace at up to 5x, redrawn at each restart).

**Episodes** (:meth:`StragglerModel.episode`: a worker that turns slow mid-training, for a
while). From job 1's worker 6: its ratio to the median of all workers at each sampled
iteration; the episode is the longest run of samples above EPISODE_THRESHOLD (1.15) with gaps of
at most EPISODE_GAP (2) samples below it: iterations 1811-1950 of 1-2988. So it starts at 61 %
of the job, lasts 4.7 % of it, and the worker is on average 1.50x slower meanwhile (the mean of
its 14 sampled ratios, 1.0-2.35: it is not uniformly slow). The data holds one such episode, so
a draw varies it: the onset by ±0.25 of the job around the observed one (clipped to 0.05-0.95:
"in the middle of training"), the duration by a log-uniform factor in 0.5-2, the slowdown as the
mean of a bootstrap resample of the 14 observed ratios.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

from dlrover_kfp.errors import UserInputError

#: The largest slowdown a draw gives (the CoV formula diverges as CoV -> √(N−1)).
MAX_SLOWDOWN = 5.0
#: A sample belongs to an episode when the worker is this much slower than the median.
EPISODE_THRESHOLD = 1.15
#: Samples below the threshold that may interrupt an episode.
EPISODE_GAP = 2
#: Spread of a drawn episode around the observed one.
ONSET_SPREAD = 0.25
ONSET_RANGE = (0.05, 0.95)
DURATION_SPREAD = 2.0

_PACKAGE = "dlrover_kfp.sim"
JOB_FILES = (
    "pai_minibatch_time_job1.csv",
    "pai_minibatch_time_job2.csv",
    "pai_minibatch_time_job3.csv",
)
COV_FILE = "pai_minibatch_cov.csv"
_JOB_HEADER = ["", "worker", "gpu", "time", "batch_time_norm"]

#: Per-iteration mini-batch times of one job: time -> worker -> normalised batch time.
BatchTimes = dict[int, dict[int, float]]


def straggler_slowdown(cov: float, workers: int = 10) -> float:
    """Slowdown of one straggler among ``workers`` equal others that gives the CoV ``cov``
    (population standard deviation / mean), capped at :data:`MAX_SLOWDOWN`."""
    root = math.sqrt(workers - 1)
    if cov <= 0.0:
        return 1.0
    if cov >= root:
        return MAX_SLOWDOWN
    return min(MAX_SLOWDOWN, 1.0 + cov * workers / (root - cov))


def parse_batch_times(text: str, source: str) -> BatchTimes:
    """A job file (``,worker,gpu,time,batch_time_norm``) as time -> worker -> batch time."""
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    if header != _JOB_HEADER:
        raise UserInputError(f"{source}:1: expected the columns {','.join(_JOB_HEADER)}")
    times: BatchTimes = {}
    for number, row in enumerate(rows, start=2):
        if not row:
            continue
        try:
            worker, time, value = int(row[1]), int(row[3]), float(row[4])
        except (IndexError, ValueError):
            raise UserInputError(f"{source}:{number}: malformed row {row!r}") from None
        if not value > 0 or not math.isfinite(value):
            raise UserInputError(f"{source}:{number}: batch_time_norm: must be > 0 (got {value})")
        times.setdefault(time, {})[worker] = value
    if not times:
        raise UserInputError(f"{source}: no rows")
    return times


def parse_cov(text: str, source: str) -> list[list[float]]:
    """The CoV file: per job (row), the CoV of every iteration it has (empty cells end it)."""
    jobs: list[list[float]] = []
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if number == 1 or not row:
            continue
        try:
            values = [float(cell) for cell in row[1:] if cell != ""]
        except ValueError:
            raise UserInputError(f"{source}:{number}: a CoV is not a number") from None
        if not values or any(not (v >= 0 and math.isfinite(v)) for v in values):
            raise UserInputError(f"{source}:{number}: expected non-negative CoVs")
        jobs.append(values)
    if not jobs:
        raise UserInputError(f"{source}: no jobs")
    return jobs


def worker_pattern(times: BatchTimes) -> tuple[float, ...]:
    """Each worker's median batch time over the job / the median of those medians."""
    per_worker: dict[int, list[float]] = {}
    for by_worker in times.values():
        for worker, value in by_worker.items():
            per_worker.setdefault(worker, []).append(value)
    medians = [statistics.median(per_worker[w]) for w in sorted(per_worker)]
    middle = statistics.median(medians)
    return tuple(m / middle for m in medians)


def find_episode(times: BatchTimes, worker: int) -> tuple[float, float, tuple[float, ...]]:
    """``(onset fraction, duration fraction, ratios)`` of ``worker``'s longest slow episode.

    A sample's ratio is the worker's batch time over the median of all workers at that
    iteration. The episode is the longest run of samples above :data:`EPISODE_THRESHOLD`,
    allowing :data:`EPISODE_GAP` samples below it in between; it lasts from its first sample
    to the sample after its last. ``ratios`` are those of every sample in it.
    """
    stamps = sorted(t for t in times if worker in times[t])
    if len(stamps) < 2:
        raise UserInputError(f"worker {worker}: not enough samples for an episode")
    ratios = [times[t][worker] / statistics.median(times[t].values()) for t in stamps]
    best: tuple[int, int] | None = None
    start = last = -1
    for i, ratio in enumerate(ratios):
        if ratio <= EPISODE_THRESHOLD:
            continue
        if start < 0 or i - last > EPISODE_GAP + 1:
            start = i
        last = i
        if best is None or stamps[last] - stamps[start] > stamps[best[1]] - stamps[best[0]]:
            best = (start, last)
    if best is None:
        raise UserInputError(f"worker {worker}: never slower than {EPISODE_THRESHOLD}x")
    first, end = best
    span = stamps[-1] - stamps[0] + 1
    after = stamps[end + 1] if end + 1 < len(stamps) else stamps[-1] + 1
    return (
        (stamps[first] - stamps[0]) / span,
        (after - stamps[first]) / span,
        tuple(ratios[first : end + 1]),
    )


@dataclass(frozen=True, slots=True)
class StragglerModel:
    """Worker slowdowns drawn from measured jobs (see the module docstring)."""

    #: per measured job: each worker's median batch time / the job's median over workers
    patterns: tuple[tuple[float, ...], ...]
    #: per CoV job: the single-straggler slowdown of its median CoV
    slowdowns: tuple[float, ...]
    #: the observed episode: onset and duration (fractions of the job), per-sample ratios
    episode_onset: float
    episode_duration: float
    episode_ratios: tuple[float, ...]

    @classmethod
    def from_texts(
        cls,
        job_texts: Sequence[tuple[str, str]],
        cov_text: tuple[str, str],
        *,
        episode_job: int = 0,
        episode_worker: int = 6,
    ) -> StragglerModel:
        """From the files' text, each as ``(source name, text)``; the episode is that of
        worker ``episode_worker`` in job file number ``episode_job``."""
        jobs = [parse_batch_times(text, source) for source, text in job_texts]
        if not jobs:
            raise UserInputError("straggler data: no job files")
        covs = parse_cov(cov_text[1], cov_text[0])
        block = len(worker_pattern(jobs[0]))
        onset, duration, ratios = find_episode(jobs[episode_job], episode_worker)
        return cls(
            patterns=tuple(worker_pattern(job) for job in jobs),
            slowdowns=tuple(straggler_slowdown(statistics.median(c), block) for c in covs),
            episode_onset=onset,
            episode_duration=duration,
            episode_ratios=ratios,
        )

    @classmethod
    def from_package(cls) -> StragglerModel:
        """The model of the PAI data shipped with the package (loaded once)."""
        return _packaged()

    def slowdown_factors(self, rng: random.Random, workers: int) -> list[float]:
        """A job's persistent per-worker imbalance (each >= 1: batch time / the typical
        worker's), for worker slots 0 .. ``workers`` - 1.

        Blocks of a measured job's size, each a random job file's pattern floored at 1 and
        shuffled: workers of one job differ by up to ~10 % for the whole run, as measured. A
        caller that keeps the rng's seed per job gets the same factor for the same slot
        however many workers it asks for (the blocks are drawn in order), so restarts and
        resizes do not redraw a worker's pace. A heavy straggler is an :meth:`episode`, not
        part of this pattern.
        """
        out: list[float] = []
        while len(out) < workers:
            block = [max(1.0, r) for r in rng.choice(self.patterns)]
            rng.shuffle(block)
            out.extend(block)
        return out[:workers]

    def straggler_share(self, threshold: float = 1.5) -> float:
        """Share of the CoV jobs whose typical spread reads as a straggler slower than
        ``threshold`` (the single-straggler reading of their median CoV)."""
        return sum(s > threshold for s in self.slowdowns) / len(self.slowdowns)

    def episode(self, rng: random.Random) -> tuple[float, float, float]:
        """``(onset fraction, duration fraction, slowdown)`` of a straggler that appears
        mid-training: the observed episode, varied as the module docstring says."""
        low, high = ONSET_RANGE
        onset = self.episode_onset + rng.uniform(-ONSET_SPREAD, ONSET_SPREAD)
        onset = min(high, max(low, onset))
        duration = self.episode_duration * math.exp(
            rng.uniform(-math.log(DURATION_SPREAD), math.log(DURATION_SPREAD))
        )
        duration = min(duration, 1.0 - onset)
        ratios = self.episode_ratios
        sample = [ratios[rng.randrange(len(ratios))] for _ in ratios]
        factor = min(MAX_SLOWDOWN, max(1.0, sum(sample) / len(sample)))
        return onset, duration, factor


@functools.cache
def _packaged() -> StragglerModel:
    folder = resources.files(_PACKAGE).joinpath("data")

    def read(name: str) -> tuple[str, str]:
        return name, folder.joinpath(name).read_text(encoding="utf-8")

    return StragglerModel.from_texts([read(name) for name in JOB_FILES], read(COV_FILE))
