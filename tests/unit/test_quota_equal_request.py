"""Stage 1 with a quota equal to the user's request (the simulator's ``--quota request``): warm
and cold start always give a plan within the quota, never an error, over a wide range of
requests, models and histories; where the history's needs do not fit, the plan is the request
and says why. The CLI's path (``dlrover-kfp plan``) gives a plan or a one-line error. Stage 3
grows an OOM-killed pod only within the quota."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from dlrover_kfp.cli.main import main
from dlrover_kfp.core.documents import parse, to_json
from dlrover_kfp.core.plan import ResourcePlan, Stage
from dlrover_kfp.core.planner import (
    Instability,
    PlannerSettings,
    context_from_spec,
    post_scale,
    warm_start,
)
from dlrover_kfp.core.planner.quota import over_quota
from dlrover_kfp.core.planner.warm_start import cold_start
from dlrover_kfp.core.profile import JobEvent
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.core.summary import JobSummary, parse_timestamp, summarize
from dlrover_kfp.errors import SpecError
from dlrover_kfp.history.memory import InMemoryHistoryStore
from dlrover_kfp.planning import plan_job_with_history
from dlrover_kfp.ports import FixedClock
from tests.factories import DEFAULT_TABLES, make_profile
from tests.unit.test_post_scale import PLAN, node, samples

SETTINGS = PlannerSettings()
NOW = parse_timestamp("2026-11-21T00:00:00Z")
TABLES = (tuple(DEFAULT_TABLES), (1_000, 2_000, 500), (2_000_000,) * 4, (8_000_000,) * 6)
CPUS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
#: 512 MiB to 64 GiB, in steps a user writes
MEMORY_MB = st.integers(2, 256).map(lambda k: k * 256)


def held_to_request(
    tables: tuple[int, ...],
    workers: tuple[int, float, int],
    ps: tuple[int, float, int],
) -> JobSpec:
    """A job whose ``resources.limits`` are the totals of its own request."""
    (w, wc, wm), (p, pc, pm) = workers, ps
    return parse(
        JobSpec,
        {
            "name": "ctr-daily",
            "scenario": "ads-ctr",
            "model": {"table_sizes": list(tables)},
            "data": {"format": "synthetic", "rows": 200_000},
            "training": {"batch_size": 512},
            "resources": {
                "limits": {"cpu": w * wc + p * pc, "memory": f"{w * wm + p * pm}Mi"},
                "workers": {"count": w, "cpu": wc, "memory": f"{wm}Mi"},
                "ps": {"count": p, "cpu": pc, "memory": f"{pm}Mi"},
            },
        },
        "test",
    )


def requests(max_count: int) -> st.SearchStrategy[tuple[int, float, int]]:
    return st.tuples(st.integers(1, max_count), st.sampled_from(CPUS), MEMORY_MB)


@st.composite
def histories(draw: st.DrawFn, tables: tuple[int, ...]) -> list[JobSummary]:
    """0-5 earlier runs of the same job, with any request, any share of it used and OOMs or
    not: some needed far more memory than the new request holds, some far less."""
    out = []
    for k in range(draw(st.integers(0, 5))):
        (w, wc, wm), (p, pc, pm) = draw(requests(16)), draw(requests(8))
        out.append(
            summarize(
                make_profile(
                    run_id=f"run-{k}",
                    started_at=NOW - (k + 1) * 86400.0,
                    table_sizes=tables,
                    workers=w,
                    worker_cpu=wc,
                    worker_memory_mb=wm,
                    ps=p,
                    ps_cpu=pc,
                    ps_memory_mb=pm,
                    used_fraction=draw(st.floats(0.05, 1.0)),
                    memory_used_fraction=draw(st.floats(0.05, 1.0)),
                    throughput=draw(st.floats(1e3, 1e5)),
                    oom_events=draw(st.integers(0, 2)),
                )
            )
        )
    return out


@st.composite
def cases(draw: st.DrawFn) -> tuple[JobSpec, list[JobSummary]]:
    tables = draw(st.sampled_from(TABLES))
    try:
        spec = held_to_request(tables, draw(requests(16)), draw(requests(8)))
    except SpecError:
        reject()  # limits too small for one worker and one PS of the model: refused as a spec
    return spec, draw(histories(tables))


def check_plans(case: tuple[JobSpec, list[JobSummary]]) -> None:
    """Cold start is the request; warm start is within the quota, and is the request where it
    says the planner's needs exceed the quota."""
    spec, history = case
    ctx = context_from_spec(spec, SETTINGS)
    res = spec.resources
    assert res.workers is not None and res.ps is not None and res.limits is not None
    request = (res.workers.to_group(), res.ps.to_group())
    cold = cold_start(spec, ctx, SETTINGS)
    assert (cold.workers, cold.ps) == request
    plan = warm_start(spec, ctx, history, SETTINGS, NOW)
    assert plan.total_cpu <= res.limits.cpu + 1e-9, plan
    assert plan.total_memory_mb <= res.limits.memory, plan
    if over_quota(plan.reason):
        assert plan.stage is Stage.WARM_START and (plan.workers, plan.ps) == request, plan


# A warm start that fits a model searches its whole space (~0.1 s): a dozen cases in the
# default suite, the wide sweep opt-in.
@settings(max_examples=12, deadline=None, database=None, derandomize=True)
@given(cases())
def test_warm_and_cold_start_never_fail_when_the_quota_is_the_request(
    case: tuple[JobSpec, list[JobSummary]],
) -> None:
    check_plans(case)


