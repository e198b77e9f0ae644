"""The job master as the train operator submits it: ``dlrover-kfp run``, plus two things.

::

    python -m airflow_plugin.master STATUS.json -- run --job JOB.yaml --plan PLAN.json ...

1. **The history URL stays off the command line.** It may carry a database password, and a
   command line is readable by every user of the machine (``ps``). The operator puts it in
   this process's environment (``DLROVER_KFP_HISTORY_URL``, readable only by its user); this
   module takes it out of the environment, so that the PS and worker processes do not
   inherit it, and hands it to the command in-process as ``--history``.
2. **The exit status is written to STATUS.json** (``{"exit_code": N}``, atomically) when the
   command ends, so that the trigger, which is not this process's parent, knows how it ended:
   0 the run succeeded, 1 it failed (its profile says why), 2 a user error, 75 a temporary
   failure (a locked or unreachable history). No file means the master was killed; running
   the same command again resumes the run from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from dlrover_kfp.errors import EXIT_FAILED_RUN
from dlrover_kfp.files import write_atomic
from dlrover_kfp.history import ENV_VAR

USAGE = "usage: python -m airflow_plugin.master STATUS.json -- DLROVER-KFP-ARGS..."


def run_cli(args: list[str]) -> int:
    """``dlrover-kfp ARGS`` in this process (imported here: it imports the trainer)."""
    from dlrover_kfp.cli.main import main as cli_main  # noqa: PLC0415 - torch: only here

    return cli_main(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    status_file, cli_args = args[0], args[2:]
    url = os.environ.pop(ENV_VAR, "").strip()
    if url and "--history" not in cli_args:
        cli_args += ["--history", url]
    code = EXIT_FAILED_RUN
    try:
        code = run_cli(cli_args)
    except SystemExit as exc:  # argparse: usage errors exit 2
        code = exc.code if isinstance(exc.code, int) else EXIT_FAILED_RUN
    finally:
        # A bug propagates with its traceback to the log; the status still says "failed" (1).
        sys.stdout.flush()
        sys.stderr.flush()
        write_atomic(status_file, json.dumps({"exit_code": code}) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
