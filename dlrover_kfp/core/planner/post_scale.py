"""Stage 3: post-scaling, the rules that react to instability in a running job.

Each rule is a pure function of the recent samples and events and returns node actions; the
runtime applies them. Rules, in the order they are checked (a pod gets at most one action):

- OOM reaction: a pod was OOM-killed -> relaunch it with memory x ``oom_memory_factor``
  (at most +``oom_max_step_mb``), a PS whose growth is measured with at least its end-of-job
  need (memory_growth.py). More memory per PS whenever a pod may have it; more PS only when
  it may not and PS memory is balanced, the fewest that fit (:func:`ps_oom_adds_ps`).
- OOM prevention: a least-squares line through a pod's last ``oom_trend_samples`` memory
  readings (a worker's: while it trained, its first two left out as start-up) reaches
  ``oom_threshold`` of its limit within ``oom_horizon_s`` -> relaunch it with the predicted
  need x ``oom_prevention_headroom`` (a PS: at least its end-of-job need) before it dies.
- PS growth: the PS' measured growth projects more than their memory by the job's end ->
  relaunch them with that need now, where the quota has room (:func:`ps_growth_short`).
- Hot PS: CPU used / requested > ``hot_ps_utilization`` and used ``hot_ps_peer_ratio`` x its
  peers' median or more, for ``hot_ps_samples`` samples in a row -> migrate it, without
  stopping training, to a pod with its CPU x the measured imbalance (at most
  ``hot_ps_cpu_growth``). The plan holds one size per role, which new PS pods get.
- Starved PS: throttled in at least ``starved_ps_throttled`` of the CFS periods of its last
  ``starved_ps_samples`` telling samples (an idle PS's tell nothing), with a CPU use that bounds
  its quota below ``starved_ps_share`` of its request -> migrate it to a new pod of the size
  it requested.
  (Its CPU use is *below* its request, so the hot-PS rule cannot see it.)
- Slow worker: its throughput below ``straggler_ratio`` x its peers' median for
  ``straggler_samples`` samples -> its shards go back to the queue for the others to pull;
  after ``straggler_replace_samples`` it is replaced.
- Hung worker: a worker has held a shard without reporting it for ``hung_lease_factor`` x the
  time one shard takes at the job's median speed (at least ``hung_lease_min_s``) -> it is
  replaced, and its shards go back to the queue when its connection drops.
- Pending too long: a pod pending more than ``pending_timeout_s`` -> relaunch it smaller.

Growth stays inside the quota: when the quota has no room, workers are given up first (the
job runs slower rather than dying); a group's size in the plan is what new pods of the role
get, and the actions name the pods to replace now.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dlrover_kfp.core.footprint import RUNTIME_MB
from dlrover_kfp.core.plan import NodeAction, NodeGroup, ResourcePlan, Stage
from dlrover_kfp.core.planner.context import PlanningContext, clamp_cpu, clamp_memory
from dlrover_kfp.core.planner.memory_growth import PsGrowth, ps_growth, trend_slope
from dlrover_kfp.core.planner.quota import OVER_QUOTA, at_least_minimum, fit_to_quota
from dlrover_kfp.core.planner.relaunch import oom_wanted_memory
from dlrover_kfp.core.planner.settings import (
    MemoryGrowthSettings,
    PlannerSettings,
    PostScaleSettings,
)
from dlrover_kfp.core.profile import JobEvent, NodeSample, RuntimeSample


@dataclass(frozen=True, slots=True)
class Instability:
    """What the runtime observed since the last post-scaling decision."""

    samples: Sequence[RuntimeSample]
    events: Sequence[JobEvent] = ()
    #: pods pending (not yet running) and for how many seconds
    pending_s: Mapping[str, float] | None = None
    #: why a pending pod waits, where the cluster says (its scheduler's ``Unschedulable``
    #: message): the pending rule's reason carries it, so that the profile says what to fix
    pending_why: Mapping[str, str] | None = None
    #: per worker pod, how long it has held its oldest leased shard without reporting it
    lease_ages_s: Mapping[str, float] | None = None
    #: seconds one worker takes for one shard at the job's median speed (None: not known yet)
    shard_s: float | None = None
    #: the PS pods' samples since each started, across changes that left them running (a
    #: worker relaunched, another PS moved). The starved-PS rule reads a PS's own quota from
    #: its own samples, which such a change does not make stale; restarting its count at every
    #: change would leave a PS starved through a run of other faults. Empty: ``samples``.
    ps_history: Sequence[RuntimeSample] = ()


def _series(samples: Sequence[RuntimeSample]) -> dict[str, list[tuple[float, NodeSample]]]:
    out: dict[str, list[tuple[float, NodeSample]]] = {}
    for s in samples:
        for n in s.nodes:
            out.setdefault(n.name, []).append((s.time, n))
    return out


def oom_reactions(
    events: Sequence[JobEvent],
    latest: Mapping[str, NodeSample],
    groups: Mapping[str, NodeGroup],
    s: PostScaleSettings,
    ctx: PlanningContext,
    growth: PsGrowth | None = None,
    g: MemoryGrowthSettings | None = None,
) -> list[NodeAction]:
    """Each OOM-killed pod relaunched with the memory the OOM calls for (:func:`oom_wanted`),
    clamped to a pod's range; :func:`post_scale` turns a PS's into more PS where a pod cannot
    have it (:func:`ps_oom_adds_ps`)."""
    actions: list[NodeAction] = []
    for event in events:
        if event.kind != "oom" or event.node is None or event.node in {a.node for a in actions}:
            continue
        node = latest.get(event.node)
        role = node.role if node else _role(event.node, latest)
        requested = node.memory_requested_mb if node else groups[role].memory_mb
        wanted = oom_wanted(requested, role, groups[role].count, s, ctx, growth, g)
        actions.append(
            NodeAction(
                kind="relaunch",
                node=event.node,
                memory_mb=clamp_memory(wanted, ctx.node),
                reason=f"OOM-killed at {requested}Mi: relaunch with x{s.oom_memory_factor:g} "
                f"memory (at most +{s.oom_max_step_mb}Mi)"
                + (", or what the PS' measured growth needs to the job's end" if growth else ""),
            )
        )
    return actions


def oom_wanted(
    requested_mb: int,
    role: str,
    count: int,
    s: PostScaleSettings,
    ctx: PlanningContext,
    growth: PsGrowth | None,
    g: MemoryGrowthSettings | None,
) -> float:
    """Memory per pod an OOM at ``requested_mb`` calls for, before a pod's limit: the relaunch
    rule's growth (relaunch.oom_wanted_memory), and for a PS whose growth was measured at
    least its end-of-job need (memory_growth.py: runtime + N / p), so that it dies once, not
    once per doubling."""
    wanted = oom_wanted_memory(requested_mb, s)
    if role == "ps" and growth is not None and g is not None:
        wanted = max(wanted, growth.need_per_ps_mb(ctx, g, count))
    return wanted


def ps_oom_adds_ps(
    wanted_mb: float,
    ps: NodeGroup,
    latest: Mapping[str, NodeSample],
    s: PostScaleSettings,
    ctx: PlanningContext,
) -> int:
    """PS to add after a PS OOM: 0 when more memory per PS is the fix.

    The rule: more memory per PS whenever a pod may have what the OOM calls for
    (``wanted <= node.max_memory_mb``): it costs only that memory, where each added PS costs a
    pod's CPU and runtime and a re-partition of every row. More PS only when it may not, and
    the PS memory is balanced (``(max - mean) / max <= ps_memory_balance``: the rows spread
    evenly, so a larger count shrinks every share; a hot shard would stay hot): the fewest
    count whose even share of the same state fits a pod,

        p' = ceil(p · (wanted − runtime) / (max_memory − runtime)),   at most max_ps
    """
    if wanted_mb <= ctx.node.max_memory_mb or ps.count >= ctx.max_ps:
        return 0
    used = [n.memory_used_mb for n in latest.values() if n.role == "ps"]
    if not used or max(used) == 0:
        return 0
    if (max(used) - statistics.fmean(used)) / max(used) > s.ps_memory_balance:
        return 0
    per_pod = ctx.node.max_memory_mb - RUNTIME_MB
    count = math.ceil(ps.count * (wanted_mb - RUNTIME_MB) / per_pod - 1e-9)
    return max(0, min(ctx.max_ps, count) - ps.count)


def oom_predictions(
    series: Mapping[str, list[tuple[float, NodeSample]]],
    now: float,
    s: PostScaleSettings,
    ctx: PlanningContext,
    ps_need_mb: int | None = None,
) -> list[NodeAction]:
    """Pods whose memory trend reaches ``oom_threshold`` of their limit within
    ``oom_horizon_s``: relaunched with the predicted need x ``oom_prevention_headroom``, a PS
    with at least ``ps_need_mb`` (its measured growth's end-of-job need) where that is known."""
    actions = []
    for name, readings in series.items():
        points = readings
        if points and points[-1][1].role == "worker":
            # A worker's start-up (loading, its first batches) grows its memory fast and then
            # stops: only readings while it trained, after its first two, say where it heads.
            points = [(t, n) for t, n in readings if n.throughput][2:]
        recent = points[-s.oom_trend_samples :]
        if len(recent) < s.oom_trend_samples:
            continue
        limit = recent[-1][1].memory_requested_mb
        slope = trend_slope([(t, n.memory_used_mb) for t, n in recent])
        if slope <= 0 or limit <= 0:
            continue
        t_last, last = recent[-1]
        predicted = last.memory_used_mb + slope * (now + s.oom_horizon_s - t_last)
        if predicted < s.oom_threshold * limit:
            continue
        eta = max(0.0, (limit - last.memory_used_mb) / slope)
        floor = ps_need_mb if last.role == "ps" and ps_need_mb is not None else 0
        actions.append(
            NodeAction(
                kind="relaunch",
                node=name,
                memory_mb=clamp_memory(
                    max(predicted * s.oom_prevention_headroom, limit + 1, floor), ctx.node
                ),
                reason=f"memory grows {slope * 60:.0f}Mi/min and reaches its {limit}Mi limit in "
                f"~{eta:.0f}s: relaunch bigger before it is OOM-killed",
            )
        )
    return actions


def ps_growth_short(
    latest: Mapping[str, NodeSample],
    growth: PsGrowth | None,
    need_mb: int | None,
    current: ResourcePlan,
    ctx: PlanningContext,
) -> list[NodeAction]:
    """PS whose memory is below their measured growth's end-of-job need (memory_growth.py:
    ``runtime + N / p``): relaunched with it now, at the price of a PS move, rather than
    OOM-killed later, at the price of a relaunch and the progress since the last checkpoint.

    Only where the quota holds the raise as the job stands: the projection is an upper bound,
    loose early in the job, and a raise that cost workers (a quota equal to the request, whose
    PS the projection may overstate) would slow the job for memory it may never use. Beyond
    the quota's room the PS are raised when their trend reaches the limit
    (:func:`oom_predictions`, to the same need), and only then at the workers' expense."""
    if growth is None or need_mb is None:
        return []
    raised = NodeGroup(count=current.ps.count, cpu=current.ps.cpu, memory_mb=need_mb)
    if not ctx.fits(current.workers, raised):
        return []
    return [
        NodeAction(
            kind="relaunch",
            node=name,
            memory_mb=need_mb,
            reason=f"PS state {growth.state_mb:.0f}Mi at {growth.progress:.0%} progress grows "
            f"{growth.slope_mb * 0.01:.0f}Mi per 1% of the job: {need_mb}Mi each by its end "
            f"(+{growth.imbalance - 1:.0%} for the largest), above its {n.memory_requested_mb}Mi",
        )
        for name, n in sorted(latest.items())
        if n.role == "ps" and n.memory_requested_mb < need_mb
    ]


def hot_ps(
    series: Mapping[str, list[tuple[float, NodeSample]]],
    s: PostScaleSettings,
    ctx: PlanningContext,
) -> list[NodeAction]:
    """PS that are busy and carry more than their share: in each of their last
    ``hot_ps_samples`` samples, CPU used / requested > ``hot_ps_utilization`` and used at least
    ``hot_ps_peer_ratio`` x the median use of the other PS at that sample. Each moves to a pod
    sized by the imbalance measured (its use over its peers', the lowest of the window):

        λ_hot = request · min(hot_ps_cpu_growth, max(1, min_t(used_t / median peers' used_t)))

    PS all busy alike are not hot: the group runs at its demand, which is what the search
    sizes it to (search.CpuBounds), and whether more PS CPU pays is Stage 2's question, which
    the model answers. Doubling them here undid that sizing at every decision (issue 30). A
    lone PS has no peers to tell a hot shard from the group's demand: the same holds.
    """
    peers_at: dict[float, dict[str, float]] = {}
    for name, points in series.items():
        for t, n in points:
            if n.role == "ps":
                peers_at.setdefault(t, {})[name] = n.cpu_used
    actions = []
    for name, points in series.items():
        recent = points[-s.hot_ps_samples :]
        if len(recent) < s.hot_ps_samples or recent[-1][1].role != "ps":
            continue
        ratios = [_load_over_peers(name, t, n, peers_at[t], s) for t, n in recent]
        if any(r is None for r in ratios):
            continue
        imbalance = min(r for r in ratios if r is not None)
        requested = recent[-1][1].cpu_requested
        actions.append(
            NodeAction(
                kind="migrate_ps",
                node=name,
                cpu=clamp_cpu(requested * min(s.hot_ps_cpu_growth, max(1.0, imbalance)), ctx.node),
                reason=f"hot PS: CPU above {s.hot_ps_utilization:.0%} of {requested:g} cores "
                f"and {imbalance:.1f}x its peers' for {len(recent)} samples: migrate to a pod "
                f"sized to that imbalance",
            )
        )
    return actions


def _load_over_peers(
    name: str, t: float, n: NodeSample, peers_at: Mapping[str, float], s: PostScaleSettings
) -> float | None:
    """``n``'s CPU use over its peers' median at time ``t`` when it is hot then (busy, and
    ``hot_ps_peer_ratio`` x its peers' use or more); None when it is not, or has no peers
    (unless the ratio is 0: no peer condition, a lone PS judged on its use alone, 1.0)."""
    peers = [used for other, used in peers_at.items() if other != name]
    if n.cpu_requested <= 0 or n.cpu_used <= s.hot_ps_utilization * n.cpu_requested:
        return None
    if not peers:
        return 1.0 if s.hot_ps_peer_ratio <= 0 else None
    peer = statistics.median(peers)
    if peer <= 0:
        return s.hot_ps_cpu_growth
    return n.cpu_used / peer if n.cpu_used >= s.hot_ps_peer_ratio * peer else None


def starved_ps(
    series: Mapping[str, list[tuple[float, NodeSample]]], s: PostScaleSettings
) -> list[NodeAction]:
    """PS that get less CPU than they requested: their quota was cut, or their node's CFS
    bandwidth is short.

    CFS throttles a group in a period only once it has run its whole quota ``q`` in it, so over
    a window with a share ``θ`` of its periods throttled and ``u`` cores used on average:

        u >= θ · q   =>   q <= u / θ

    A sample is evidence of starvation when θ >= ``starved_ps_throttled`` (a rare throttle
    makes the bound meaningless) and that bound is below ``starved_ps_share`` x the request;
    evidence against when the PS used ``starved_ps_share`` of its request or more (its quota is
    at least that); and says nothing otherwise (an idle PS, while workers restart, shows no
    quota). The PS is starved when its last ``starved_ps_samples`` telling samples all are
    evidence of it. A PS whose backend cannot see throttling (``cpu_throttled`` None) is never
    judged.
    """
    actions = []
    for name, points in series.items():
        if not points or points[-1][1].role != "ps":
            continue
        verdicts: list[float | None] = []  # the bound where starved, None where not
        for _, n in points:
            if n.cpu_throttled is None or n.cpu_requested <= 0:
                continue
            floor = s.starved_ps_share * n.cpu_requested
            if n.cpu_throttled >= s.starved_ps_throttled and n.cpu_used / n.cpu_throttled < floor:
                verdicts.append(n.cpu_used / n.cpu_throttled)
            elif n.cpu_used >= floor or n.cpu_throttled >= s.starved_ps_throttled:
                verdicts.append(None)
        recent = verdicts[-s.starved_ps_samples :]
        if len(recent) == s.starved_ps_samples and all(b is not None for b in recent):
            requested = points[-1][1].cpu_requested
            bound = max(b for b in recent if b is not None)
            actions.append(
                NodeAction(
                    kind="migrate_ps",
                    node=name,
                    cpu=requested,
                    reason=f"starved PS: throttled while its CPU quota is at most "
                    f"{bound:.3g} of the {requested:g} cores it requested, for "
                    f"{len(recent)} samples: migrate to a new pod of its size",
                )
            )
    return actions


def hung_workers(
    lease_ages_s: Mapping[str, float], shard_s: float | None, s: PostScaleSettings
) -> list[NodeAction]:
    """Workers that hold a shard far longer than a shard takes: replace them.

    limit = max(hung_lease_min_s, hung_lease_factor · shard_s); without a known shard time
    only the floor applies.
    """
    limit = max(s.hung_lease_min_s, s.hung_lease_factor * shard_s if shard_s else 0.0)
    return [
        NodeAction(
            kind="replace_worker",
            node=name,
            reason=f"hung: holds a shard for {age:.0f}s without reporting it (limit "
            f"{limit:.0f}s): replace it",
        )
        for name, age in sorted(lease_ages_s.items())
        if age > limit
    ]


def slow_workers(samples: Sequence[RuntimeSample], s: PostScaleSettings) -> list[NodeAction]:
    """Workers slower than ``straggler_ratio`` x their peers' median in each recent sample."""
    recent = samples[-s.straggler_replace_samples :]
    streak: dict[str, int] = {}
    for sample in recent:
        speeds = {
            n.name: n.throughput
            for n in sample.nodes
            if n.role == "worker" and n.throughput is not None
        }
        if len(speeds) < 2:
            streak.clear()
            continue
        for name, speed in speeds.items():
            peers = statistics.median(v for k, v in speeds.items() if k != name)
            slow = peers > 0 and speed < s.straggler_ratio * peers
            streak[name] = streak.get(name, 0) + 1 if slow else 0
    actions = []
    for name, count in sorted(streak.items()):
        if count >= s.straggler_replace_samples:
            actions.append(
                NodeAction(
                    kind="replace_worker",
                    node=name,
                    reason=f"straggler for {count} samples (below {s.straggler_ratio:.0%} of its "
                    f"peers' median): replace it",
                )
            )
        elif count >= s.straggler_samples:
            actions.append(
                NodeAction(
                    kind="reassign_shards",
                    node=name,
                    reason=f"straggler for {count} samples (below {s.straggler_ratio:.0%} of its "
                    f"peers' median): its shards go to faster workers",
                )
            )
    return actions


def pending_too_long(
    pending_s: Mapping[str, float],
    groups: Mapping[str, NodeGroup],
    s: PostScaleSettings,
    ctx: PlanningContext,
    why: Mapping[str, str] | None = None,
) -> list[NodeAction]:
    """Pods pending longer than ``pending_timeout_s``: relaunched ``pending_shrink`` x smaller,
    so that a node has room for them (DLRover's rule); the job trains on meanwhile with the
    pods it has. The reason names the wait and, where known, the scheduler's ``why``."""
    actions = []
    for name, waited in sorted(pending_s.items()):
        if waited <= s.pending_timeout_s:
            continue
        said = (why or {}).get(name)
        cause = f"; the scheduler: {said!r}" if said else ""
        role = _role(name, {})
        group = groups[role]
        floor = (
            ctx.worker_memory_floor_mb if role == "worker" else ctx.ps_memory_floor_mb(group.count)
        )
        actions.append(
            NodeAction(
                kind="relaunch",
                node=name,
                cpu=clamp_cpu(group.cpu * s.pending_shrink, ctx.node),
                memory_mb=clamp_memory(max(floor, group.memory_mb * s.pending_shrink), ctx.node),
                reason=f"pending {waited:.0f}s (> {s.pending_timeout_s:.0f}s{cause}): relaunch "
                f"smaller so that it fits a node",
            )
        )
    return actions


def post_scale(
    ctx: PlanningContext,
    current: ResourcePlan,
    observed: Instability,
    now: float,
    settings: PlannerSettings,
) -> ResourcePlan | None:
    """The post-scaling plan for what was observed, or None when all is well."""
    s = settings.post_scale
    series = _series(observed.samples)
    latest = {name: points[-1][1] for name, points in series.items()}
    groups = {"worker": current.workers, "ps": current.ps}

    actions: list[NodeAction] = []
    taken: set[str] = set()
    workers, ps = current.workers, current.ps

    def take(new: Sequence[NodeAction]) -> None:
        for a in new:
            if a.node not in taken:
                actions.append(a)
                taken.add(a.node)

    g = settings.memory_growth
    growth = ps_growth(ctx, observed.samples, g)
    need = (
        None if growth is None else clamp_memory(growth.need_per_ps_mb(ctx, g, ps.count), ctx.node)
    )
    ooms = oom_reactions(observed.events, latest, groups, s, ctx, growth, g)
    ps_ooms = [a for a in ooms if _role(a.node, latest) == "ps"]
    if ps_ooms:
        requested = max(
            (latest[a.node].memory_requested_mb if a.node in latest else ps.memory_mb)
            for a in ps_ooms
        )
        wanted = oom_wanted(requested, "ps", ps.count, s, ctx, growth, g)
        added = ps_oom_adds_ps(wanted, ps, latest, s, ctx)
        if added:
            count = ps.count + added
            share = math.ceil(ps.count * (wanted - RUNTIME_MB) / count)
            ps = NodeGroup(
                count=count, cpu=ps.cpu, memory_mb=clamp_memory(RUNTIME_MB + share, ctx.node)
            )
            take(
                [
                    NodeAction(
                        kind="relaunch",
                        node=a.node,
                        memory_mb=ps.memory_mb,
                        reason=f"PS OOM-killed at {requested}Mi, balanced, needing {wanted:.0f}Mi: "
                        f"more than a pod may have; add {added} PS so that the rows re-partition",
                    )
                    for a in ps_ooms
                ]
            )
            ooms = [a for a in ooms if a not in ps_ooms]
    take(ooms)
    take(oom_predictions(series, now, s, ctx, need))
    take(ps_growth_short(latest, growth, need, current, ctx))
    take(hot_ps(series, s, ctx))
    take(starved_ps(_series(observed.ps_history) if observed.ps_history else series, s))
    take(hung_workers(observed.lease_ages_s or {}, observed.shard_s, s))
    take(slow_workers(observed.samples, s))
    take(pending_too_long(observed.pending_s or {}, groups, s, ctx, observed.pending_why))
    if not actions:
        return None

    # A group's size is what new pods of the role get: it follows the replacements.
    pending = observed.pending_s or {}
    for a in actions:
        role = _role(a.node, latest)
        group = workers if role == "worker" else ps
        if a.kind == "migrate_ps" and a.cpu is not None:
            group = NodeGroup(
                count=group.count, cpu=max(group.cpu, a.cpu), memory_mb=group.memory_mb
            )
        elif a.kind == "relaunch" and a.node in pending:
            group = NodeGroup(
                count=group.count,
                cpu=min(group.cpu, a.cpu or group.cpu),
                memory_mb=min(group.memory_mb, a.memory_mb or group.memory_mb),
            )
        elif a.kind == "relaunch" and a.memory_mb is not None:
            group = NodeGroup(
                count=group.count, cpu=group.cpu, memory_mb=max(group.memory_mb, a.memory_mb)
            )
        if role == "worker":
            workers = group
        else:
            ps = group
    workers, ps, note = _make_room(workers, ps, ctx)
    return ResourcePlan(
        workers=workers,
        ps=ps,
        stage=Stage.POST_SCALE,
        reason="; ".join(f"{a.node}: {a.reason}" for a in actions) + note,
        actions=tuple(actions),
    )


def _role(node: str, latest: Mapping[str, NodeSample]) -> str:
    if node in latest:
        return latest[node].role
    return "ps" if "ps" in node.split("-") else "worker"


def _make_room(
    workers: NodeGroup, ps: NodeGroup, ctx: PlanningContext
) -> tuple[NodeGroup, NodeGroup, str]:
    """Fit the grown plan into the quota (``quota.fit_to_quota``: workers first, then CPU;
    a running job's PS are not dropped to make room). When even that is above the quota, the
    PS growth is capped to the room left, and the reason says so (``quota.OVER_QUOTA``).

    So an OOM whose fix does not fit the quota (a quota equal to a request the job outgrows)
    first grows within the quota by giving up workers, down to ``min_workers``: the job runs
    slower rather than dying. Beyond that the PS gets only the room left; one that had none is
    relaunched as it was, and the job fails clearly once its pods were OOM-killed as often as
    the runtime allows (the simulator's ``elastic_oom_limit``). Never a crash, and never above
    the quota but for the model's own footprint (``at_least_minimum``)."""
    fitted = fit_to_quota(workers, ps, ctx, drop_ps=False, max_trim=0.0)
    workers, ps = fitted.workers, fitted.ps
    note = f"; {fitted.note()}" if fitted.cut else ""
    if not fitted.fits:
        cpu_room = (ctx.quota_cpu - workers.total_cpu) / max(1, ps.count)
        mem_room = (ctx.quota_memory_mb - workers.total_memory_mb) // max(1, ps.count)
        ps = NodeGroup(
            count=ps.count,
            cpu=max(
                ctx.node.min_cpu,
                math.floor(min(ps.cpu, cpu_room) / ctx.node.cpu_step) * ctx.node.cpu_step,
            ),
            memory_mb=int(min(ps.memory_mb, mem_room)),
        )
        note += f"; {OVER_QUOTA}: PS growth capped to the room left"
    # The cap never takes a PS below what it needs to hold its rows (that pod would die): the
    # room for its footprint comes from the workers, down to min_workers, as for any growth.
    floor = at_least_minimum(ps, "ps", ctx)
    if floor == ps:
        return workers, ps, note
    refit = fit_to_quota(workers, floor, ctx, drop_ps=False, max_trim=0.0)
    if refit.fits:
        return refit.workers, refit.ps, note + (f"; {refit.note()}" if refit.cut else "")
    # Not even min_workers beside the PS' footprint fit: the PS keep the room there is, within
    # the quota, and die as they did; the runtime fails the job at its OOM limit, naming it.
    return workers, ps, note + "; the PS' own footprint does not fit beside min_workers"
