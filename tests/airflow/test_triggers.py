"""The trigger that waits for a job master: its serialisation and its wait, on real processes
standing in for the master (one that writes a profile, one that fails, a zombie, one that
outlives the deadline)."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("airflow.sdk", reason="the airflow extra is not installed")

import psutil
from airflow.sdk._shared.module_loading import import_string
from airflow.sdk.serde import deserialize, serialize
from airflow.triggers.base import TriggerEvent

from airflow_plugin.triggers import (
    ElasticTrainTrigger,
    master_alive,
    process_create_time,
)


def _trigger(**overrides: Any) -> ElasticTrainTrigger:
    kwargs: dict[str, Any] = {
        "pid": 4242,
        "create_time": 1_795_000_000.25,
        "output_dir": "/runs/dag/2026-11-20/train",
        "host": "worker-7",
        "poll_interval": 0.5,
        "deadline": 1_795_003_600.0,
    }
    kwargs.update(overrides)
    return ElasticTrainTrigger(**kwargs)


def test_serialize_round_trips_through_the_classpath_and_json() -> None:
    trigger = _trigger()
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_plugin.triggers.ElasticTrainTrigger"
    # every constructor parameter is serialised, so nothing is lost in a triggerer
    # (kill_on_cancel: accepted, ignored, not serialized: triggers stored by 0.1.0 still load)
    params = set(inspect.signature(ElasticTrainTrigger.__init__).parameters) - {
        "self",
        "kill_on_cancel",
    }
    assert set(kwargs) == params
    # as the triggerer stores and rebuilds it: JSON, then Airflow's serde, then the classpath
    stored = json.loads(json.dumps(serialize(kwargs)))
    rebuilt = import_string(classpath)(**deserialize(stored))
    assert type(rebuilt) is ElasticTrainTrigger
    assert rebuilt.serialize() == (classpath, kwargs)
    assert vars(rebuilt) == vars(trigger)


def _events(trigger: ElasticTrainTrigger) -> list[dict[str, Any]]:
    async def collect() -> list[TriggerEvent]:
        return [event async for event in trigger.run()]

    return [event.payload for event in asyncio.run(asyncio.wait_for(collect(), timeout=30))]


def _master(tmp_path: Path, body: str) -> subprocess.Popen[bytes]:
    """A stand-in for the job master: Python ``body`` run in ``tmp_path``, in its own session."""
    return subprocess.Popen([sys.executable, "-c", body], cwd=tmp_path, start_new_session=True)


def _watching(proc: subprocess.Popen[bytes], tmp_path: Path, **kw: Any) -> ElasticTrainTrigger:
    """The trigger the operator would make for ``proc`` started in ``tmp_path``."""
    return ElasticTrainTrigger(
        pid=proc.pid,
        create_time=process_create_time(proc.pid),
        output_dir=str(tmp_path),
        host=socket.gethostname(),
        poll_interval=0.05,
        **kw,
    )


def _wait_for(trigger_for: subprocess.Popen[bytes], tmp_path: Path, **kw: Any) -> dict[str, Any]:
    (event,) = _events(_watching(trigger_for, tmp_path, **kw))
    return event


PROFILE = json.dumps({"run_id": "dlrm-small-20261120T000000", "outcome": {"status": "succeeded"}})


def test_a_master_that_wrote_its_profile_fires_success(tmp_path: Path) -> None:
    body = (
        "import json, pathlib, time; time.sleep(0.3); "
        f"pathlib.Path('profile.json').write_text({PROFILE!r}); "
        "pathlib.Path('master-exit.json').write_text(json.dumps({'exit_code': 0}))"
    )
    proc = _master(tmp_path, body)
    event = _wait_for(proc, tmp_path)
    assert event == {
        "status": "success",
        "run_id": "dlrm-small-20261120T000000",
        "profile": str(tmp_path / "profile.json"),
        "outcome": "succeeded",
        "exit_code": 0,
    }
    # the finished master was this process's child: the trigger reaped the zombie
    with pytest.raises(ChildProcessError):
        os.waitpid(proc.pid, os.WNOHANG)


def test_a_master_that_ended_without_a_profile_fires_an_error_with_its_log(tmp_path: Path) -> None:
    lines = "\\n".join(f"progress {i}" for i in range(40))
    body = (
        "import json, pathlib; "
        f"pathlib.Path('master.log').write_text('{lines}\\ndlrover-kfp: error: job.yaml: bad\\n'); "
        "pathlib.Path('master-exit.json').write_text(json.dumps({'exit_code': 2})); "
        "raise SystemExit(2)"
    )
    event = _wait_for(_master(tmp_path, body), tmp_path)
    assert event["status"] == "error"
    assert event["exit_code"] == 2
    assert "exited with status 2 without writing" in event["message"]
    tail = event["log_tail"].splitlines()
    assert len(tail) == 30
    assert tail[-1] == "dlrover-kfp: error: job.yaml: bad"


def test_a_zombie_counts_as_ended_and_a_killed_master_leaves_no_status(tmp_path: Path) -> None:
    proc = _master(tmp_path, "import time; time.sleep(60)")
    created = process_create_time(proc.pid)
    assert master_alive(proc.pid, created)
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    event = _wait_for(proc, tmp_path)
    assert event["status"] == "error"
    assert event["exit_code"] is None
    assert "was killed without writing" in event["message"]


def test_a_recycled_pid_is_not_the_master() -> None:
    me = os.getpid()
    assert master_alive(me, process_create_time(me))
    assert not master_alive(me, process_create_time(me) - 10.0)


def test_at_the_deadline_the_wait_fails_and_the_job_is_stopped(tmp_path: Path) -> None:
    proc = _master(tmp_path, "import time; time.sleep(60)")
    started = time.monotonic()
    event = _wait_for(proc, tmp_path, deadline=time.time() + 0.3)
    assert event["status"] == "error"
    assert "still running at the deadline; it was sent SIGTERM" in event["message"]
    assert proc.wait(timeout=10) == -signal.SIGTERM
    assert time.monotonic() - started < 5


def test_a_triggerer_restart_cancels_the_wait_and_leaves_the_job(tmp_path: Path) -> None:
    # A triggerer that shuts down or hands the trigger on cancels its coroutine without
    # calling on_kill: the job goes on, and the next triggerer waits for it again.
    proc = _master(tmp_path, "import time; time.sleep(60)")
    trigger = _watching(proc, tmp_path)

    async def cancel_soon() -> None:
        task = asyncio.ensure_future(trigger.run().__anext__())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(cancel_soon())
        time.sleep(0.2)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    ("state", "stops"),
    [("failed", True), ("success", True), (None, False), ("scheduled", False), ("queued", False)],
)
def test_on_kill_stops_the_job_for_a_mark_and_leaves_it_for_a_clear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str | None, stops: bool
) -> None:
    # A stand-in master that says how it stopped: SIGTERM, with the reason it found.
    proc = _master(
        tmp_path,
        "import json, signal, sys, time\n"
        "def stop(*_):\n"
        "    reason = json.load(open('cancel.json'))['reason']\n"
        "    open('stopped.txt', 'w').write(reason)\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "time.sleep(60)\n",
    )
    trigger = _watching(proc, tmp_path)
    trigger.task_instance = SimpleNamespace(  # what the triggerer sets
        dag_id="dlrm", task_id="train", run_id="scheduled__2026-11-20", map_index=-1
    )
    states = {"scheduled__2026-11-20": {"train": state}}
    monkeypatch.setattr(
        "airflow.sdk.execution_time.task_runner.RuntimeTaskInstance.get_task_states",
        lambda **query: states,
    )
    time.sleep(0.5)  # the stand-in installs its handler
    try:
        asyncio.run(trigger.on_kill())
        if stops:
            proc.wait(timeout=10)  # (its status: reaped by the trigger's own look at it)
            reason = (tmp_path / "stopped.txt").read_text()
            assert (
                reason == f"task dlrm.train of scheduled__2026-11-20 was marked {state} by a user"
            )
        else:
            time.sleep(0.3)
            assert proc.poll() is None
            assert not (tmp_path / "cancel.json").exists()
    finally:
        proc.kill()
        proc.wait()


def test_a_trigger_on_another_machine_does_not_guess(tmp_path: Path) -> None:
    (event,) = _events(_trigger(host="not-" + socket.gethostname(), output_dir=str(tmp_path)))
    assert event["status"] == "error"
    assert "needs the triggerer on the worker's machine" in event["message"]
