"""A finished job reduced to what planning needs: its features, what it was given, what it used.

The history store keeps one summary row per profile, so that warm start over thousands of jobs
reads a few numbers per job instead of parsing every profile.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from datetime import UTC, datetime

from dlrover_kfp.core.observation import Observation
from dlrover_kfp.core.plan import NodeGroup
from dlrover_kfp.core.profile import JobProfile, RuntimeSample
from dlrover_kfp.core.usage import observations_from_samples


@dataclass(frozen=True, slots=True)
class JobSummary:
    run_id: str
    name: str
    scenario: str | None
    model_signature: str
    dataset_rows: int
    batch_size: int
    started_at: float  # epoch seconds (UTC)
    status: str  # succeeded | failed | cancelled
    jct_seconds: float
    samples_processed: int
    #: what it ran with at the end (the last applied plan, else the last sample's shape)
    workers: NodeGroup
    ps: NodeGroup
    #: what it used: maxima over samples and pods of each role (cores, MiB); CPU over the
    #: samples in which it trained (see :func:`summarize`)
    peak_worker_cpu: float
    peak_worker_memory_mb: int
    peak_ps_cpu: float
    peak_ps_memory_mb: int
    #: maxima over samples of the role's total (all pods together)
    peak_total_ps_cpu: float
    peak_total_ps_memory_mb: int
    #: mean over samples of the mean per pod
    mean_worker_cpu: float
    mean_ps_cpu: float
    oom_events: int
    #: mean throughput per distinct configuration the job ran at
    observations: tuple[Observation, ...]

    @property
    def has_usage(self) -> bool:
        return self.peak_worker_cpu > 0 or self.peak_ps_cpu > 0


def parse_timestamp(text: str) -> float:
    """ISO 8601 text to epoch seconds; a time without zone is taken as UTC."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def format_timestamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def _final_groups(profile: JobProfile) -> tuple[NodeGroup, NodeGroup]:
    if profile.plans:
        last = profile.plans[-1]
        return last.workers, last.ps
    req = profile.job.resources
    if req is not None and req.workers is not None and req.ps is not None:
        return req.workers.to_group(), req.ps.to_group()
    if profile.samples:
        s = profile.samples[-1]
        return _group_from_sample(s, "worker"), _group_from_sample(s, "ps")
    empty = NodeGroup(count=0, cpu=0.0, memory_mb=0)
    return empty, empty


def _group_from_sample(sample: RuntimeSample, role: str) -> NodeGroup:
    nodes = [n for n in sample.nodes if n.role == role]
    count = sample.workers if role == "worker" else sample.ps
    cpu = sample.worker_cpu if role == "worker" else sample.ps_cpu
    memory = max((n.memory_requested_mb for n in nodes), default=0)
    return NodeGroup(count=count, cpu=cpu, memory_mb=memory)


def cpu_utilisation(profile: JobProfile) -> float | None:
    """Cores used / cores requested, summed over every sample and pod of the run; None without
    any sample (the quickstart's table, the run report and the scenario page all show it)."""
    used = math.fsum(n.cpu_used for s in profile.samples for n in s.nodes)
    given = math.fsum(n.cpu_requested for s in profile.samples for n in s.nodes)
    return used / given if given > 0 else None


def summarize(profile: JobProfile) -> JobSummary:
    """Reduce a profile to its planning summary (pure; the store calls it on every record)."""
    workers, ps = _final_groups(profile)
    peak = {"worker": [0.0, 0], "ps": [0.0, 0]}
    peak_total_ps_cpu, peak_total_ps_mem = 0.0, 0
    means: dict[str, list[float]] = {"worker": [], "ps": []}
    # CPU is what training used: a window without progress is start-up (imports, the first rows
    # read) or a pause, where a pod burns its whole quota or none, which says nothing about
    # what it needs to train. Memory counts everywhere: a pod must fit its start-up too.
    training = any(s.throughput > 0 for s in profile.samples)
    for s in profile.samples:
        counts_cpu = s.throughput > 0 or not training
        total_cpu, total_mem = 0.0, 0
        per_role: dict[str, list[float]] = {"worker": [], "ps": []}
        for n in s.nodes:
            slot = peak[n.role]
            slot[1] = max(slot[1], n.memory_used_mb)
            if n.role == "ps":
                total_mem += n.memory_used_mb
            if not counts_cpu:
                continue
            slot[0] = max(slot[0], n.cpu_used)
            per_role[n.role].append(n.cpu_used)
            if n.role == "ps":
                total_cpu += n.cpu_used
        for role, used in per_role.items():
            if used:
                means[role].append(statistics.fmean(used))
        peak_total_ps_cpu = max(peak_total_ps_cpu, total_cpu)
        peak_total_ps_mem = max(peak_total_ps_mem, total_mem)
    job = profile.job
    return JobSummary(
        run_id=profile.run_id,
        name=job.name,
        scenario=job.scenario,
        model_signature=job.model.signature(),
        dataset_rows=job.data.rows,
        batch_size=job.training.batch_size,
        started_at=parse_timestamp(profile.started_at),
        status=profile.outcome.status,
        jct_seconds=profile.outcome.jct_seconds,
        samples_processed=profile.outcome.samples_processed,
        workers=workers,
        ps=ps,
        peak_worker_cpu=float(peak["worker"][0]),
        peak_worker_memory_mb=int(peak["worker"][1]),
        peak_ps_cpu=float(peak["ps"][0]),
        peak_ps_memory_mb=int(peak["ps"][1]),
        peak_total_ps_cpu=peak_total_ps_cpu,
        peak_total_ps_memory_mb=peak_total_ps_mem,
        mean_worker_cpu=statistics.fmean(means["worker"]) if means["worker"] else 0.0,
        mean_ps_cpu=statistics.fmean(means["ps"]) if means["ps"] else 0.0,
        oom_events=sum(1 for e in profile.events if e.kind == "oom"),
        observations=observations_from_samples(profile.samples, job.training.batch_size),
    )
