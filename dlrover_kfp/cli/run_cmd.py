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
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.files import read_document
from dlrover_kfp.history import open_history
from dlrover_kfp.runtime.job import RunSettings, StaticRun

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "run",
        help="run a job's PS and workers to the end; write profile.json, the model, metrics",
        description="Train a job as separate PS and worker processes. With --static the "
        "spec's own resources (resources.workers / resources.ps) are kept for the whole run. "
        "Writes OUTPUT_DIR/profile.json (profile schema v1), OUTPUT_DIR/model/ and the "
        "checkpoints; with --history the profile is also recorded in the history store. "
        "Prints the outcome and metrics as JSON on stdout; progress goes to stderr.",
        epilog="Example:\n  dlrover-kfp run --job examples/ctr-daily.yaml --static "
        "--backend local --output-dir runs/ctr-daily",
        formatter_class=HELP_FORMAT,
    )
    parser.add_argument("--job", required=True, metavar="JOB.yaml", help="the job spec")
    parser.add_argument(
        "--static",
        action="store_true",
        help="keep the spec's own resources for the whole run (required in this version)",
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


def _terminate(signum: int, frame: FrameType | None) -> None:
    # SIGTERM (Kubernetes, Airflow, kill) unwinds like Ctrl-C, so the backend stops every pod.
    raise KeyboardInterrupt


def _run(args: argparse.Namespace) -> int:
    if not args.static:
        print(
            "dlrover-kfp: error: --static: this version runs jobs with the spec's own "
            "resources only; pass --static",
            file=sys.stderr,
        )
        return 2
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
    signal.signal(signal.SIGTERM, _terminate)
    with LocalBackend(output / "logs") as backend:
        run = StaticRun(
            spec,
            backend,
            output_dir=output,
            base_dir=job_path.resolve().parent,
            settings=settings,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
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
