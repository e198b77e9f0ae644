"""A worker's torch threads follow its CPU when the pod is resized in place (node.follow_cpu):
the quota changes under the running process, the environment does not."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dlrover_kfp.core.pod_env import POD_CPU_ENV
from dlrover_kfp.training import node
from dlrover_kfp.training.cpu_limit import PodCpu
from tests.unit.test_cpu_limit import _Clock, _tree


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("threads")
@pytest.mark.parametrize("override", [None, "3"])
def test_a_worker_sets_its_threads_from_its_new_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, override: str | None
) -> None:
    if override is None:
        monkeypatch.delenv(node.THREADS_ENV, raising=False)
    else:
        monkeypatch.setenv(node.THREADS_ENV, override)  # a benchmark's fixed count holds
    cpu_max = _tree(tmp_path, "100000 100000")
    clock = _Clock()
    cpu = PodCpu({POD_CPU_ENV: "1"}, root=tmp_path, clock=clock)
    torch.set_num_threads(node.torch_threads("worker", os.environ, cpu.cores))
    seen = []
    for quota in ("250000 100000", "50000 100000"):  # 2.5 cores, then half a core
        cpu_max.write_text(quota)
        clock.t += 1.0
        node.follow_cpu("worker-0", cpu)
        seen.append(torch.get_num_threads())
    assert seen == ([2, 1] if override is None else [3, 3])


#: A pod's process: reports its CPU as PodCpu reads it, at start and at every change, with its pid.
_FOLLOWER = (
    "import os, time\n"
    "from dlrover_kfp.training.cpu_limit import PodCpu\n"
    "cpu = PodCpu(os.environ, interval_s=0.05)\n"
    "print(os.getpid(), cpu.cores, flush=True)\n"
    "while True:\n"
    "    cores = cpu.changed()\n"
    "    if cores is not None:\n"
    "        print(os.getpid(), cores, flush=True)\n"
    "    time.sleep(0.02)\n"
)


def test_a_local_pod_reads_the_quota_its_backend_resized_in_place(tmp_path: Path) -> None:
    """Against the real local backend and its cgroups: the process started at 0.5 core reads
    2 cores once the pod is resized, under the same pid."""
    from dlrover_kfp.backends.local import LocalBackend  # noqa: PLC0415
    from dlrover_kfp.ports import PodSpec  # noqa: PLC0415

    with LocalBackend(tmp_path / "logs") as backend:
        if not backend.cpu_enforced:
            pytest.skip(f"no cgroups here: {backend.enforcement}")
        command = (sys.executable, "-c", _FOLLOWER)
        pod = PodSpec(
            name="f-worker-0", role="worker", index=0, command=command, cpu=0.5, memory_mb=256
        )
        backend.launch(pod)

        def lines() -> list[list[str]]:
            text = backend.log_path(pod.name).read_text()
            return [line.split() for line in text.splitlines() if line[:1].isdigit()]

        deadline = time.monotonic() + 30
        while not lines() and time.monotonic() < deadline:
            time.sleep(0.05)
        outcome = backend.resize(pod.name, 2.0, 256)
        assert outcome.in_place, outcome.reason
        while len(lines()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        backend.delete(pod.name, grace_s=0.0)
    (pid, start), (same, now) = lines()[:2]
    assert (float(start), float(now), same) == (0.5, 2.0, pid)
