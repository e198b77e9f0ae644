"""The cluster simulator's seams: what a policy sees of a job, and what it must answer.

A policy never sees a job's hidden truth (its throughput function and memory curve). It sees
what a real job master sees: the job's spec (the user's request and quota, the model, the
dataset), the runtime samples the simulated pods produce (samples/s, per-pod CPU and memory used
against requested, the same :class:`~dlrover_kfp.core.profile.RuntimeSample` the real runtime
records) and the events (OOM, node loss, eviction, straggler). Every policy drives the same
simulated cluster through this protocol, so the comparison is between decisions only.

Failure semantics differ by policy family and are part of the policy (``elastic``):

* not elastic (``manual``, and ``optimus``, which resizes by checkpoint-and-restart): a failed
  pod restarts the whole job from its last persisted checkpoint, losing the work since, up to a
  retry limit, like a static TFJob;
* elastic (``dlrover-oss``, ``dlrover-kfp``): the runtime relaunches only the failed pod;
  workers lose at most their leased shard, a PS restores from its flash checkpoint.

**One time base.** Every time the protocol passes is in *trace seconds*, seconds since the
trace starts: the ``now`` of :meth:`Policy.initial`, :attr:`JobView.now`,
:attr:`JobView.submitted_at` (the job's ``arrival_s``) and :attr:`JobView.started_at`. A policy
that keeps history dates it and prunes it on that clock. Only the profiles handed to
:meth:`Policy.finished` carry wall-clock timestamps (``JobProfile.started_at`` is
``EPOCH + trace seconds``, as a real profile's ISO time), and a policy that hands ``now`` to code
that compares it with such timestamps (the planner's history store) adds :data:`EPOCH` itself.
Two clocks mixed in one policy was a real bug: dlrover-oss dated its history in trace seconds
but was started with ``EPOCH + t`` and pruned every entry as 56 years old, so no job of it ever
warm-started.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.profile import JobEvent, JobProfile, RuntimeSample
from dlrover_kfp.core.spec import JobSpec

Role = Literal["worker", "ps"]

#: The wall-clock time of the trace's second 0, for profiles (which need wall-clock
#: timestamps): 2026-01-01T00:00:00Z.
EPOCH = 1_767_225_600.0


@dataclass(frozen=True, slots=True)
class JobView:
    """A running job as its master sees it, at ``now`` (simulated seconds since the trace start).

    ``samples`` and ``events`` are those of the current incarnation of the job, with times in
    seconds since it started (as a real profile's are).
    """

    job_id: str
    spec: JobSpec
    submitted_at: float
    started_at: float
    now: float
    plan: ResourcePlan
    samples: Sequence[RuntimeSample]
    events: Sequence[JobEvent]
    #: fraction of the job's samples (rows x epochs) already trained, 0..1
    progress: float
    #: whole-job restarts so far (non-elastic policies)
    restarts: int = 0
    #: samples/s measured per (workers, ps) by profiling before the job started (policies
    #: with a ``profile_plans`` method; empty for the others)
    profiled: Mapping[tuple[int, int], float] = field(default_factory=dict)

    @property
    def elapsed(self) -> float:
        return self.now - self.started_at


class Policy(Protocol):
    """A resource policy. One instance serves every job of a simulation (it may keep history)."""

    @property
    def name(self) -> str: ...

    @property
    def elastic(self) -> bool:
        """Whether a failed pod is relaunched alone (True) or restarts the job (False)."""
        ...

    @property
    def decision_interval_s(self) -> float:
        """Simulated seconds between two :meth:`decide` calls for a running job."""
        ...

    def initial(self, spec: JobSpec, now: float) -> ResourcePlan:
        """The plan a job starts with (may use the history of finished jobs); ``now`` in trace
        seconds, as every time of this protocol."""
        ...

    def decide(self, job: JobView) -> ResourcePlan | None:
        """A new plan for a running job, or None to keep the current one."""
        ...

    def after_failure(self, job: JobView, role: Role, reason: str) -> ResourcePlan | None:
        """The plan to relaunch with after a pod of ``role`` failed (``reason``: OOMKilled,
        NodeLost, Evicted); None keeps the current plan."""
        ...

    def finished(self, profile: JobProfile) -> None:
        """A job ended (succeeded or failed): its profile, for policies that learn from history."""
        ...

    # Optional: ``profile_plans(spec, plan) -> Sequence[ResourcePlan]``, the configurations to
    # run a few steps each before the job trains at ``plan`` (Optimus); the engine measures
    # them and hands the figures on in ``JobView.profiled``.


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """One job's result in a simulation."""

    job_id: str
    scenario: str | None
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    succeeded: bool
    reason: str
    restarts: int
    oom_failures: int
    resizes: int
    #: the resizes among ``resizes`` that changed the PS (their count, CPU or memory)
    ps_resizes: int = 0
    #: seconds spent profiling configurations before training at the plan
    profile_s: float = 0.0
    #: the reason of every pod failure (OOMKilled, Evicted, Error, NodeLost), in order
    failures: tuple[str, ...] = ()
    #: the job started from a plan its policy drew from the history of earlier jobs
    #: (its first plan's stage is ``warm_start``)
    warm_started: bool = False
    #: OOM kills the user's own request would have avoided
    #: (:func:`~dlrover_kfp.sim.cluster.engine.request_would_hold`)
    self_inflicted_ooms: int = 0
    #: single pods relaunched (elastic policies: after a failure, or a straggler replaced);
    #: whole-job restarts are ``restarts``
    relaunches: int = 0
    #: samples/s of the job's last plan on its truth, without stragglers or a hot PS
    #: (None: it never started)
    final_plan_throughput: float | None = None
    #: the same, of the plans in effect weighted by how long each held the job's pods
    mean_plan_throughput: float | None = None
    #: the most samples/s any configuration within the job's quota reaches on its truth
    #: (:mod:`~dlrover_kfp.sim.cluster.oracle`); None: nothing fits the quota
    oracle_best: float | None = None

    @property
    def jct(self) -> float | None:
        """Job completion time: submission to end (queueing included), as the paper counts."""
        return None if self.finished_at is None else self.finished_at - self.submitted_at
