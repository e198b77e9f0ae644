"""Markdown tables for docs/results.md from `dlrover-kfp simulate` output directories.

    python benchmarks/results_tables.py DIR [DIR ...]

Each DIR holds one run's ``results.json`` (one family, one quota regime, one relaunch cost
and one price of a PS-changing resize, several seeds). Prints, per DIR, the policies' table
(mean over seeds, min-max in brackets) and the line of dlrover-kfp against manual that
docs/results.md's targets read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

#: (metric in results.json, label, how a value is shown)
ROWS = (
    ("median_jct", "median JCT (min)", "min"),
    ("p95_jct", "p95 JCT (min)", "min"),
    ("completion_rate", "completion (%)", "pct"),
    ("cpu_utilization", "CPU utilisation (%)", "pct"),
    ("memory_utilization", "memory utilisation (%)", "pct"),
    ("oom_failures", "OOM kills", "count"),
    ("self_inflicted_ooms", "self-inflicted OOM kills", "count"),
    ("infeasible_jobs", "jobs whose plan did not fit the quota", "count"),
    ("warm_started", "warm-started jobs", "count"),
    ("resizes", "resizes", "count"),
    ("ps_resizes", "resizes that changed the PS", "count"),
    ("plan_vs_oracle_final", "final plan's throughput / oracle's best", "ratio"),
    ("plan_vs_oracle_timed", "time-weighted plan throughput / oracle's best", "ratio"),
)


def _show(value: float | None, how: str) -> str:
    if value is None:
        return "-"
    if how == "min":
        return f"{value / 60:.1f}"
    if how == "pct":
        return f"{100 * value:.1f}"
    if how == "ratio":
        return f"{value:.3f}"
    return f"{value:.0f}"


def _cell(spread: dict[str, Any], how: str) -> str:
    mean, low, high = spread["mean"], spread["low"], spread["high"]
    if mean is None:
        return "-"
    if low is None or high is None or _show(low, how) == _show(high, how):
        return _show(mean, how)
    return f"{_show(mean, how)} ({_show(low, how)}-{_show(high, how)})"


def table(results: dict[str, Any]) -> str:
    policies = list(results["policies"])
    lines = [
        "| metric | " + " | ".join(policies) + " |",
        "|---|" + "---|" * len(policies),
    ]
    for key, label, how in ROWS:
        if any(key not in results["policies"][p] for p in policies):
            continue  # a results.json from before the metric was counted
        cells = [_cell(results["policies"][p][key], how) for p in policies]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def against_manual(results: dict[str, Any], policy: str = "dlrover-kfp") -> str:
    """Median JCT change and utilisation points of ``policy`` against manual, per seed mean."""
    mine, manual = results["policies"][policy], results["policies"]["manual"]
    jct = 100 * (mine["median_jct"]["mean"] / manual["median_jct"]["mean"] - 1)
    points = {
        m: 100 * (mine[m]["mean"] - manual[m]["mean"])
        for m in ("completion_rate", "cpu_utilization", "memory_utilization")
    }
    return (
        f"{policy} vs manual: median JCT {jct:+.1f}%, completion {points['completion_rate']:+.1f}"
        f" points, CPU {points['cpu_utilization']:+.1f} points, memory "
        f"{points['memory_utilization']:+.1f} points"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args()
    missing = [str(d) for d in args.dirs if not (d / "results.json").is_file()]
    if missing:
        parser.error(f"no results.json in {', '.join(missing)} (a `dlrover-kfp simulate` output)")
    for d in args.dirs:
        results = json.loads((d / "results.json").read_text())
        faults = results["faults"]
        relaunch = faults.get("relaunch_s")
        ps_resize = faults.get("ps_resize_s", faults.get("elastic_resize_s"))
        print(
            f"### {results['source']}, quota {results['quota']}, relaunch {relaunch:g} s, "
            f"PS-changing resize {ps_resize:g} s, seeds {', '.join(map(str, results['seeds']))}\n"
        )
        print(table(results))
        print(f"\n{against_manual(results)}")
        for policy in results["policies"]:
            if policy.startswith("oracle-"):
                print(against_manual(results, policy))
        print()


if __name__ == "__main__":
    main()
