"""``dlrover-kfp compile``: the KFP components and pipeline as YAML."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dlrover_kfp.cli.common import HELP_FORMAT
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.steps.image import check_image, pipeline_image


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "compile",
        help="compile the KFP components and the plan -> train -> record pipeline to YAML",
        description="Compile the Kubeflow Pipelines components plan_resources, elastic_train "
        "and record_profile and the pipeline elastic_dlrm_pipeline (parameters job_spec, "
        "history_url, backend, claim) to plan_resources.yaml, elastic_train.yaml, "
        "record_profile.yaml and elastic_dlrm_pipeline.yaml. Load a component with "
        "kfp.components.load_component_from_file; submit the pipeline with the KFP UI or "
        "client. Needs the kfp extra (pip install 'dlrover-kfp[kfp]').",
        epilog="Examples:\n  dlrover-kfp compile                      # the package's components/\n"
        "  dlrover-kfp compile --output-dir build/kfp "
        "--image registry.example.com/ml/dlrover-kfp:0.1.0",
        formatter_class=HELP_FORMAT,
    )
    parser.add_argument(
        "--output-dir",
        metavar="DIR",
        help="where the YAML goes (default: the components/ directory of this installation)",
    )
    parser.add_argument(
        "--image",
        metavar="REGISTRY/NAME:TAG",
        help="the image of the components and of the job's worker and PS pods, fully "
        "qualified (default: $DLROVER_KFP_IMAGE, else registry.invalid/dlrover-kfp:VERSION, "
        "which no registry serves: see docs/kfp.md)",
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        from components.build import HERE, compile_all  # noqa: PLC0415  (kfp: an extra)
    except ImportError as exc:
        raise UserInputError(
            f"compile: the KFP components need the kfp extra ({exc}); "
            "pip install 'dlrover-kfp[kfp]'"
        ) from None
    image = check_image(args.image, "--image") if args.image else pipeline_image()
    out = Path(args.output_dir) if args.output_dir else HERE
    for path in compile_all(out, image):
        print(f"wrote {path}", file=sys.stderr)
    return 0
