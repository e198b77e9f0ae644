"""The run file (``DIR/run.json``): which run an output directory holds while its master runs.

Written by the master at its start and at every sample (its events so far, and the inputs the
run is bound to: :func:`~dlrover_kfp.runtime.rundir.run_inputs`). When the run ends it is
marked :data:`FINISHED` (``profile.json`` and the model are written), and removed once the
profile is handed over: recorded in the history or kept pending for it
(:func:`~dlrover_kfp.runtime.launch.run_job`). A master killed before the mark leaves it behind,
so that the same command resumes the run; one killed after it leaves a finished run, which the
same command records without training again. The directory's reaper and ``--fresh`` read
which run that was. One module reads it for all of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlrover_kfp.errors import UserInputError

RUN_FILE = "run.json"

#: The run file's key that says the run ended and its profile is written.
FINISHED = "finished"


def unfinished_run(output_dir: Path) -> dict[str, Any] | None:
    """The run an earlier master left unfinished in ``output_dir`` (killed), if any; a file
    that is not a run file is a :class:`UserInputError` naming it (never guessed at)."""
    path = output_dir / RUN_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UserInputError(f"{path}: unreadable ({exc}); remove it to start afresh") from None
    if not isinstance(data, dict) or not {"run_id", "job", "started_wall"} <= data.keys():
        raise UserInputError(f"{path}: not a run file of dlrover-kfp; remove it to start afresh")
    return data


def unfinished_run_id(output_dir: Path) -> str | None:
    """The run id of :func:`unfinished_run`, or None where there is none or it cannot be read
    (for cleaning up, which must not fail on what it cleans)."""
    try:
        data = unfinished_run(output_dir)
    except UserInputError:
        return None
    run_id = data.get("run_id") if data else None
    return run_id if isinstance(run_id, str) and run_id else None


def finished_run_id(output_dir: Path) -> str | None:
    """The run id of a run that ended in ``output_dir`` but whose profile was not handed over
    (its master was killed while recording), else None."""
    data = unfinished_run(output_dir)
    if data is None or data.get(FINISHED) is not True:
        return None
    return str(data["run_id"])


def close_run_file(output_dir: Path) -> None:
    """Remove the run file of a finished run (its profile handed over); an unfinished one (a
    cancelled run, resumable) stays."""
    if finished_run_id(output_dir) is not None:
        (output_dir / RUN_FILE).unlink(missing_ok=True)


__all__ = [
    "FINISHED",
    "RUN_FILE",
    "close_run_file",
    "finished_run_id",
    "unfinished_run",
    "unfinished_run_id",
]
