"""Where a training run's files live, what they are called, and the URL of its report.

Every train task gets an output directory of its own, by default under the runs directory,
one per DAG, logical date and task::

    $DLROVER_KFP_RUNS_DIR/<dag_id>/<logical date, YYYY-MM-DD>/<task_id>/

(``$DLROVER_KFP_RUNS_DIR`` defaults to ``runs/`` in the user data directory, beside the
default history store). A retried task finds its directory again, so that a run whose master
was killed resumes from its last checkpoint; a run without a logical date (a manual run of
Airflow 3) uses its run id instead of the date. The directory holds the job master's files:

- ``job.yaml``, ``plan.json``: what the run was given (written by the train operator);
- ``master.log``: the master's stdout and stderr;
- ``master.json``: its process id, creation time and machine (a retried or cleared task whose
  master still runs waits for it again rather than start a second one);
- ``master-exit.json``: its exit status (written when it ends, unless it was killed);
- ``profile.json``, ``model/``, ``logs/``, ``checkpoints/``: what the run writes;
- ``report.html``: the run report, written when the task resumes after the run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Final
from urllib.parse import quote

import platformdirs

RUNS_DIR_ENV: Final = "DLROVER_KFP_RUNS_DIR"

JOB_FILE: Final = "job.yaml"
PLAN_FILE: Final = "plan.json"
MASTER_LOG: Final = "master.log"
MASTER_FILE: Final = "master.json"
MASTER_EXIT: Final = "master-exit.json"
PROFILE_FILE: Final = "profile.json"
REPORT_FILE: Final = "report.html"

#: The Airflow configuration option (``[dlrover_kfp] report_base_url``, or the environment
#: variable ``AIRFLOW__DLROVER_KFP__REPORT_BASE_URL``) under which the runs directory is served.
REPORT_BASE_URL_OPTION: Final = ("dlrover_kfp", "report_base_url")


def runs_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``$DLROVER_KFP_RUNS_DIR``, else ``runs`` in the user data directory."""
    given = environ.get(RUNS_DIR_ENV, "").strip()
    if given:
        return Path(given).expanduser().absolute()
    return Path(platformdirs.user_data_dir("dlrover-kfp")) / "runs"


def _safe(part: str) -> str:
    """A path component from an Airflow id: no separators, no leading dots."""
    cleaned = re.sub(r"[^A-Za-z0-9._+=-]+", "_", part).lstrip(".")
    return cleaned or "_"


def task_dir(context: Mapping[str, Any]) -> PurePosixPath:
    """``<dag_id>/<logical date>/<task_id>``: where a task's run lives under a runs directory
    (this machine's, or the ``runs/`` directory on a Kubernetes run's volume)."""
    ti = context["ti"]
    when = context.get("ds") or _safe(str(context["run_id"]))
    return PurePosixPath(_safe(str(ti.dag_id)), when, _safe(str(ti.task_id)))


def default_output_dir(context: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> Path:
    """The output directory of the task instance ``context`` describes (module docstring)."""
    return runs_dir(environ) / task_dir(context)


def report_url(report: str | os.PathLike[str], base_url: str = "", runs: Path | None = None) -> str:
    """The URL of a run's report: under ``base_url`` when it is set and the report is in the
    runs directory, else a ``file://`` URL of the worker's disk."""
    path = Path(report).absolute()
    if base_url:
        root = runs if runs is not None else runs_dir()
        try:
            relative = path.relative_to(root.absolute())
        except ValueError:
            pass
        else:
            return base_url.rstrip("/") + "/" + quote(relative.as_posix())
    return path.as_uri()


__all__ = [
    "JOB_FILE",
    "MASTER_EXIT",
    "MASTER_FILE",
    "MASTER_LOG",
    "PLAN_FILE",
    "PROFILE_FILE",
    "REPORT_BASE_URL_OPTION",
    "REPORT_FILE",
    "RUNS_DIR_ENV",
    "default_output_dir",
    "report_url",
    "runs_dir",
    "task_dir",
]
