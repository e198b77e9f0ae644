"""``dlrover-kfp run``: train a job to the end and write its profile, model and metrics."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.cli.common import HELP_FORMAT, add_history_option, history_url
from dlrover_kfp.core.documents import to_dict
from dlrover_kfp.core.observation import Observation
from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.files import read_document
from dlrover_kfp.history import open_history
from dlrover_kfp.planning import plan_job_with_history
from dlrover_kfp.ports import SystemClock
from dlrover_kfp.runtime.elastic import ElasticRun, local_planner_settings
from dlrover_kfp.runtime.job import RunSettings, StaticRun

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "run",
        help="run a job's PS and workers to the end; write profile.json, the model, metrics",
        description="Train a job as separate PS and worker processes. By default the run is "
        "elastic: it starts from Stage 1's plan (warm start from --history's similar jobs, else "
        "the spec's own resources, else a small default), Stage 2 resizes it while it trains "
        "(worker changes live; a PS change stops the workers, checkpoints and restarts the PS "
        "re-partitioned), and failed workers are relaunched (bigger after an OOM) until one "
        "fails 3 times in 10 minutes. With --static the spec's own resources are kept for the "
        "whole run and a failed pod fails it. Writes OUTPUT_DIR/profile.json (profile schema "
        "v1, with every plan applied and every event), OUTPUT_DIR/model/ and the checkpoints; "
        "with --history the profile is also recorded in the history store, failed runs "
        "included. Prints the outcome and metrics as JSON on stdout; progress goes to stderr.",
        epilog="Examples:\n  dlrover-kfp run --job examples/ctr-local.yaml --backend local "
        "--output-dir runs/ctr-local --history sqlite:///runs/history.db\n"
        "  dlrover-kfp run --job examples/ctr-daily.yaml --static --backend local "
        "--output-dir runs/ctr-daily",
        formatter_class=HELP_FORMAT,
    )
    parser.add_argument("--job", required=True, metavar="JOB.yaml", help="the job spec")
    parser.add_argument(
        "--static",
        action="store_true",
        help="keep the spec's own resources for the whole run (no planning, no relaunch)",
    )
    parser.add_argument("--backend", choices=("local",), default="local", help="where pods run")
    parser.add_argument("--output-dir", required=True, metavar="DIR", help="where results go")
    parser.add_argument(
        "--checkpoint-interval",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds between flash checkpoints (0: only the final one; default 60)",
    )
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between runtime samples and progress lines (default 2)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial model")
    add_history_option(parser)
    parser.set_defaults(func=_run)


def _stage_1(
    spec: JobSpec, url: str | None, planner: PlannerSettings
) -> tuple[ResourcePlan, list[Observation]]:
    """Stage 1's plan and the similar jobs' measurements (none without a history store)."""
    if url is None:
        return plan_job_with_history(spec, None, SystemClock(), planner)
    store = open_history(url)
    try:
        return plan_job_with_history(spec, store, SystemClock(), planner)
    finally:
        store.close()


def _terminate(signum: int, frame: FrameType | None) -> None:
    # SIGTERM (Kubernetes, Airflow, kill) unwinds like Ctrl-C, so the backend stops every pod.
    raise KeyboardInterrupt


def _run(args: argparse.Namespace) -> int:
    for name in ("checkpoint_interval", "sample_interval"):
        if getattr(args, name) < 0 or (name == "sample_interval" and args.sample_interval == 0):
            flag = "--" + name.replace("_", "-")
            print(f"dlrover-kfp: error: {flag}: must be positive", file=sys.stderr)
            return 2
    job_path = Path(args.job)
    spec = read_document(JobSpec, job_path)
    url = history_url(args) if args.history else None
    output = Path(args.output_dir)
    settings = RunSettings(
        checkpoint_interval_s=args.checkpoint_interval,
        sample_interval_s=args.sample_interval,
        seed=args.seed,
    )

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    run: StaticRun
    signal.signal(signal.SIGTERM, _terminate)
    with LocalBackend(output / "logs") as backend:
        if args.static:
            run = StaticRun(
                spec,
                backend,
                output_dir=output,
                base_dir=job_path.resolve().parent,
                settings=settings,
                progress=progress,
            )
        else:
            planner = local_planner_settings()
            plan, known = _stage_1(spec, url, planner)
            progress(f"{spec.name}: starting plan ({plan.stage.value}): {plan.reason}")
            run = ElasticRun(
                spec,
                backend,
                plan=plan,
                planner=planner,
                output_dir=output,
                base_dir=job_path.resolve().parent,
                settings=settings,
                progress=progress,
                known=known,
            )
        result = run.run()
    profile = result.profile
    if url is not None:
        store = open_history(url)
        try:
            new = store.record(profile)
        finally:
            store.close()
        log.info("history: %s %s", "recorded" if new else "already had", profile.run_id)
    summary = {
        "run_id": profile.run_id,
        "outcome": to_dict(profile.outcome),
        "metrics": to_dict(profile.metrics),
        "profile": str(output / "profile.json"),
        "model": str(result.model_dir) if result.model_dir else None,
    }
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0 if result.succeeded else 1
