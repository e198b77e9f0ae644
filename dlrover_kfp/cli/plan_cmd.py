"""``dlrover-kfp plan``: the resource plan a job should start with."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from dlrover_kfp.cli.common import HELP_FORMAT, add_history_option, emit_json, history_url
from dlrover_kfp.core.documents import to_dict
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.files import read_document
from dlrover_kfp.history import open_history
from dlrover_kfp.planning import plan_job
from dlrover_kfp.ports import SystemClock

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "plan",
        help="plan a job's workers and PS from the history of similar jobs",
        description="Plan a job before it starts: warm start from similar finished jobs in the "
        "history store, or a cold start when there are none. Prints the plan JSON.",
        epilog="Example:\n  dlrover-kfp plan --job examples/ctr-daily.yaml --output plan.json",
        formatter_class=HELP_FORMAT,
    )
    parser.add_argument("--job", required=True, metavar="JOB.yaml", help="the job spec")
    parser.add_argument("--output", metavar="PLAN.json", help="write the plan here, not stdout")
    add_history_option(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    spec = read_document(JobSpec, args.job)
    store = open_history(history_url(args))
    try:
        plan = plan_job(spec, store, SystemClock())
    finally:
        store.close()
    log.info("%s plan: %s", plan.stage.value, plan.reason)
    emit_json(to_dict(plan), args.output)
    return 0
