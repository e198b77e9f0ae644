"""The job master's Events on Kubernetes (KubernetesBackend.emit_event), through the official
client against the fake API server: on the pod they are about (its uid, so that ``kubectl
describe pod`` lists them beside the kubelet's own), the job's on the master's own pod, and
never a failure of the run when the cluster does not take them."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlrover_kfp.backends import PodEvent
from dlrover_kfp.backends.k8s_objects import EVENT_SOURCE, OwnerRef
from dlrover_kfp.backends.kubernetes import EVENT_RETRY_S
from tests.backends.test_kubernetes_backend import NAMESPACE, make_backend, quick
from tests.backends.test_local_backend import SLEEP_FOREVER, running, wait_for
from tests.fakes.kube_apiserver import FakeApiServer
from tests.fakes.kubelet import FakeKubelet

MASTER = OwnerRef(name="test-master", uid="0b5e6c1e-master")
RELAUNCHED = PodEvent(
    pod="test-worker-0", reason="Relaunched", message="worker-0 relaunched with 768 MiB"
)
OOM = PodEvent(pod="test-worker-0", reason="OOMKilled", message="exit code 137", warning=True)
SCALED = PodEvent(pod=None, reason="Scaled", message="3 workers x 1 cpu: 2,100 samples/s")


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def kubelet(api: FakeApiServer, tmp_path: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(api, log_dir=tmp_path / "kubelet") as k:
        yield k


def _events(api: FakeApiServer) -> list[dict[str, object]]:
    return api.list_objects("events", NAMESPACE)


def test_events_are_on_their_pods_and_kubectl_describe_shows_them(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    with make_backend(api, tmp_path, owner=MASTER) as b:
        b.launch(quick("test-worker-0", SLEEP_FOREVER))
        wait_for(b, "test-worker-0", running, 20)
        for event in (OOM, RELAUNCHED, SCALED):
            b.emit_event(event)
        config = api.write_kubeconfig(tmp_path / "kubectl-config", namespace=NAMESPACE)
        described = subprocess.run(
            ["kubectl", "--kubeconfig", str(config), "describe", "pod", "test-worker-0"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        pod = api.get_object("pods", NAMESPACE, "test-worker-0")
        assert pod is not None
    told = {e["reason"]: e for e in _events(api)}
    assert told.keys() == {"OOMKilled", "Relaunched", "Scaled"}
    uid = pod["metadata"]["uid"]
    for reason, event, kind in (
        ("OOMKilled", OOM, "Warning"),
        ("Relaunched", RELAUNCHED, "Normal"),
    ):
        got = told[reason]
        assert got["involvedObject"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "test-worker-0",
            "namespace": NAMESPACE,
            "uid": uid,
        }
        assert (got["type"], got["message"], got["count"]) == (kind, event.message, 1)
        assert got["source"] == {"component": EVENT_SOURCE}
        assert got["reportingComponent"] == EVENT_SOURCE
        assert got["metadata"]["labels"]["job"] == "test"  # type: ignore[index]
    # The job's own event is on the master's pod.
    assert told["Scaled"]["involvedObject"]["name"] == MASTER.name  # type: ignore[index]
    assert told["Scaled"]["involvedObject"]["uid"] == MASTER.uid  # type: ignore[index]
    # kubectl finds them by the pod (a field selector on the involved object), as for the
    # kubelet's own: the job's event is not among the worker's.
    events = described[described.index("Events:") :]
    assert "Warning  OOMKilled" in events and "exit code 137" in events
    assert "Normal   Relaunched" in events and EVENT_SOURCE in events
    assert "Scaled" not in events


def test_an_event_the_cluster_does_not_take_is_logged_and_nothing_fails(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="dlrover_kfp.kubernetes")
    with make_backend(api, tmp_path) as b:  # a master outside the cluster: no pod of its own
        b.launch(quick("test-worker-0", SLEEP_FOREVER))
        wait_for(b, "test-worker-0", running, 20)
        # A Role without `events` `create`: refused at once, not retried.
        api.forbid("create", "events")
        started = time.monotonic()
        b.emit_event(OOM)
        assert time.monotonic() - started < 1.0
        api.allow("create", "events")
        # An API server failing for longer than the event's retry: given up after it.
        api.storm(30.0, code=503)
        started = time.monotonic()
        b.emit_event(RELAUNCHED)
        waited = time.monotonic() - started
        api.clear_faults()
        assert waited <= EVENT_RETRY_S + 1.0, waited
        # The job's event has no pod to go on outside the cluster: no call at all.
        calls = len(api.calls)
        b.emit_event(SCALED)
        assert len(api.calls) == calls
        # The backend goes on as before.
        b.delete("test-worker-0", grace_s=1.0)
    assert _events(api) == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("event not created" in m and "403" in m for m in warnings), warnings
    assert any("event not created" in m and "still failing" in m for m in warnings), warnings
    assert any("no master pod" in r.getMessage() for r in caplog.records)