@pytest.mark.long  # ~7 s: 150 cases
@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(cases())
def test_warm_and_cold_start_never_fail_when_the_quota_is_the_request_wide(
    case: tuple[JobSpec, list[JobSummary]],
) -> None:
    check_plans(case)


def test_the_fallback_is_the_request_with_its_reason() -> None:
    # The earlier run's PS used 3 x 16 GiB and were OOM-killed; the new request holds 8 GiB in
    # all: no plan from that history fits, so the job runs what the user asked for.
    spec = held_to_request(tuple(DEFAULT_TABLES), (2, 2.0, 2048), (2, 2.0, 2048))
    big = make_profile(
        run_id="big",
        started_at=NOW - 86400.0,
        ps=3,
        ps_memory_mb=16384,
        memory_used_fraction=0.95,
        oom_events=1,
    )
    plan = warm_start(spec, context_from_spec(spec, SETTINGS), [summarize(big)], SETTINGS, NOW)
    assert plan.stage is Stage.WARM_START and plan.similar_jobs == ("big",)
    assert (plan.workers.count, plan.workers.memory_mb, plan.ps.count, plan.ps.memory_mb) == (
        2,
        2048,
        2,
        2048,
    )
    assert "the planner's needs exceed the quota" in plan.reason
    assert "the user's own request instead" in plan.reason
    # The path the CLI and the pipelines take: the same plan, and the similar job's points.
    store = InMemoryHistoryStore()
    store.record(big)
    via, known = plan_job_with_history(spec, store, FixedClock(NOW), SETTINGS)
    assert (via.workers, via.ps) == (plan.workers, plan.ps) and known


SPEC = """\
name: ctr-daily
scenario: ads-ctr
model: {table_sizes: [1000, 2000, 3000]}
data: {format: synthetic, rows: 200000}
training: {batch_size: 512}
resources:
  limits: {cpu: 8, memory: 8Gi}
"""
REQUEST = """\
  workers: {count: 2, cpu: 2, memory: 2Gi}
  ps: {count: 2, cpu: 2, memory: 2Gi}
"""


def test_dlrover_kfp_plan_gives_a_plan_or_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = str(tmp_path / "h.db")
    # An earlier run needed 3 x 16 GiB of PS and was OOM-killed; the quota is the request.
    big = make_profile(
        run_id="big",
        table_sizes=(1000, 2000, 3000),
        started_at=time.time() - 86400.0,
        ps=3,
        ps_memory_mb=16384,
        memory_used_fraction=0.95,
        oom_events=1,
    )
    (tmp_path / "big.json").write_text(to_json(big))
    assert main(["record", "--profile", str(tmp_path / "big.json"), "--history", history]) == 0
    capsys.readouterr()
    (tmp_path / "job.yaml").write_text(SPEC + REQUEST)
    code = main(["plan", "--job", str(tmp_path / "job.yaml"), "--history", history])
    out, _ = capsys.readouterr()
    assert code == 0
    plan = json.loads(out)
    assert plan["stage"] == Stage.WARM_START and plan["similar_jobs"] == ["big"]
    assert (plan["workers"]["count"], plan["ps"]["count"]) == (2, 2)
    # Without a request of its own there is nothing to fall back to: a one-line error, exit 2.
    (tmp_path / "bare.yaml").write_text(SPEC.replace("cpu: 8, memory: 8Gi", "cpu: 8, memory: 1Gi"))
    code = main(["plan", "--job", str(tmp_path / "bare.yaml"), "--history", history])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("dlrover-kfp: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


# Stage 3 with a quota equal to the request: 4 workers x 4 cpu / 4Gi and 2 PS x 4 cpu / 8Gi.
HELD = parse(
    JobSpec,
    {
        "name": "unstable",
        "model": {"table_sizes": [100_000] * 8},
        "data": {"format": "synthetic", "rows": 1_000_000},
        "training": {"batch_size": 512},
        "resources": {
            "limits": {"cpu": 24, "memory": "32Gi"},
            "workers": {"count": 4, "cpu": 4, "memory": "4Gi"},
            "ps": {"count": 2, "cpu": 4, "memory": "8Gi"},
        },
    },
    "test",
)


def oom_plan(node_name: str) -> ResourcePlan | None:
    """Stage 3's answer to an OOM kill of ``node_name`` in a job running its request (the PS
    unevenly loaded, so a PS's fix is memory, not more PS)."""
    ctx = context_from_spec(HELD, SETTINGS)
    uneven: dict[str, object] = {"job-ps-0": lambda i: node("job-ps-0", mem=8000)}
    window = samples(3, uneven)
    event = JobEvent(time=60.0, kind="oom", node=node_name, detail="OOMKilled")
    return post_scale(ctx, PLAN, Instability(window, [event]), window[-1].time, SETTINGS)


def test_an_oom_fix_beyond_the_quota_gives_up_workers_then_grows_only_within_it() -> None:
    assert (PLAN.total_cpu, PLAN.total_memory_mb) == (24, 32 * 1024)  # the request, the quota
    # A worker's fix fits once two workers are given up: no fall-back.
    worker = oom_plan("job-worker-2")
    assert worker is not None and worker.workers.count == 2 and worker.workers.memory_mb == 8192
    assert worker.total_memory_mb <= 32 * 1024 and not over_quota(worker.reason)
    # A PS's (2 x 16Gi) does not fit even with one worker left: the PS grow into the room left.
    ps = oom_plan("job-ps-0")
    assert ps is not None and ps.workers.count == 1
    assert 8192 < ps.ps.memory_mb < 16384
    assert ps.total_memory_mb <= 32 * 1024 and ps.total_cpu <= 24
    assert over_quota(ps.reason), ps.reason
