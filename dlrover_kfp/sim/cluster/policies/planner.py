"""``dlrover-kfp``: this package's own planner, the same functions the runtime calls.

* start: :func:`dlrover_kfp.planning.plan_job_with_history` against an in-memory history
  store that holds every job this policy has finished in the simulation (warm start for
  recurring scenarios, cold start otherwise), with the observations of the similar jobs it
  used handed on to Stage 2 as known points, as the quickstart does;
* while running: Stage 3 (:func:`~dlrover_kfp.core.planner.post_scale`) first, for what went
  wrong since the last decision (OOM, memory trend, hot PS, stragglers), then Stage 2
  (:func:`~dlrover_kfp.core.planner.auto_scale`) with the job's own samples, judging and
  rolling back its last step;
* a failed pod: Stage 3 with the failure as an event (OOM: more memory or more PS);
* at the end: the job's profile goes into the history.

A job whose planner needs exceeded its quota at least once (warm start fell back to the user's
request, a stage kept its plan or grew only as far as the quota allowed:
:func:`~dlrover_kfp.core.planner.quota.over_quota`) is counted in ``infeasible_jobs`` when it
ends.

Nothing here re-implements planning; this module only translates between the simulator's
protocol and the planner's functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dlrover_kfp.core.observation import Observation
from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.planner import PlannerSettings, context_from_spec
from dlrover_kfp.core.planner.auto_scale import ScalingStep, auto_scale, throughput_before
from dlrover_kfp.core.planner.context import PlanningContext
from dlrover_kfp.core.planner.post_scale import Instability, post_scale
from dlrover_kfp.core.planner.quota import over_quota
from dlrover_kfp.core.profile import JobEvent, JobProfile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.history.memory import InMemoryHistoryStore
from dlrover_kfp.planning import plan_job_with_history
from dlrover_kfp.ports import FixedClock
from dlrover_kfp.sim.cluster.api import EPOCH, JobView, Role


@dataclass
class _JobState:
    ctx: PlanningContext
    known: list[Observation]
    last_step: ScalingStep | None = None
    events_seen: int = 0
    incarnation: float = -1.0
    quiet: int = 0
    skipped: int = 0
    history: list[str] = field(default_factory=list)
    #: whether a plan or decision for this job said the planner's needs exceed the quota
    over_quota: bool = False


class PlannerPolicy:
    name = "dlrover-kfp"
    elastic = True

    def __init__(
        self,
        settings: PlannerSettings | None = None,
        *,
        decision_interval_s: float = 300.0,
        back_off_after: int = 3,
    ) -> None:
        self.settings = settings or PlannerSettings()
        self.decision_interval_s = decision_interval_s
        #: after this many decisions in a row that keep the plan, decide only every other time
        #: (the plan has settled; the runtime does the same to stay cheap)
        self.back_off_after = back_off_after
        self.store = InMemoryHistoryStore()
        #: per job id, once its first decision names it
        self.jobs: dict[str, _JobState] = {}
        #: states made by ``initial`` (which sees only the spec), per job name, oldest first:
        #: runs of one recurring job share a name and may overlap
        self.pending: dict[str, list[_JobState]] = {}
        #: jobs ended whose planner needs exceeded the quota at least once (module docstring)
        self.infeasible_jobs = 0

    def initial(self, spec: JobSpec, now: float) -> ResourcePlan:
        # The store dates profiles in wall-clock time (EPOCH + trace seconds): one clock.
        clock = FixedClock(EPOCH + now)
        plan, known = plan_job_with_history(spec, self.store, clock, self.settings)
        state = _JobState(
            ctx=context_from_spec(spec, self.settings),
            known=known,
            over_quota=over_quota(plan.reason),
        )
        self.pending.setdefault(spec.name, []).append(state)
        return plan

    def _state(self, job: JobView) -> _JobState:
        state = self.jobs.get(job.job_id)
        if state is None:
            state = self.pending[job.spec.name].pop(0)
            self.jobs[job.job_id] = state
        if state.incarnation != job.started_at:  # a restarted job starts its steps afresh
            state.incarnation = job.started_at
            state.last_step = None
            state.events_seen = 0
        return state

    def _new_events(self, job: JobView, state: _JobState) -> list[JobEvent]:
        new = list(job.events[state.events_seen :])
        state.events_seen = len(job.events)
        return new

    def decide(self, job: JobView) -> ResourcePlan | None:
        state = self._state(job)
        now = job.now - job.started_at
        events = self._new_events(job, state)
        if state.quiet >= self.back_off_after and not events:
            state.skipped += 1
            if state.skipped % 2 == 1:
                return None
        window = job.samples[-self.settings.auto_scale.min_samples * 4 :]
        post = post_scale(state.ctx, job.plan, Instability(window, events), now, self.settings)
        if post is not None:
            state.quiet = 0
            state.last_step = None
            state.over_quota |= over_quota(post.reason)
            return post
        decision = auto_scale(
            state.ctx,
            job.plan,
            job.samples,
            now,
            self.settings,
            last_step=state.last_step,
            known=state.known,
        )
        if decision.plan is None:
            state.quiet += 1
            state.over_quota |= over_quota(decision.reason)
            return None
        state.quiet = 0
        measured = throughput_before(job.samples, self.settings)
        state.last_step = (
            None
            if decision.kind == "rollback"
            else ScalingStep(
                time=now,
                before=job.plan,
                throughput_before=measured,
                kind=decision.kind,
                expected=decision.plan.predicted_throughput,
            )
        )
        return decision.plan

    def after_failure(self, job: JobView, role: Role, reason: str) -> ResourcePlan | None:
        if reason != "OOMKilled":
            return None  # the runtime relaunches the pod as it was
        state = self._state(job)
        now = job.now - job.started_at
        events = self._new_events(job, state)
        window = job.samples[-self.settings.auto_scale.min_samples * 4 :]
        state.last_step = None
        post = post_scale(state.ctx, job.plan, Instability(window, events), now, self.settings)
        state.over_quota |= post is not None and over_quota(post.reason)
        return post

    def finished(self, profile: JobProfile) -> None:
        self.store.record(profile)
        state = self.jobs.pop(profile.run_id, None)
        if state is None:  # it never reached a decision
            waiting = self.pending.get(profile.job.name)
            state = waiting.pop(0) if waiting else None
        self.infeasible_jobs += state is not None and state.over_quota
