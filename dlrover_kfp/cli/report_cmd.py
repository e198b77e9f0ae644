"""``dlrover-kfp report``: one run's profile, or one scenario's runs, as an HTML page.

Thin over :mod:`dlrover_kfp.report`: read the profile (a file, or the history's runs of a
scenario), render, write the page atomically. Nothing goes to stdout; where the page went goes
to stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys
from contextlib import closing
from typing import Any

from dlrover_kfp.cli.common import HELP_FORMAT, add_history_option, history_url, positive_int
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.files import read_document, write_atomic
from dlrover_kfp.history import open_history

log = logging.getLogger(__name__)

_DESCRIPTION = """\
Write a self-contained HTML page (charts inline, no external files or URLs) about
  - one run, from its profile (the profile.json that `dlrover-kfp run` writes): the outcome,
    the resource plan over time, throughput with the job's events, each pod's CPU and memory
    used against requested, the resource-performance model fitted on the run's samples
    against what it measured, and the tables of plans and events;
  - a scenario's runs in the history (--history, --scenario), oldest first: JCT, CPU
    utilisation and the start and final plan of each, to see whether scheduled retraining
    gets better. At most --limit runs, the newest.
See docs/reports.md."""

_EPILOG = """\
Examples:
  dlrover-kfp report runs/ctr-local/profile.json -o report.html
  dlrover-kfp report --history sqlite:///runs/history.db --scenario ads-ctr -o ads-ctr.html"""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "report",
        help="an HTML report of one run's profile, or of a scenario's runs in the history",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=HELP_FORMAT,
    )
    parser.add_argument(
        "profile", nargs="?", metavar="PROFILE", help="a job profile (JSON or YAML)"
    )
    parser.add_argument(
        "--scenario", metavar="S", help="report the history's runs of this scenario instead"
    )
    add_history_option(parser)
    parser.add_argument(
        "--limit",
        type=positive_int,
        default=50,
        metavar="N",
        help="with --scenario: at most the N newest runs (default 50)",
    )
    parser.add_argument("-o", "--output", required=True, metavar="HTML", help="the page to write")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # matplotlib takes ~0.6 s to import: only this command pays for it, not every command
    from dlrover_kfp.report import render_run_report, render_scenario_report  # noqa: PLC0415

    if (args.profile is None) == (args.scenario is None):
        raise UserInputError("report: give either PROFILE or --scenario (with --history), not both")
    if args.profile is not None:
        if args.history is not None:
            raise UserInputError("--history: only with --scenario (PROFILE is read from its file)")
        profile = read_document(JobProfile, args.profile)
        page = render_run_report(profile)
        what = f"run {profile.run_id}"
    else:
        with closing(open_history(history_url(args))) as store:
            summaries = store.list(scenario=args.scenario, limit=args.limit)
            profiles = [store.get(s.run_id) for s in summaries]
        page = render_scenario_report(profiles, args.scenario)
        what = f"scenario {args.scenario}, {len(profiles)} run(s)"
    write_atomic(args.output, page)
    print(f"wrote {args.output} ({what})", file=sys.stderr)
    return 0
