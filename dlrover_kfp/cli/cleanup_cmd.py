"""``dlrover-kfp cleanup``: remove what a master killed by SIGKILL left of its run.

A master stopped by Ctrl-C, SIGTERM or SIGHUP cleans up itself; one killed by SIGKILL leaves
its local pods running, their cgroups and the PS's shared memory. The next run in the same
output directory removes them before it starts; this command does it now, without running
anything (to free the machine, or before a run elsewhere). The run stays resumable.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dlrover_kfp.cli.common import HELP_FORMAT
from dlrover_kfp.errors import EXIT_FAILED_RUN, UserInputError
from dlrover_kfp.runtime.leftovers import reap_leftovers
from dlrover_kfp.runtime.rundir import OutputDirLock


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "cleanup",
        help="remove the pods, cgroups and shared memory a killed run's master left behind",
        description="Remove what an earlier `dlrover-kfp run` into DIR left on this "
        "machine when its master was killed without a chance to clean up (SIGKILL, a crash): "
        "its local pods' processes (found by the mark each pod carries in its environment and "
        "by the run's cgroups; no other process is touched), the run's cgroups in every "
        "hierarchy, and the pods' shared-memory directories (/dev/shm). The run file "
        "and committed checkpoints stay: the same `run` command then resumes the run. The next "
        "run in DIR does the same by itself before it starts. Refused (exit 2) while a "
        "live master holds DIR. Prints one line per thing removed on stdout; exits 1 if "
        "something could not be removed.",
        epilog="Example:\n  dlrover-kfp cleanup --output-dir runs/ctr-local",
        formatter_class=HELP_FORMAT,
    )
    parser.add_argument(
        "--output-dir", required=True, metavar="DIR", help="the run's output directory"
    )
    parser.add_argument(
        "--run-id",
        metavar="ID",
        help="whose shared memory to release (default: the unfinished run's, from DIR/run.json)",
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    output = Path(args.output_dir)
    if not output.is_dir():
        raise UserInputError(f"--output-dir {output}: no such directory")
    # The lock refuses (exit 2) while a live master holds the directory: its pods and memory
    # are in use. Holding it also keeps a new run from starting pods while this one reaps.
    with OutputDirLock(output.absolute()):
        found = reap_leftovers(output.absolute(), run_id=args.run_id)
    for line in found.lines():
        print(f"removed {line}")
    for line in found.left:
        print(f"dlrover-kfp: could not remove {line}", file=sys.stderr)
    if not found:
        print(f"nothing to clean up in {output}")
    elif found.processes or found.cgroups or found.shm:
        print(found.summary(), file=sys.stderr)
    return EXIT_FAILED_RUN if found.left else 0
