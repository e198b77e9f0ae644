"""What a user meant by the action that cancelled a trigger: stop the run, or re-attach to it.

Airflow 3.3 calls a trigger's ``on_kill`` only for a user's action on its deferred task, never
for a triggerer's restart, a trigger moved to another triggerer or a timeout (those cancel the
trigger's coroutine without it). Three actions reach it: **mark failed** and **mark success**
mean "this run is over": the job must stop and the run be recorded as cancelled, or the job
runs on for hours, orphaned, and never reaches the history. **Clear** means "run the task
again": the next attempt finds the running master and waits for it again, so stopping the job
would throw away its work for nothing.

``on_kill`` cannot tell them apart by itself; the task instance's state can: a marked task is
already ``failed`` or ``success`` when its trigger is cancelled, a cleared one is back to no
state (or ``scheduled``, ``queued``, ``running``: its next attempt). The state is read through
the triggerer's Task SDK channel (the same call Airflow's own external-task trigger makes).
When it cannot be read the job is stopped: an orphaned job holds a cluster's resources until
someone notices, a stopped one resumes from its last checkpoint when the task runs again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

log = logging.getLogger(__name__)

#: Task instance states that mean the user ended the task: its job must stop.
STOP_STATES: Final = frozenset({"failed", "success", "skipped", "upstream_failed", "removed"})


def _read_state(ti: Any) -> str | None:
    """The task instance's current state, through the triggerer's Task SDK channel."""
    from airflow.sdk.execution_time.task_runner import (  # noqa: PLC0415 - triggerer only
        RuntimeTaskInstance,
    )

    map_index = getattr(ti, "map_index", -1)
    states = RuntimeTaskInstance.get_task_states(
        dag_id=ti.dag_id,
        task_ids=[ti.task_id],
        run_ids=[ti.run_id],
        map_index=map_index,
    )
    by_task = states.get(ti.run_id, {})
    key = ti.task_id if map_index is None or map_index < 0 else f"{ti.task_id}_{map_index}"
    if key not in by_task:
        return "removed"  # its DAG run was deleted: nothing will re-attach
    state = by_task[key]
    return None if state is None else str(getattr(state, "value", state))


async def stop_reason(trigger: Any) -> str | None:
    """Why the job must stop (a sentence for the run's profile), or None: the task was cleared
    and its next attempt re-attaches (see the module docstring)."""
    ti = getattr(trigger, "task_instance", None)
    if ti is None:
        return "a user acted on the task (its state could not be read)"
    try:
        state = await asyncio.to_thread(_read_state, ti)
    except Exception as exc:  # any failure to read: stop (module docstring)
        log.warning("cannot read the state of task %s: %s; stopping the job", ti.task_id, exc)
        return f"a user acted on task {ti.task_id} (its state could not be read: {exc})"
    if state in STOP_STATES:
        return f"task {ti.dag_id}.{ti.task_id} of {ti.run_id} was marked {state} by a user"
    return None


async def warm_up(trigger: Any) -> None:
    """Read the task's state once, and drop it, when the trigger starts: the triggerer builds
    its Task SDK client on a trigger's first request, which took 12 s on a busy 2-core machine,
    and a user's cancel should not wait for that. Errors are for :func:`stop_reason` to meet."""
    ti = getattr(trigger, "task_instance", None)
    if ti is None:
        return
    try:
        await asyncio.to_thread(_read_state, ti)
    except Exception as exc:  # only a warm-up: see the docstring
        log.debug("warm-up read of task %s's state failed: %s", ti.task_id, exc)


__all__ = ["STOP_STATES", "stop_reason", "warm_up"]
