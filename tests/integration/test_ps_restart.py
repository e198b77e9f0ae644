"""A PS process that crashes inside its running pod is restarted there, from its own snapshot.

One run on the local backend (2 PS, 1 worker), two faults:

1. the PS *process* of ps-0 is SIGKILLed (its pod's supervisor lives on): the supervisor starts
   it again in the same pod, the other PS rolls back in its running process (no restart), and
   both restore the last committed step from their pods' own shared memory;
2. later the whole pod of ps-1 is lost (its supervisor SIGKILLed): today's path, every PS
   relaunched as a new pod, restoring from the volume.

Both roll the job back to the same kind of point (the last committed checkpoint) and the run
trains every row exactly once; the in-place restart serves again sooner than the pod relaunch
measured in the same run (each event says how long the PS took to serve again; the test prints
both).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.runtime.elastic import ElasticPolicy
from dlrover_kfp.runtime.job import JobRun
from dlrover_kfp.runtime.options import RunSettings
from tests.integration.test_elastic_run import QUIET, _run, _spec, _trained_rows
from tests.integration.test_frozen_ps import _until

#: Seconds between checkpoints: a fault 1 s after a commit falls well before the next snapshot,
#: so the pods' snapshots hold exactly the committed step.
CHECKPOINT_S = 3.0
_SERVING = re.compile(r"serving again in ([0-9.]+)s")


def _committed(out: Path) -> set[str]:
    return {p.name for p in (out / "checkpoints").glob("step-*") if not p.name.endswith(".tmp")}


def _ps_process(backend: LocalBackend, pod: str) -> psutil.Process:
    """The PS process of a PS pod: the only child of the pod's first process (its supervisor)."""
    pid = backend.pid_of(pod)
    assert pid is not None, pod
    (child,) = psutil.Process(pid).children()
    assert "dlrover_kfp.training.node" in child.cmdline()
    return child


# 55-65 s on a 2-core machine (three starts of the job's processes, two rollbacks): -m long.
@pytest.mark.long
@pytest.mark.timeout(240)
def test_a_crashed_ps_process_restarts_in_its_pod_from_its_own_snapshot(
    tmp_path: Path,
) -> None:
    if not Path("/proc/self/cmdline").exists():
        pytest.skip("finds the PS process in /proc (Linux)")
    spec = _spec(
        900_000,
        "{count: 1, cpu: 0.5, memory: 2Gi}",
        "{count: 2, cpu: 0.5, memory: 2Gi}",
        name="restart",
    )
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=CHECKPOINT_S)
    out = tmp_path / "out"
    seen: dict[str, object] = {}

    def after_a_fresh_commit(run: JobRun[ElasticPolicy], since: set[str]) -> None:
        assert _until(
            lambda: _committed(out) - since and run.samples and run.samples[-1].throughput > 0
        )
        time.sleep(1.0)  # shards done after the checkpoint, to be taken back

    def faults(run: JobRun[ElasticPolicy], backend: LocalBackend) -> None:
        after_a_fresh_commit(run, set())
        crashed = _ps_process(backend, "restart-ps-0")
        survivor = _ps_process(backend, "restart-ps-1").pid
        pod_pid = backend.pid_of("restart-ps-0")
        crashed.kill()
        seen["crashed"] = crashed.pid
        assert _until(lambda: any("restarted in its pod" in e.detail for e in run.events))
        again = _ps_process(backend, "restart-ps-0")
        seen["same pod"] = backend.pid_of("restart-ps-0") == pod_pid and again.pid != crashed.pid
        seen["survivor kept"] = _ps_process(backend, "restart-ps-1").pid == survivor
        after_a_fresh_commit(run, _committed(out))
        pod = backend.pid_of("restart-ps-1")
        assert pod is not None
        os.kill(pod, signal.SIGKILL)  # the supervisor: the pod fails
        seen["pod lost"] = pod
        assert _until(lambda: any(e.node == "restart-ps-1" for e in run.events))

    result = _run(spec, tmp_path, settings, during=faults, planner=QUIET)
    profile = result.profile
    assert "pod lost" in seen, f"the faults were not both injected: {seen}"
    assert seen["same pod"] is True
    assert seen["survivor kept"] is True  # ps-1 rolled back in its running process
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    failures = [e for e in profile.events if e.kind == "failure"]
    assert [e.node for e in failures] == ["restart-ps-1"], profile.events
    in_place, relaunched = (e for e in profile.events if e.kind == "relaunch")
    assert in_place.node == "restart-ps-0", profile.events
    assert "ps-0 crashed (signal 9) and was restarted in its pod" in in_place.detail
    assert "(2 from memory, 0 from the volume), 1 in its running process" in in_place.detail
    assert "samples trained since are taken back" in in_place.detail
    assert relaunched.node == "restart-ps-1"
    assert "every PS restored from the checkpoint of step" in relaunched.detail
    in_place_s, relaunch_s = (
        float(_SERVING.search(e.detail).group(1))  # type: ignore[union-attr]
        for e in (in_place, relaunched)
    )
    print(
        f"\nPS serving again: restarted in its pod {in_place_s:.2f}s, "
        f"pod relaunched {relaunch_s:.2f}s\n  {in_place.detail}\n  {relaunched.detail}"
    )
    # In place, only the crashed PS's process starts again (the interpreter and torch at the
    # pod's half core: ~3-4 s here); the other PS rolls back in its running process in
    # milliseconds, while that start runs. The relaunch starts every PS's process, in new pods,
    # after stopping the old ones. Measured here (2 cores shared with other jobs), 6 runs, in
    # place / relaunched: 2.97/4.17, 3.92/5.64, 3.45/6.28, 3.40/4.38, 4.06/4.19, 2.74/5.44 s.
    assert in_place_s < relaunch_s, (in_place_s, relaunch_s)
    logs = (out / "logs" / "restart-ps-0.log").read_text()
    assert "crashed (signal 9); restarting it in this pod" in logs
    assert "from memory" in logs or "(shm," in logs
