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

In a master pod (``--pod`` instead of STATUS.json: ``ElasticTrainOperator(backend=
"kubernetes")``, :mod:`airflow_plugin.kube`) the job spec and plan come from the environment
and are written where ``--job`` and ``--plan`` say; the exit status is the container's, and the
profile is printed as the log's last line, for a task that does not mount the run's volume.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dlrover_kfp.errors import EXIT_FAILED_RUN
from dlrover_kfp.files import write_atomic
from dlrover_kfp.history import ENV_VAR

USAGE = (
    "usage: python -m airflow_plugin.master STATUS.json -- DLROVER-KFP-ARGS...\n"
    "       python -m airflow_plugin.master --pod -- run --job JOB.yaml [--plan PLAN.json] ..."
)

#: In a master pod: the job spec (YAML) and the plan (JSON) come in these variables, and are
#: written where ``--job`` and ``--plan`` say before the run starts.
JOB_SPEC_ENV = "DLROVER_KFP_JOB_SPEC"
PLAN_ENV = "DLROVER_KFP_PLAN"
#: In a master pod: the last line of the log is the run's profile after this prefix (one JSON
#: line), so that the task reads it through the API without mounting the run's volume.
PROFILE_PREFIX = "DLROVER_KFP_PROFILE "


def run_cli(args: list[str]) -> int:
    """``dlrover-kfp ARGS`` in this process (imported here: it imports the trainer)."""
    from dlrover_kfp.cli.main import main as cli_main  # noqa: PLC0415 - torch: only here

    return cli_main(args)


def _option(args: list[str], name: str) -> str | None:
    """The value after ``name`` in ``args`` (None when absent)."""
    try:
        return args[args.index(name) + 1]
    except (ValueError, IndexError):
        return None


def _inputs_from_env(cli_args: list[str]) -> None:
    """In a master pod: the job spec and plan the operator put in the environment, written
    where the command line reads them (the run's directory on its volume)."""
    for env, flag in ((JOB_SPEC_ENV, "--job"), (PLAN_ENV, "--plan")):
        text, path = os.environ.pop(env, None), _option(cli_args, flag)
        if text is not None and path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text if text.endswith("\n") else text + "\n")


def _print_profile(cli_args: list[str]) -> None:
    output_dir = _option(cli_args, "--output-dir")
    if output_dir is None:
        return
    try:
        document = json.loads((Path(output_dir) / "profile.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    print(PROFILE_PREFIX + json.dumps(document, separators=(",", ":")), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    status_file, cli_args = args[0], args[2:]
    in_pod = status_file == "--pod"
    url = os.environ.pop(ENV_VAR, "").strip()
    if url and "--history" not in cli_args:
        cli_args += ["--history", url]
    if in_pod:
        _inputs_from_env(cli_args)
    code = EXIT_FAILED_RUN
    try:
        code = run_cli(cli_args)
    except SystemExit as exc:  # argparse: usage errors exit 2
        code = exc.code if isinstance(exc.code, int) else EXIT_FAILED_RUN
    finally:
        # A bug propagates with its traceback to the log; the status still says "failed" (1).
        sys.stdout.flush()
        sys.stderr.flush()
        if in_pod:
            _print_profile(cli_args)  # the pod's exit code is the status
        else:
            write_atomic(status_file, json.dumps({"exit_code": code}) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
