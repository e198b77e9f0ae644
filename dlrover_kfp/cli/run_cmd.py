"""``dlrover-kfp run``: train a job to the end and write its profile, model and metrics."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dlrover_kfp.cli.common import HELP_FORMAT, add_history_option, history_url
from dlrover_kfp.core.documents import to_dict
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.files import read_document
from dlrover_kfp.runtime.job import RunSettings
from dlrover_kfp.runtime.launch import run_local, unwind_on_sigterm


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "run",
        help="run a job's PS and workers to the end; write profile.json, the model, metrics",
        description="Train a job as separate PS and worker processes. By default the run is "
        "elastic: it starts from Stage 1's plan (warm start from --history's similar jobs, else "
        "the spec's own resources, else a small default), Stage 2 resizes it while it trains "
        "and Stage 3 acts on instability (worker changes live; a PS change or a hot PS moves "
        "the PS to new pods while training goes on, paused only for the switch), failed "
        "workers are relaunched (bigger after an OOM) until one fails 3 times in 10 minutes, "
        "and a failed PS rolls the job back to its last checkpoint. A run whose master was "
        "killed resumes from its last checkpoint when the same command is run again. With "
        "--static the spec's own resources are kept for the whole run and a failed pod fails "
        "it. Writes OUTPUT_DIR/profile.json (profile schema "
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

    unwind_on_sigterm()
    result = run_local(
        spec,
        output_dir=output,
        base_dir=job_path.resolve().parent,
        settings=settings,
        progress=progress,
        history_url=url,
        static=args.static,
        resume=True,
    )
    profile = result.profile
    summary = {
        "run_id": profile.run_id,
        "outcome": to_dict(profile.outcome),
        "metrics": to_dict(profile.metrics),
        "profile": str(output / "profile.json"),
        "model": str(result.model_dir) if result.model_dir else None,
    }
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0 if result.succeeded else 1
