"""``manual``: the user's own request, kept for the whole job, like a static TFJob.

A failed pod restarts the whole job from its last persisted checkpoint with the same request,
up to the simulator's retry limit; nothing is learned from earlier runs.
"""

from __future__ import annotations

from dlrover_kfp.core.plan import NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.sim.cluster.api import JobView, Role

#: What a user who wrote no resources gets (the DLRover default: 2 workers + 1 PS, 1 CPU, 8000 MB).
DEFAULT_WORKERS = NodeGroup(count=2, cpu=1.0, memory_mb=8000)
DEFAULT_PS = NodeGroup(count=1, cpu=1.0, memory_mb=8000)


class ManualPolicy:
    name = "manual"
    elastic = False
    decision_interval_s = float("inf")

    def initial(self, spec: JobSpec, now: float) -> ResourcePlan:
        res = spec.resources
        workers = res.workers.to_group() if res.workers else DEFAULT_WORKERS
        ps = res.ps.to_group() if res.ps else DEFAULT_PS
        return ResourcePlan(
            workers=workers, ps=ps, stage=Stage.MANUAL, reason="the user's own request"
        )

    def decide(self, job: JobView) -> ResourcePlan | None:
        return None

    def after_failure(self, job: JobView, role: Role, reason: str) -> ResourcePlan | None:
        return None

    def finished(self, profile: JobProfile) -> None:
        return None
