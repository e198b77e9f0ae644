"""``dlrover-kfp schema {job,plan,profile}``: print a contract's JSON Schema."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dlrover_kfp.core.documents import json_schema
from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.spec import JobSpec

SCHEMAS: dict[str, type[Any]] = {"job": JobSpec, "plan": ResourcePlan, "profile": JobProfile}


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "schema",
        help="print the JSON Schema of a job spec, plan or profile",
        description="Print the JSON Schema (draft 2020-12) of one of the public documents.",
        epilog="Example: dlrover-kfp schema job > job.schema.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("document", choices=sorted(SCHEMAS))
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    print(json.dumps(json_schema(SCHEMAS[args.document]), indent=2))
    return 0
