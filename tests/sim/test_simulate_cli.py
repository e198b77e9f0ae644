"""``dlrover-kfp simulate`` as a user meets it: the table, results.json, the trace, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlrover_kfp.cli.main import main
from dlrover_kfp.sim.cluster.results import METRICS, format_table, spread
from dlrover_kfp.sim.cluster.trace import read_trace, write_trace
from tests.sim.test_engine import make_job


def test_synthetic_comparison_writes_results_and_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    policies = ["--policies", "manual,dlrover-kfp"]
    code = main(["simulate", "--synthetic", "20", "--seeds", "2", *policies, "--output", str(out)])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert "median_jct" in stdout and "dlrover-kfp vs manual" in stdout
    assert "seed 1: dlrover-kfp done" in stderr  # progress while it runs
    document = json.loads((out / "results.json").read_text())
    assert set(document["policies"]) == {"manual", "dlrover-kfp"}
    for metrics in document["policies"].values():
        assert set(metrics) == set(METRICS)
        assert 0.0 <= metrics["completion_rate"]["mean"] <= 1.0
    # What each policy did is counted: manual never learns, relaunches a pod alone or plans
    # below its own request (tests/sim/test_counters.py checks the counts where they are not 0).
    manual = document["policies"]["manual"]
    for counter in ("warm_started", "relaunches", "self_inflicted_ooms"):
        assert manual[counter] == {"mean": 0.0, "low": 0.0, "high": 0.0, "stdev": 0.0}
    assert [s["seed"] for s in document["per_seed"]] == [0, 1]
    for plot in ("jct_cdf.svg", "utilisation.svg"):
        text = (out / plot).read_text()
        assert text.startswith("<") and "dlrover-kfp" in text and "manual" in text
    # The trace written beside the results replays.
    jobs = read_trace(out / "trace.jsonl")
    assert len(jobs) == 20
    replay_dir = str(tmp_path / "replay")
    code = main(
        [
            "simulate",
            "--trace",
            str(out / "trace.jsonl"),
            "--policies",
            "manual",
            "--output",
            replay_dir,
        ]
    )
    assert code == 0
    replay = json.loads((tmp_path / "replay" / "results.json").read_text())
    first = next(s for s in document["per_seed"][0]["summaries"] if s["policy"] == "manual")
    assert replay["per_seed"][0]["summaries"][0] == first


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--synthetic", "5", "--policies", "manual,magic"], "--policies"),
        (["--synthetic", "0"], "--synthetic"),
        (["--synthetic", "5", "--seeds", "0"], "--seeds"),
        (["--trace", "nope.jsonl"], "nope.jsonl"),
        (["--synthetic", "5", "--throughput-floor", "1.5"], "--throughput-floor"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code = main(["simulate", *argv, "--output", str(tmp_path / "o")])
    _, err = capsys.readouterr()
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err


def test_family_stragglers_scale_objective_and_quota_reach_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["simulate", "--synthetic", "12", "--family", "trainer", "--stragglers", "off"]
    argv += ["--cluster-scale", "0.5", "--objective", "cost", "--throughput-floor", "0.6"]
    argv += ["--relaunch-s", "60", "--quota", "request"]
    code = main([*argv, "--policies", "manual,dlrover-kfp", "--output", str(out)])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert stdout.startswith("quota regime: request (every policy held to the user's own request")
    document = json.loads((out / "results.json").read_text())
    assert document["quota"] == "request"
    assert "infeasible_jobs" in document["policies"]["dlrover-kfp"]
    assert document["source"] == "synthetic 12 jobs (trainer)"
    assert document["faults"]["stragglers"] is False
    assert document["faults"]["relaunch_s"] == 60.0
    assert document["cluster_scale"] == 0.5
    assert document["planner"] == {"objective": "cost", "throughput_floor": 0.6}
    full = read_trace(out / "trace.jsonl")
    assert all(j.truth.throughput.family == "trainer" for j in full)
    nodes = int(stderr.split(" jobs on ")[1].split(" nodes")[0])
    code = main(["simulate", "--synthetic", "12", "--policies", "manual", "--output", str(out)])
    table, again = capsys.readouterr()
    assert table.startswith("quota regime: headroom")
    assert json.loads((out / "results.json").read_text())["quota"] == "headroom"
    assert nodes == max(1, round(int(again.split(" jobs on ")[1].split(" nodes")[0]) * 0.5))
    # The relaunch cost's default is DLRover-RM's ~3 minutes.
    assert json.loads((out / "results.json").read_text())["faults"]["relaunch_s"] == 180.0


def test_the_resize_prices_reach_the_run_and_results_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["simulate", "--synthetic", "5", "--policies", "manual", "--output", str(out)]
    assert main(argv) == 0
    stdout, _ = capsys.readouterr()
    assert stdout.splitlines()[1] == (
        "prices: elastic resize changing the PS 62.14 s, of the workers alone 60 s; "
        "pod relaunch 180 s; checkpoint-and-restart resize 300 s"
    )
    document = json.loads((out / "results.json").read_text())
    assert document["faults"]["ps_resize_s"] == 62.14
    assert document["prices"]["ps_resize_s"] == 62.14
    assert document["prices"]["ps_resize_s_from"].startswith("default: 60 s cluster pod start")
    assert document["prices"]["elastic_resize_s"] == 60.0
    assert main([*argv, "--ps-resize-s", "180"]) == 0
    document = json.loads((out / "results.json").read_text())
    assert document["faults"]["ps_resize_s"] == 180.0
    assert document["prices"]["ps_resize_s_from"] == "--ps-resize-s"
    assert document["faults"]["relaunch_s"] == 180.0  # each price its own flag


def test_a_trace_longer_than_sixty_days_is_simulated_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Arrivals over 120 days; the simulator stopped at 60 until issue 44 and reported only
    # the jobs that had arrived by then.
    day = 86400.0
    jobs = [make_job(f"job-{d:03d}", arrival_s=d * day) for d in (0, 59, 61, 120)]
    write_trace(tmp_path / "long.jsonl", jobs, description="four jobs over 120 days")
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(tmp_path / "long.jsonl"), "--policies", "manual"]
    assert main([*argv, "--stragglers", "off", "--output", str(out)]) == 0
    capsys.readouterr()
    (summary,) = json.loads((out / "results.json").read_text())["per_seed"][0]["summaries"]
    assert summary["jobs"] == 4
    assert summary["never_started"] == 0
    assert summary["failed_jobs"].get("never finished", 0) == 0


@pytest.mark.parametrize("flag", ["--cluster-scale", "--throughput-floor", "--ps-resize-s"])
def test_a_non_positive_number_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--synthetic", "5", flag, "-1", "--output", str(tmp_path / "o")])
    assert exit_info.value.code == 2
    assert "must be a number above 0" in capsys.readouterr().err


def test_table_columns_stay_apart_when_seeds_spread() -> None:
    # Three seeds give "mean (min-max)" cells, wider than one value; the spread carries no unit.
    table = {
        policy: {
            m: spread([base * 60 * k for k in (1.0, 1.1, 1.3)])
            if m.endswith("jct")
            else spread([0.2 * k for k in (1.0, 1.1, 1.3)])
            for m in METRICS
        }
        for policy, base in (("manual", 157.6), ("a-much-longer-policy-name", 43.4))
    }
    lines = format_table(table).splitlines()
    rows = lines[: 2 + len(METRICS)]
    assert len({len(line) for line in rows}) == 1, "every row as wide as the header"
    median = next(line for line in rows if line.startswith("median_jct"))
    assert "178.6 min (157.6-204.9)  " in median, median
    assert median.endswith("49.2 min (43.4-56.4)")
