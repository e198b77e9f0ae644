"""A chaos run's job master in a process of its own, so that the harness can SIGKILL it.

``python -m tests.chaos.master_proc '<json>'`` runs :func:`tests.chaos.harness.run_chaos` with
the arguments in the JSON (its schedule of pod faults, ``resume`` for a master started again),
writes its progress file while it runs and, if it finishes, its outcome as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from dlrover_kfp.core.documents import to_dict
from tests.chaos.harness import Fault, Injection, run_chaos


def main(argv: list[str]) -> int:
    args = json.loads(argv[1])
    schedule = [Injection(at, Fault(kind), index) for at, kind, index in args["schedule"]]
    result, outcome = run_chaos(
        args["seed"],
        Path(args["tmp"]),
        schedule,
        rows=args["rows"],
        out=Path(args["out"]),
        resume=args["resume"],
        progress_file=Path(args["progress"]),
    )
    fields = dataclasses.asdict(outcome)
    fields["injected"] = [[str(i.fault), i.pod, i.at_s] for i in outcome.injected]
    fields["events"] = [to_dict(e) for e in outcome.events]
    fields["timeline"] = [to_dict(x) for x in outcome.timeline]
    fields["unexplained"] = []
    fields["succeeded"] = result.succeeded
    Path(args["outcome"]).write_text(json.dumps(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
