"""A user's cancel, told apart from every other stop.

A master is stopped by a signal for many reasons: a node drained, a triggerer restarted, a
terminal closed, a user who wants the run gone. All stop it the same clean way (pods, cgroups
and shared memory released: :mod:`~dlrover_kfp.runtime.signals`), and all but one leave the run
resumable and unrecorded, so that the next attempt goes on from its last checkpoint. The one is
a user's cancel (Airflow's "mark failed" or "mark success" on the train task): that run must
also reach the history as **cancelled**, or it is simply lost (its partial measurements too).

So whoever cancels first *says so*, then sends the stop, and the master reads why when the
signal arrives. Two places a canceller can write and the master can read:

* the marker file ``cancel.json`` in the run's output directory (:func:`request_cancel`): the
  local backend, where the canceller shares the master's disk;
* the annotation :data:`CANCEL_ANNOTATION` on the master's own pod: a master in the cluster,
  whose canceller (a triggerer elsewhere) reaches it only through the Kubernetes API
  (:meth:`dlrover_kfp.backends.kubernetes.KubernetesBackend.owner_cancel_reason`).

A marker older than the master reading it belongs to an earlier attempt and is ignored: a
re-run must not cancel itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from dlrover_kfp.backends.k8s_objects import CANCEL_ANNOTATION
from dlrover_kfp.files import write_atomic

CANCEL_FILE: Final = "cancel.json"

#: Why a run was asked to stop, if a user asked: the reason, else None.
CancelProbe = Callable[[], str | None]


def request_cancel(output_dir: str | Path, reason: str) -> None:
    """Say that the run in ``output_dir`` is being cancelled by a user, before stopping it."""
    document = {"reason": reason, "time": time.time()}
    write_atomic(Path(output_dir) / CANCEL_FILE, json.dumps(document) + "\n")


def cancel_reason(output_dir: Path, since: float) -> str | None:
    """The reason of a cancel requested in ``output_dir`` at or after ``since`` (epoch s)."""
    try:
        document = json.loads((output_dir / CANCEL_FILE).read_text(encoding="utf-8"))
        reason, when = str(document["reason"]), float(document["time"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return reason if when >= since else None


def first_reason(*probes: CancelProbe | None) -> CancelProbe:
    """One probe from several: the first reason any of them gives."""

    def probe() -> str | None:
        for each in probes:
            reason = each() if each is not None else None
            if reason:
                return reason
        return None

    return probe


__all__ = [
    "CANCEL_ANNOTATION",
    "CANCEL_FILE",
    "CancelProbe",
    "cancel_reason",
    "first_reason",
    "request_cancel",
]
