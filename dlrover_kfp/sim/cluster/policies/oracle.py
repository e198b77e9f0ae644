"""``oracle-<a>``: a reference, not a peer. It is handed every job's hidden truth.

For each job it runs, for the whole job, the cheapest configuration (least CPU, then memory)
whose throughput on the job's truth is at least ``a`` times the best any configuration within
the job's quota reaches (:func:`~dlrover_kfp.sim.cluster.oracle.oracle`), with pods sized to
the truth's memory at its end-of-job peak. It runs in the elastic runtime dlrover-kfp and
dlrover-oss run in (a failed pod is relaunched alone; dynamic sharding; flash checkpoints, whose
snapshot buffer its PS memory holds), so its JCT and CPU and memory utilisation are measured
under the same stragglers, hot PS, evictions and node failures as the policies.

What it knows that no policy knows, before the job's first step: the job's throughput function
on every shape and its memory curve to the end (the rows its PS will hold, the hot shard's
size). It pays no profiling, no scaling steps, no OOM kills. What it does not know: the
stragglers, which jobs have a hot PS, and the faults; it never reacts to them. So it bounds what
planning alone can buy, and its figures say how far a policy is from that bound, not that the
policy lost a race against a peer.

Its only decision after the start: an elastic job the scheduler started with fewer workers than
planned (the cluster was busy) asks for its plan again at every decision, as an elastic runtime
grows into capacity that frees up.
"""

from __future__ import annotations

from collections.abc import Sequence

from dlrover_kfp.core.plan import ResourcePlan, Stage
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.sim.cluster.api import JobView, Role
from dlrover_kfp.sim.cluster.engine import ClusterSettings
from dlrover_kfp.sim.cluster.oracle import oracle
from dlrover_kfp.sim.cluster.trace import TraceJob

#: A reference's name is this and the share ``a`` in (0, 1] of the oracle's best it reaches.
_PREFIX = "oracle-"


def reference_share(name: str) -> float | None:
    """The share ``a`` of a reference's name ``oracle-<a>``; None for any other name (a bad
    share included: 0, above 1, not a number)."""
    if not name.startswith(_PREFIX):
        return None
    try:
        share = float(name[len(_PREFIX) :])
    except ValueError:
        return None
    return share if 0 < share <= 1 else None


def reference_name(share: float) -> str:
    """The one name of the reference reaching ``share`` (``oracle-0.90`` is ``oracle-0.9``)."""
    return f"{_PREFIX}{share:g}"


class OraclePolicy:
    """Runs each job at the oracle's cheapest configuration reaching ``share`` of its best."""

    elastic = True
    #: how often a job cut by the scheduler asks for its plan again (dlrover-kfp's interval)
    decision_interval_s = 300.0

    def __init__(self, jobs: Sequence[TraceJob], cluster: ClusterSettings, share: float) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share: must be in (0, 1], got {share:g}")
        self.name = f"oracle-{share:g}"
        self.share = share
        self.cluster = cluster
        self._jobs = {job.id: job for job in jobs}
        #: per spec, the jobs with it in arrival order: ``initial`` sees only the spec, and
        #: the engine starts a trace's jobs in arrival order
        self._waiting: dict[JobSpec, list[TraceJob]] = {}
        for job in sorted(jobs, key=lambda j: (j.arrival_s, j.id)):
            self._waiting.setdefault(job.spec, []).append(job)
        self._plans: dict[str, ResourcePlan] = {}

    def _plan(self, job: TraceJob) -> ResourcePlan:
        plan = self._plans.get(job.id)
        if plan is not None:
            return plan
        c = self.cluster
        answer = oracle(job, c.node_cpu, c.node_memory_mb, snapshot=True, shares=(self.share,))
        if answer is None:  # nothing fits the quota on the truth: the user's request
            plan = ResourcePlan(
                workers=job.workers.to_group(),
                ps=job.ps.to_group(),
                stage=Stage.MANUAL,
                reason="oracle: no configuration fits the quota on the truth; the user's request",
            )
        else:
            config = answer.at(self.share)
            plan = ResourcePlan(
                workers=config.workers,
                ps=config.ps,
                stage=Stage.MANUAL,
                reason=f"oracle: cheapest configuration with {self.share:g} of the truth's best "
                f"in quota ({config.throughput:.0f} of {answer.best.throughput:.0f} samples/s)",
                predicted_throughput=config.throughput,
            )
        self._plans[job.id] = plan
        return plan

    def initial(self, spec: JobSpec, now: float) -> ResourcePlan:
        return self._plan(self._waiting[spec].pop(0))

    def decide(self, job: JobView) -> ResourcePlan | None:
        target = self._plan(self._jobs[job.job_id])
        return target if job.plan.workers.count < target.workers.count else None

    def after_failure(self, job: JobView, role: Role, reason: str) -> ResourcePlan | None:
        return None  # the pod is relaunched as it was: its memory holds the truth's peak

    def finished(self, profile: JobProfile) -> None:
        return None
