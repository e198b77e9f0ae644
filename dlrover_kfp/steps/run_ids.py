"""One rule for the run id of an orchestrated run: the same logical run, the same id.

A scheduler re-runs a task for many reasons: a retry after a killed worker, a user clearing a
day that already succeeded, a backfill. Each must land on the *same* run of the history (resume
it, or replace its profile), never add a second run for the same logical date: the planner's
warm start would count it twice. So the id is derived from what names the logical run to the
orchestrator (Airflow: the DAG id, the DAG run id and the task id; KFP: the pipeline run id and
the task name), never from the wall clock.

The id is ``<job name>-<label>-<digest>``: the job name and a short human label (the logical
date) for people reading ``dlrover-kfp history list``, and 12 hex digits of SHA-256 over the
keys, which make it unique. It is a DNS-1123 label of at most 63 characters, because it becomes
a label value of every pod of the run (``run=<id>``).
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

#: A pod label value is at most 63 characters.
MAX_RUN_ID: Final = 63
_DIGEST_HEX: Final = 12


def _label_part(text: str) -> str:
    """Lower-case letters, digits and single dashes; no dash at either end."""
    cleaned = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return cleaned


def stable_run_id(job_name: str, keys: tuple[str, ...], label: str = "") -> str:
    """The run id of the logical run that ``keys`` name (see the module docstring).

    ``keys`` must name the run completely and in a fixed order (the orchestrator's ids);
    ``label`` is only for people (a date such as ``20261120``) and does not make ids unique.
    """
    if not keys or not all(keys):
        raise ValueError(f"stable_run_id: every key must be non-empty, got {keys!r}")
    digest = hashlib.sha256("\x00".join(keys).encode("utf-8")).hexdigest()[:_DIGEST_HEX]
    tail = "-".join(part for part in (_label_part(label), digest) if part)
    room = MAX_RUN_ID - len(tail) - 1
    head = _label_part(job_name)[:room].rstrip("-") or "run"
    return f"{head}-{tail}"


__all__ = ["MAX_RUN_ID", "stable_run_id"]
