"""What runtime samples say: throughput per configuration, and how much of its CPU a role uses."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence

from dlrover_kfp.core.observation import Config, Observation
from dlrover_kfp.core.profile import RuntimeSample


def config_of(sample: RuntimeSample) -> Config:
    return Config(sample.workers, sample.ps, sample.worker_cpu, sample.ps_cpu)


def observations_from_samples(
    samples: Sequence[RuntimeSample], batch_size: int
) -> tuple[Observation, ...]:
    """Mean throughput and mean CPU used per pod, per distinct configuration, in order of
    first appearance. Samples with no throughput (start-up, a stalled job) say nothing about
    speed and are left out."""
    by_config: dict[Config, list[RuntimeSample]] = defaultdict(list)
    for s in samples:
        if s.throughput > 0 and s.workers > 0 and s.ps > 0:
            by_config[config_of(s)].append(s)
    result = []
    for config, group in by_config.items():
        w_used = [n.cpu_used for s in group for n in s.nodes if n.role == "worker"]
        p_used = [n.cpu_used for s in group for n in s.nodes if n.role == "ps"]
        result.append(
            Observation(
                config=config,
                batch_size=batch_size,
                throughput=statistics.fmean(s.throughput for s in group),
                worker_cpu_used=statistics.fmean(w_used) if w_used else None,
                ps_cpu_used=statistics.fmean(p_used) if p_used else None,
            )
        )
    return tuple(result)


def settled(samples: Sequence[RuntimeSample]) -> list[RuntimeSample]:
    """Of one shape's samples (from the start of its pods, or of its change, on), those that
    tell its steady speed.

    Until the first report of trained rows the pods are starting, and the first sample with
    progress is partial: both are left out. A pod the change replaced can still report its
    last shard just after the change; that progress is followed by the new pods' start-up
    (samples without progress) and then their own first, partial, report. Progress at the
    head followed by a pause is therefore the replaced pod's: the shape settles only after the
    next report (a CI run judged a scale-out on six start-up samples that followed such a
    report, measured -100%, and rolled it back). A pause after the shape has reported twice
    in a row is the shape's own and stays."""
    first = next((i for i, x in enumerate(samples) if x.throughput > 0), None)
    if first is None:
        return []
    second = next((i for i in range(first + 1, len(samples)) if samples[i].throughput > 0), None)
    if second is None:
        return []
    start = first if second == first + 1 else second
    return list(samples[start + 1 :])


def failed_moves(samples: Sequence[RuntimeSample]) -> tuple[tuple[Config, Config], ...]:
    """``(base, failed)`` for each move the job made from ``base`` to ``failed`` and then left
    for a configuration it had run with before: a step rolled back (or a probe undone), in the
    order they were made.

    In the sequence of configurations c0, c1, c2, ... (runs of equal ones merged), the move
    c(i-1) -> ci failed when c(i+1) is one of c0 .. c(i-1).
    """
    runs: list[Config] = []
    for x in samples:
        if x.workers > 0 and x.ps > 0:
            c = config_of(x)
            if not runs or runs[-1] != c:
                runs.append(c)
    return tuple((runs[i - 1], runs[i]) for i in range(1, len(runs) - 1) if runs[i + 1] in runs[:i])


def abandoned_configs(samples: Sequence[RuntimeSample]) -> frozenset[Config]:
    """Configurations the job ran with and then left for one it had run with before: where
    :func:`failed_moves` went. Measurement judged them once; proposing them again on the
    strength of the model, whose prediction they already failed, is thrashing."""
    return frozenset(failed for _, failed in failed_moves(samples))


def cores_per_sample(
    observations: Sequence[Observation], role: str, gamma: float = 1.0
) -> float | None:
    """Core-seconds the pods of ``role`` spend per sample, all of them together, the largest
    seen: c = max(n · u / X) over the observations (n pods each using u cores at X samples/s).
    None when no observation says.

    The work per sample is what a role's cores must keep up with whatever their number and
    size (search.CpuBounds); the largest reading is kept because averages understate bursts.
    ``gamma``: for the PS, each reading divided by ``(w/p)^(γ−1)``, the units of the model's PS
    coefficient at contention exponent γ (perf_model's usage bound); 1 leaves it as it is.
    """
    ratios = []
    for o in observations:
        c = o.config
        n, used = (c.workers, o.worker_cpu_used) if role == "worker" else (c.ps, o.ps_cpu_used)
        if used is not None and o.throughput > 0:
            ratio = n * used / o.throughput
            if role == "ps" and gamma != 1.0:
                ratio /= (c.workers / c.ps) ** (gamma - 1.0)
            ratios.append(ratio)
    return max(ratios) if ratios else None


def peak_memory_mb(samples: Sequence[RuntimeSample], role: str) -> int:
    return max((n.memory_used_mb for s in samples for n in s.nodes if n.role == role), default=0)


def cpu_saturation(
    observations: Sequence[Observation], min_gain: float
) -> tuple[float | None, float | None]:
    """Per-pod CPU beyond which a role was *measured* to gain nothing: (worker cap, PS cap).

    Two configurations with the same pod counts, the second with at least as much CPU per
    pod in both roles and more in one or both, whose throughput differs by less than
    ``min_gain``: the extra cores bought nothing, so the role (or both) is saturated at the
    lower value (a thread limit, a bottleneck elsewhere). Unlike average use, which understates
    bursts, this is a measurement of the very thing the planner wants to know.
    """
    caps: list[float | None] = [None, None]
    for a in observations:
        for b in observations:
            ca, cb = a.config, b.config
            if (ca.workers, ca.ps) != (cb.workers, cb.ps):
                continue
            more_w, more_p = cb.worker_cpu > ca.worker_cpu, cb.ps_cpu > ca.ps_cpu
            if not (more_w or more_p) or cb.worker_cpu < ca.worker_cpu or cb.ps_cpu < ca.ps_cpu:
                continue
            if b.throughput >= a.throughput * (1 + min_gain):
                continue
            for i, (more, value) in enumerate(((more_w, ca.worker_cpu), (more_p, ca.ps_cpu))):
                current = caps[i]
                if more and (current is None or value < current):
                    caps[i] = value
    return caps[0], caps[1]


def capped_observations(
    observations: Sequence[Observation], worker_cap: float | None, ps_cap: float | None
) -> tuple[Observation, ...]:
    """Observations with per-pod CPU cut to the measured saturation points, so that the model
    does not credit cores that were shown to buy nothing."""
    if worker_cap is None and ps_cap is None:
        return tuple(observations)
    out = []
    for o in observations:
        c = o.config
        lw = c.worker_cpu if worker_cap is None else min(c.worker_cpu, worker_cap)
        lp = c.ps_cpu if ps_cap is None else min(c.ps_cpu, ps_cap)
        out.append(
            Observation(
                Config(c.workers, c.ps, lw, lp),
                o.batch_size,
                o.throughput,
                o.worker_cpu_used,
                o.ps_cpu_used,
            )
        )
    return tuple(out)
