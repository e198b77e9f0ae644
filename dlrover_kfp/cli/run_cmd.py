"""``dlrover-kfp run``: train a job to the end and write its profile, model and metrics."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from dlrover_kfp.cli.common import HELP_FORMAT, add_history_option, history_url
from dlrover_kfp.cli.progress import TerminalProgress
from dlrover_kfp.core.documents import to_dict
from dlrover_kfp.core.plan import ResourcePlan, Stage
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.errors import EXIT_FAILED_RUN, UserInputError
from dlrover_kfp.files import read_document
from dlrover_kfp.planning import plan_start
from dlrover_kfp.runtime.job import static_groups
from dlrover_kfp.runtime.kube import (
    DEFAULT_MOUNT_PATH,
    KubeOptions,
    dry_run_manifests,
    kube_settings,
    master_host,
    run_kubernetes,
)
from dlrover_kfp.runtime.launch import record_run, run_local, unwind_on_sigterm
from dlrover_kfp.runtime.metrics import DEFAULT_METRICS_PORT
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.steps.spec import load_spec_file


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
    parser.add_argument(
        "--backend",
        choices=("local", "kubernetes"),
        default="local",
        help="where pods run: local processes, or pods in a Kubernetes namespace",
    )
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
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start a new run even if OUTPUT_DIR holds an unfinished one (by default it is "
        "resumed, and refused if its job spec or data changed since): the earlier run's files "
        "move to OUTPUT_DIR/archive/<its run id>/",
    )
    parser.add_argument(
        "--plan",
        metavar="PLAN.json",
        help="start from this plan (`dlrover-kfp plan`'s output, a pipeline's plan step) "
        "instead of planning the start; with --history, Stage 2 reads the measurements of the "
        "similar jobs the plan names",
    )
    parser.add_argument(
        "--run-id",
        metavar="ID",
        help="the run's id in the history (default: NAME-TIME-RANDOM, unique across hosts). An "
        "orchestrator gives every "
        "attempt of one logical run the same id, so that a re-run replaces its earlier attempt "
        "in the history instead of adding a second run (a DNS label: a-z, 0-9, '-', <= 63)",
    )
    parser.add_argument(
        "--no-record",
        action="store_true",
        help="with --history: read it, but leave recording the profile to `dlrover-kfp "
        "record` (a pipeline's record step); a failed run is recorded all the same",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve the job master's Prometheus metrics at http://HOST:PORT/metrics while it "
        f"runs (docs/observability.md); 0: none. Default: {DEFAULT_METRICS_PORT} on all "
        "interfaces for a --backend kubernetes master in a pod (its `metrics` port); none "
        "elsewhere (runs on one machine would share a port)",
    )
    kube = parser.add_argument_group("kubernetes (with --backend kubernetes)")
    kube.add_argument("--namespace", metavar="NS", help="the namespace of the job's pods")
    kube.add_argument("--image", metavar="IMG", help="the pods' image (deploy/Dockerfile)")
    kube.add_argument("--kubeconfig", metavar="FILE", help="default: in-cluster, else KUBECONFIG")
    kube.add_argument("--context", help="the kubeconfig context (default: its current one)")
    kube.add_argument(
        "--claim",
        metavar="PVC",
        help="a PersistentVolumeClaim mounted in every pod at --mount-path; --output-dir must "
        "be on it (the PS persist checkpoints there)",
    )
    kube.add_argument("--mount-path", default=DEFAULT_MOUNT_PATH, metavar="PATH")
    kube.add_argument(
        "--master-host",
        metavar="HOST",
        help="the address the pods reach the job master at (default: POD_IP, set in-cluster)",
    )
    kube.add_argument(
        "--dry-run",
        action="store_true",
        help="print the Secret (values redacted) and pods the run would create first, as YAML, "
        "and exit (like kubectl --dry-run=client -o yaml)",
    )
    add_history_option(parser)
    parser.set_defaults(func=_run)


#: a pod label value and DNS-1123 label: the run id labels every pod of the run
_RUN_ID = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _kube_options(args: argparse.Namespace) -> KubeOptions:
    for flag in ("namespace", "image"):
        if not getattr(args, flag):
            raise UserInputError(f"--backend kubernetes: --{flag} is required")
    return KubeOptions(
        namespace=args.namespace,
        image=args.image,
        kubeconfig=args.kubeconfig,
        context=args.context,
        claim=args.claim,
        mount_path=args.mount_path,
        master_host=args.master_host,
    )


def _dry_run(spec: JobSpec, kube: KubeOptions, options: RunOptions) -> int:
    planner = PlannerSettings()
    if options.static:
        workers, ps = static_groups(spec)
        plan = ResourcePlan(workers=workers, ps=ps, stage=Stage.MANUAL, reason="--static")
    elif options.plan is None:
        plan, _ = plan_start(spec, options.history_url, planner)
    else:
        plan = options.plan
    run_id = f"{spec.name}-dry-run"
    manifests = dry_run_manifests(spec, plan, options.settings, kube_settings(kube), run_id)
    sys.stdout.write(
        f"# {spec.name}: starting plan ({plan.stage.value}): {plan.reason}\n"
        "# the job master's port is chosen when it starts: --master shows port 0\n"
    )
    sys.stdout.write(yaml.safe_dump_all(manifests, sort_keys=False))
    return 0


def _settings(args: argparse.Namespace, kube: KubeOptions | None) -> RunSettings:
    """The run's settings from the flags; on Kubernetes the pods run the image's interpreter
    (not this one's path) and reach the master at its address; a dry run, which starts no
    master, prints ``--master-host`` or, without it, the literal ``<master-ip>`` to fill in."""
    settings = RunSettings(
        checkpoint_interval_s=args.checkpoint_interval,
        sample_interval_s=args.sample_interval,
        seed=args.seed,
        metrics_port=args.metrics_port,  # None: the backend's default
    )
    if kube is None:
        return settings
    host = (args.master_host or "<master-ip>") if args.dry_run else master_host(kube)
    return dataclasses.replace(settings, master_host=host, python="python")


def _run(args: argparse.Namespace) -> int:
    for name in ("checkpoint_interval", "sample_interval"):
        if getattr(args, name) < 0 or (name == "sample_interval" and args.sample_interval == 0):
            flag = "--" + name.replace("_", "-")
            print(f"dlrover-kfp: error: {flag}: must be positive", file=sys.stderr)
            return 2
    loaded = load_spec_file(Path(args.job))
    spec = loaded.spec
    url = history_url(args) if args.history else None
    plan = read_document(ResourcePlan, args.plan) if args.plan else None
    if plan is not None and args.static:
        raise UserInputError("--plan: not with --static (a static run keeps the spec's resources)")
    if args.dry_run and args.backend != "kubernetes":
        raise UserInputError("--dry-run: only with --backend kubernetes")
    kube = _kube_options(args) if args.backend == "kubernetes" else None
    if args.run_id is not None and not _RUN_ID.fullmatch(args.run_id):
        raise UserInputError(
            f"--run-id {args.run_id!r}: must be a DNS label (lower-case letters, digits and "
            "'-', starting and ending with a letter or digit, at most 63 characters)"
        )
    options = RunOptions(
        output_dir=Path(args.output_dir),
        base_dir=loaded.base_dir,
        settings=_settings(args, kube),
        history_url=url,
        static=args.static,
        resume=True,
        fresh=args.fresh,
        record=not args.no_record,
        plan=plan,
        run_id=args.run_id,
    )
    if kube is not None and args.dry_run:
        return _dry_run(spec, kube, options)
    run = functools.partial(run_local, spec)
    if kube is not None:
        run = functools.partial(run_kubernetes, spec, kube)
    unwind_on_sigterm()
    with TerminalProgress(f"{spec.name}: samples") as progress:
        result = run(options, progress=progress)
        if url is not None and not options.record and not result.succeeded:
            result = record_run(url, result, progress)
    profile = result.profile
    summary = {
        "run_id": profile.run_id,
        "outcome": to_dict(profile.outcome),
        "metrics": to_dict(profile.metrics),
        "profile": str(options.output_dir / "profile.json"),
        "model": str(result.model_dir) if result.model_dir else None,
    }
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0 if result.succeeded else EXIT_FAILED_RUN
