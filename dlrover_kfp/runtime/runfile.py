"""The run file (``DIR/run.json``): which run an output directory holds while its master runs.

Written by the master at its start and at every sample (its events so far, and the inputs the
run is bound to: :func:`~dlrover_kfp.runtime.rundir.run_inputs`), removed when the run ends.
A master killed before that leaves it behind, so that the same command resumes the run; the
directory's reaper and ``--fresh`` read which run that was. One module reads it for all three.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlrover_kfp.errors import UserInputError

RUN_FILE = "run.json"


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


__all__ = ["RUN_FILE", "unfinished_run", "unfinished_run_id"]
