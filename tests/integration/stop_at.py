"""Run the CLI, stopping the master at one point of a run's end with a signal to itself.

``python -m tests.integration.stop_at POINT SIGNAL ARGS...`` runs ``dlrover-kfp ARGS...`` with
the master stopped (``SIGKILL``: dies on the spot; ``SIGTERM``: the run's own unwinding) when
it reaches ``POINT``:

* ``checkpoint``: right after the last checkpoint is committed;
* ``commit-2``: right after the second checkpoint of the run is committed (a periodic one: an
  older checkpoint stays beside the newest);
* ``evaluate``: as the held-out rows start to be scored;
* ``export``: as the model starts to be written;
* ``record``: as the profile starts to be written into the history.

The points are the product's own functions, wrapped here: nothing in the product knows of
this driver.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from dlrover_kfp.cli.main import main
from dlrover_kfp.history import pending
from dlrover_kfp.runtime import export, job
from dlrover_kfp.training import checkpoint as ckpt


def _stopping(fn: Callable[..., Any], sig: signal.Signals, *, after: bool = False) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if after:
            fn(*args, **kwargs)
        os.kill(os.getpid(), sig)
        # SIGTERM unwinds from the next bytecode of the main thread; nothing after runs
        return fn(*args, **kwargs) if not after else None

    return wrapped


def install(point: str, sig: signal.Signals) -> None:
    if point == "checkpoint":
        job.JobRun._final_checkpoint = _stopping(  # type: ignore[method-assign]
            job.JobRun._final_checkpoint, sig, after=True
        )
    elif point == "commit-2":
        original = ckpt.commit
        calls = []

        def commit(*args: Any, **kwargs: Any) -> Any:
            path = original(*args, **kwargs)
            calls.append(path)
            if len(calls) == 2:
                os.kill(os.getpid(), sig)
            return path

        ckpt.commit = commit  # type: ignore[assignment]
    elif point == "evaluate":
        export.evaluate = _stopping(export.evaluate, sig)  # type: ignore[assignment]
    elif point == "export":
        export.save_model = _stopping(export.save_model, sig)  # type: ignore[assignment]
    elif point == "record":
        pending.record_profile = _stopping(pending.record_profile, sig)  # type: ignore[assignment]
    else:
        raise SystemExit(f"stop_at: unknown point {point!r}")


if __name__ == "__main__":
    point, name, *argv = sys.argv[1:]
    install(point, signal.Signals[name])
    sys.exit(main(argv))
