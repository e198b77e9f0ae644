"""A failed pod's cause, as its own output states it (backends/api.py ``last_error_line``),
read from the local backend's log tail or the kubelet's termination message."""

from __future__ import annotations

from typing import Any

import pytest

from dlrover_kfp.backends.api import MAX_MESSAGE_CHARS, last_error_line
from dlrover_kfp.backends.k8s_objects import job_labels, pod_status, render_pod
from dlrover_kfp.ports import PodPhase, PodSpec

TRACEBACK = """\
2026-11-26 10:00:01,000 INFO worker-0: reading shard 4
Traceback (most recent call last):
  File "/app/dlrover_kfp/training/node.py", line 300, in run_worker
    batch = dataset.read(rows)
dlrover_kfp.errors.UserInputError: /data/day_0: file changed since it was indexed
--- dlrover-kfp Failed ctr-worker-0: reason=Error exit_code=1
"""
CHANGED = "dlrover_kfp.errors.UserInputError: /data/day_0: file changed since it was indexed"


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (TRACEBACK, CHANGED),
        ("x\nOSError: [Errno 28] No space left on device\n\n",
         "OSError: [Errno 28] No space left on device"),
        ("2026 INFO ps-0: start\n2026-11-26 10:00 ERROR ps-0: /dev/shm is too small: 64 MiB\n"
         "2026 INFO ps-0: bye\n", "ERROR ps-0: /dev/shm is too small: 64 MiB"),
        ("RuntimeError: DefaultCPUAllocator: can't allocate memory\nKeyboardInterrupt\n",
         "KeyboardInterrupt"),
        # killed from outside: nothing in its output says why
        ("2026 INFO ps-0: PS 0: 1000 rows\n--- dlrover-kfp Failed x: reason=OOMKilled\n", None),
        ("", None),
    ],
)  # fmt: skip
def test_the_last_error_line_is_the_cause_the_pod_stated(text: str, line: str | None) -> None:
    assert last_error_line(text) == line


def test_an_error_line_is_cut_to_a_message() -> None:
    line = last_error_line("ValueError: " + "x" * 5000)
    assert line is not None and len(line) == MAX_MESSAGE_CHARS and line.endswith("...")


def _failed(message: str | None, **terminated: Any) -> dict[str, Any]:
    term = {"exitCode": 1, "reason": "Error", **terminated}
    if message is not None:
        term["message"] = message
    return {
        "metadata": {"name": "ctr-worker-0", "labels": {"role": "worker", "index": "0"}},
        "status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": term}}]},
    }


def test_kubernetes_fills_the_message_from_the_log_and_the_status_carries_its_error_line() -> None:
    pod = PodSpec(
        name="ctr-worker-0",
        role="worker",
        index=0,
        command=("python", "-m", "dlrover_kfp.training.node", "worker", "0"),
        cpu=1,
        memory_mb=1024,
    )
    body = render_pod(
        pod,
        namespace="ml",
        image="i",
        labels=job_labels("ctr"),
        secret_name="s",
        secret_keys={},
    )
    # Without FallbackToLogsOnError a container that writes no /dev/termination-log has none.
    assert body["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    status = pod_status(_failed(TRACEBACK))
    assert status.phase is PodPhase.FAILED
    assert status.message == CHANGED
    assert pod_status(_failed(None)).message is None
    # A pod deleted by someone else did not fail of its own: no cause to tell.
    deleted = _failed(TRACEBACK, exitCode=143)
    deleted["metadata"]["deletionTimestamp"] = "2026-11-24T05:00:00Z"
    assert pod_status(deleted).message is None
