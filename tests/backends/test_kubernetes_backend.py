"""The Kubernetes backend through the unmodified official client, against the fake API server
(tests/fakes/kube_apiserver.py) whose fake kubelet runs each pod as a real local process.

:class:`TestKubernetesBackend` runs the whole :class:`ClusterBackendContract`; the rest is what
only a cluster has: evictions, preemption, node loss, API error storms, watch expiry, the
rights the master needs, where the job secret may appear.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlrover_kfp.backends import PodEvent, PodPhase, PodSpec, PodStatus
from dlrover_kfp.backends.k8s_objects import (
    Holder,
    KubernetesSettings,
    OwnerRef,
    RetryPolicy,
    micro_time,
    timestamp,
)
from dlrover_kfp.backends.kubernetes import (
    JobHeldError,
    KubernetesApiError,
    KubernetesBackend,
    KubernetesUnavailableError,
    LeaseLostError,
    load_client,
    local_holder,
)
from dlrover_kfp.errors import UserInputError
from tests.backends.test_local_backend import (
    GROW_400_MB,
    HOLD_150_MB,
    SECRET,
    SLEEP_FOREVER,
    ClusterBackendContract,
    running,
    terminal,
    wait_for,
    wait_holding,
)
from tests.fakes.kube_apiserver import FakeApiServer
from tests.fakes.kubelet import FakeKubelet
from tests.fakes.scheduler import UNREACHABLE, FakeScheduler, Node

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "default"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def kubelet(api: FakeApiServer, tmp_path: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(api, log_dir=tmp_path / "kubelet") as k:
        yield k


def make_backend(
    api: FakeApiServer, tmp_path: Path, job: str = "test", **settings: Any
) -> KubernetesBackend:
    config = api.write_kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)
    return KubernetesBackend(
        load_client(str(config)),
        KubernetesSettings(namespace=NAMESPACE, image="dlrover-kfp:test", **settings),
        job=job,
    )


class TestKubernetesBackend(ClusterBackendContract):
    start_timeout_s = 20.0
    oom_timeout_s = 10.0

    @pytest.fixture
    def backend(
        self, api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path
    ) -> Iterator[KubernetesBackend]:
        b = make_backend(api, tmp_path)
        yield b
        b.close()

    @pytest.fixture
    def python(self) -> tuple[str, ...]:
        return ("python",)  # the image's interpreter; the fake kubelet maps it to this one

    @pytest.fixture
    def shared_dir(self, tmp_path: Path) -> Path:
        return tmp_path


def quick(name: str, code: str, *, index: int = 0, memory_mb: int = 256) -> PodSpec:
    return PodSpec(
        name=name,
        role="worker",
        index=index,
        command=("python", "-c", code),
        env={"DLROVER_KFP_JOB_SECRET": SECRET},
        cpu=0.5,
        memory_mb=memory_mb,
        labels={"job": "test", "role": "worker"},
    )


def test_evicted_preempted_and_lost_pods_say_so(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    with make_backend(api, tmp_path) as b:
        for k in range(3):
            b.launch(quick(f"test-worker-{k}", SLEEP_FOREVER, index=k))
        for k in range(3):
            wait_for(b, f"test-worker-{k}", running, 20)
        kubelet.evict("test-worker-0")
        kubelet.preempt("test-worker-1")
        st0 = wait_for(b, "test-worker-0", terminal, 10)
        st1 = wait_for(b, "test-worker-1", terminal, 10)
        kubelet.lose_node()
        st2 = wait_for(b, "test-worker-2", terminal, 10)
    assert (st0.phase, st0.reason) == (PodPhase.FAILED, "Evicted")
    assert (st1.phase, st1.reason) == (PodPhase.FAILED, "Preempted")
    assert (st2.phase, st2.reason) == (PodPhase.FAILED, "NodeLost")


def test_on_two_nodes_a_pod_that_fits_none_says_why_and_a_lost_node_fails_only_its_own(
    api: FakeApiServer, tmp_path: Path
) -> None:
    nodes = [Node("node-a", cpu="1"), Node("node-b", cpu="1")]
    with (
        FakeScheduler(api, nodes, log_dir=tmp_path / "nodes") as cluster,
        make_backend(api, tmp_path) as b,
    ):
        for k in range(3):  # 0.75 cpu each: one per node, the third fits neither
            b.launch(dataclasses.replace(quick(f"test-worker-{k}", SLEEP_FOREVER), cpu=0.75))
            if k < 2:
                wait_for(b, f"test-worker-{k}", running, 20)
        waiting = wait_for(b, "test-worker-2", lambda st: st.message is not None, 10)
        assert waiting.phase is PodPhase.PENDING
        assert waiting.message == "0/2 nodes are available: 2 Insufficient cpu."
        cluster.lose_node("node-a")
        lost = wait_for(b, "test-worker-0", terminal, 10)
        assert (lost.phase, lost.reason) == (PodPhase.FAILED, "NodeLost")
        # The scheduler tells the pending pod why on its next pass, not with the node's loss
        # (a CI run read the statuses in between and saw the old message).
        unreachable = f"0/2 nodes are available: 1 Insufficient cpu, 1 {UNREACHABLE}."
        still = wait_for(b, "test-worker-2", lambda st: st.message == unreachable, 10)
        statuses = {st.name: st for st in b.statuses()}
    assert statuses["test-worker-1"].phase is PodPhase.RUNNING
    assert still.phase is PodPhase.PENDING
    assert statuses["test-worker-2"].phase is PodPhase.PENDING


def _resources(api: FakeApiServer, name: str) -> tuple[dict[str, Any], list[str]]:
    """The pod's desired limits and its resize conditions, as stored."""
    pod = api.get_object("pods", NAMESPACE, name)
    assert pod is not None
    conditions = [
        c["type"]
        for c in pod["status"].get("conditions") or []
        if c["type"].startswith("PodResize")
    ]
    return pod["spec"]["containers"][0]["resources"]["limits"], conditions


def _settled(api: FakeApiServer, name: str, limits: dict[str, str]) -> None:
    """Wait until the pod's desired limits are ``limits`` and no resize condition is left."""
    deadline = time.monotonic() + 5
    while _resources(api, name) != (limits, []):
        assert time.monotonic() < deadline, _resources(api, name)
        time.sleep(0.05)


def test_a_cluster_without_the_resize_subresource_refuses_and_the_pod_runs_on(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    """Kubernetes before 1.33 answers 404: in_place=False with the API's words, nothing
    changed, so that the caller replaces the pod."""
    api.serve_resize = False
    with make_backend(api, tmp_path) as b:
        b.launch(quick("test-worker-0", SLEEP_FOREVER))
        wait_for(b, "test-worker-0", running, 20)
        pid = kubelet.pid_of("test-worker-0")

        outcome = b.resize("test-worker-0", 1.0, 256)

        assert not outcome.in_place
        assert "404" in outcome.reason, outcome.reason
        assert _resources(api, "test-worker-0") == ({"cpu": "500m", "memory": "256Mi"}, [])
        assert kubelet.pid_of("test-worker-0") == pid
        assert wait_for(b, "test-worker-0", running, 0)


def test_an_infeasible_resize_is_refused_and_a_deferred_one_waits_for_room(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """On a node of 2 cores: 3 cores can never fit (PodResizePending Infeasible: refused at
    once); 1.75 cores fit the node but not beside another pod's 0.75 (Deferred: waited for,
    until the timeout, when the request is withdrawn and the pod runs on as it was; or until
    the other pod goes, when it is applied)."""
    with (
        FakeScheduler(api, [Node("node-a", cpu="2")], log_dir=tmp_path / "nodes") as cluster,
        make_backend(api, tmp_path) as b,
    ):
        b.launch(dataclasses.replace(quick("test-worker-0", SLEEP_FOREVER), cpu=1.0))
        b.launch(dataclasses.replace(quick("test-worker-1", SLEEP_FOREVER, index=1), cpu=0.75))
        wait_for(b, "test-worker-0", running, 20)
        wait_for(b, "test-worker-1", running, 20)
        kubelet = cluster.kubelets["node-a"]
        pid = kubelet.pid_of("test-worker-0")
        asked = {"cpu": "1", "memory": "256Mi"}

        infeasible = b.resize("test-worker-0", 3.0, 256, timeout_s=10)
        _settled(api, "test-worker-0", asked)
        deferred = b.resize("test-worker-0", 1.75, 256, timeout_s=1.0)
        _settled(api, "test-worker-0", asked)

        assert not infeasible.in_place and infeasible.seconds < 5, infeasible
        assert infeasible.reason.startswith("Infeasible: Node didn't have enough capacity: cpu")
        assert not deferred.in_place and deferred.seconds >= 1.0, deferred
        assert deferred.reason == "not applied within 1 s"
        assert kubelet.pid_of("test-worker-0") == pid
        assert wait_for(b, "test-worker-0", running, 0)
        (usage,) = [u for u in b.usage() if u.name == "test-worker-0"] or [None]
        assert usage is None or usage.cpu_requested == 1.0

        room = threading.Timer(0.5, b.delete, ("test-worker-1",), {"grace_s": 0.5})
        room.start()
        waited = b.resize("test-worker-0", 1.75, 256, timeout_s=10)
        room.join()
        assert waited.in_place and waited.seconds >= 0.5, waited
        assert kubelet.pid_of("test-worker-0") == pid
        _settled(api, "test-worker-0", {"cpu": "1750m", "memory": "256Mi"})


def test_a_memory_decrease_below_use_is_refused_by_the_kubelet(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    """Allowed by the API (1.34+, resizePolicy NotRequired); the kubelet will not lower a
    limit below what the container holds (PodResizeInProgress Error), the pod unchanged."""
    with make_backend(api, tmp_path) as b:
        b.launch(quick("test-worker-0", HOLD_150_MB, memory_mb=300))
        wait_for(b, "test-worker-0", running, 20)
        wait_holding(b, "test-worker-0", 140, 10)
        pid = kubelet.pid_of("test-worker-0")

        outcome = b.resize("test-worker-0", 0.5, 100, timeout_s=10)
        _settled(api, "test-worker-0", {"cpu": "500m", "memory": "300Mi"})

        assert not outcome.in_place
        assert outcome.reason.startswith("Error: cannot lower"), outcome.reason
        assert kubelet.pid_of("test-worker-0") == pid
        assert wait_for(b, "test-worker-0", running, 0)


def test_a_pod_deleted_by_someone_else_reads_deleted(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    with make_backend(api, tmp_path) as b:
        b.launch(quick("test-worker-0", SLEEP_FOREVER))
        wait_for(b, "test-worker-0", running, 20)
        # as `kubectl delete pod` does: a graceful delete through the API
        client = load_client(str(api.write_kubeconfig(tmp_path / "other")))
        from kubernetes import client as k8s  # noqa: PLC0415

        k8s.CoreV1Api(client).delete_namespaced_pod("test-worker-0", NAMESPACE)
        st = wait_for(b, "test-worker-0", terminal, 20)
    assert (st.phase, st.reason) == (PodPhase.FAILED, "Deleted")


def test_an_api_error_storm_and_a_throttle_are_ridden_out_and_logged(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dlrover_kfp.kubernetes")
    with make_backend(api, tmp_path, retry=RetryPolicy(initial_s=0.1, max_s=1.0)) as b:
        api.storm(2.0, code=500)
        started = time.monotonic()
        b.launch(quick("test-worker-0", "print('ok')"))
        assert time.monotonic() - started >= 1.5  # it waited the storm out
        api.throttle(1.5, retry_after=1)
        b.launch(quick("test-worker-1", "print('ok')", index=1))
        assert wait_for(b, "test-worker-0", terminal, 20).phase is PodPhase.SUCCEEDED
        assert wait_for(b, "test-worker-1", terminal, 20).phase is PodPhase.SUCCEEDED
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert any("500" in m for m in retries), retries
    assert any("429" in m and "retry 1 in 1.0s" in m for m in retries), retries


def test_the_retry_deadline_ends_in_a_transient_error(api: FakeApiServer, tmp_path: Path) -> None:
    with make_backend(api, tmp_path, retry=RetryPolicy(0.05, 0.2, deadline_s=1.0)) as b:
        api.storm(30.0, code=503)
        with pytest.raises(KubernetesUnavailableError, match="still failing"):
            b.launch(quick("test-worker-0", "print('ok')"))
        api.clear_faults()


def test_permanent_errors_carry_the_api_message_at_once(api: FakeApiServer, tmp_path: Path) -> None:
    with make_backend(api, tmp_path) as b:
        api.forbid("create", "pods")
        started = time.monotonic()
        with pytest.raises(KubernetesApiError, match="403 Forbidden") as info:
            b.launch(quick("test-worker-0", "print('ok')"))
        assert time.monotonic() - started < 1.0  # not retried
        assert info.value.status == 403
        assert "pods" in str(info.value) and "test-worker-0" in str(info.value)
        assert b.statuses() == []  # nothing recorded for a pod that was never created
        api.allow("create", "pods")
        api.fail(1, code=422, verb="create", resource="pods", message="spec: Required value")
        with pytest.raises(KubernetesApiError, match=r"422 .*spec: Required value"):
            b.launch(quick("test-worker-1", "print('ok')", index=1))


def test_deleting_the_master_pod_deletes_its_job(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    """In the cluster the master's own pod owns the job's pods and Secret: Kubernetes' garbage
    collector deletes them with it, even when the master had no chance to clean up."""
    master = api.create_object(
        "pods",
        {
            "metadata": {"name": "master", "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "master", "image": "dlrover-kfp:test"}]},
        },
        NAMESPACE,
    )
    owner = OwnerRef(name="master", uid=master["metadata"]["uid"])
    with make_backend(api, tmp_path, owner=owner) as b:
        b.launch(quick("test-worker-0", SLEEP_FOREVER))
        wait_for(b, "test-worker-0", running, 20)
        assert api.list_objects("secrets", NAMESPACE)
        from kubernetes import client as k8s  # noqa: PLC0415

        other = k8s.CoreV1Api(load_client(str(api.write_kubeconfig(tmp_path / "admin"))))
        other.delete_namespaced_pod("master", NAMESPACE, grace_period_seconds=0)
        st = wait_for(b, "test-worker-0", terminal, 20)
        assert (st.phase, st.reason) == (PodPhase.FAILED, "Deleted")
        deadline = time.monotonic() + 10
        while api.list_objects("secrets", NAMESPACE) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert api.list_objects("secrets", NAMESPACE) == []


def test_a_watch_that_expires_relists_and_misses_no_end(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dlrover_kfp.kubernetes")
    with make_backend(api, tmp_path) as b:
        b.launch(quick("test-worker-0", "import time; time.sleep(1.5)"))
        wait_for(b, "test-worker-0", running, 20)
        api.compact()  # the backend's resourceVersion is gone from the history ...
        api.expire_watches()  # ... and its watch ends with 410: only a relist can resume
        st = wait_for(b, "test-worker-0", terminal, 20)
    assert st.phase is PodPhase.SUCCEEDED
    assert any("410" in r.getMessage() and "relisting" in r.getMessage() for r in caplog.records)


def test_an_oom_kill_reaches_the_backend_within_a_second(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    with make_backend(api, tmp_path) as b:
        b.launch(quick("test-worker-0", GROW_400_MB, memory_mb=128))
        st = wait_for(b, "test-worker-0", terminal, 20)
        seen = time.monotonic()
    assert (st.reason, st.exit_code) == ("OOMKilled", 137)
    written = kubelet.status_write("test-worker-0", ("Failed", "Succeeded")).at
    latency = seen - written
    print(f"\nOOMKilled: kubelet wrote it, the backend saw it {latency * 1000:.0f} ms later")
    assert latency < 1.0


def test_200_pods_churned_without_a_missed_end(api: FakeApiServer, tmp_path: Path) -> None:
    """No kubelet: the test writes each pod's end through the API as a kubelet would, 200 times
    in a burst, and every one must reach the backend's statuses through its watch."""
    from kubernetes import client as k8s  # noqa: PLC0415

    other = k8s.CoreV1Api(load_client(str(api.write_kubeconfig(tmp_path / "kubelet-config"))))
    with make_backend(api, tmp_path) as b:
        names = [f"test-worker-{k}" for k in range(200)]
        for k, name in enumerate(names):
            b.launch(quick(name, "print('ok')", index=k))
        for k, name in enumerate(names):
            ok = k % 3 != 0
            status = {
                "phase": "Succeeded" if ok else "Failed",
                "containerStatuses": [
                    {
                        "name": "worker",
                        "image": "dlrover-kfp:test",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": 0 if ok else 137,
                                "reason": "Completed" if ok else "OOMKilled",
                            }
                        },
                    }
                ],
            }
            other.patch_namespaced_pod_status(name, NAMESPACE, {"status": status})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ends = [s for s in b.statuses() if s.phase.terminal]
            if len(ends) == 200:
                break
            time.sleep(0.05)
        statuses = {s.name: s for s in b.statuses()}
    assert len([s for s in statuses.values() if s.phase.terminal]) == 200
    for k, name in enumerate(names):
        expected = ("Completed", 0) if k % 3 else ("OOMKilled", 137)
        assert (statuses[name].reason, statuses[name].exit_code) == expected


def test_the_secret_is_in_no_pod_log_or_error(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    out = tmp_path / "seen"
    code = (
        f"import os, pathlib; pathlib.Path({str(out)!r})"
        ".write_text(os.environ['DLROVER_KFP_JOB_SECRET'])"
    )
    with make_backend(api, tmp_path) as b:
        b.launch(quick("test-worker-0", code))
        wait_for(b, "test-worker-0", terminal, 20)
        pods = api.list_objects("pods", NAMESPACE)
        statuses = repr(b.statuses())
    assert out.read_text() == SECRET  # the pod got it, through the Secret
    assert SECRET not in json.dumps(pods)
    assert SECRET not in caplog.text and SECRET not in statuses
    assert SECRET not in "".join(str(c) for c in api.calls)


def test_the_role_grants_exactly_the_calls_the_backend_makes(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    """Every operation of the backend once: launch (Secret made, then a new value updates it),
    watch, resize, usage, an event on a pod, delete, relaunch of a finished pod, close."""
    # A short lease, so that its renewals (get + update) happen within the test.
    with make_backend(api, tmp_path, lease_duration_s=3, lease_renew_s=0.3) as b:
        b.launch(quick("test-worker-0", SLEEP_FOREVER))
        b.launch(
            PodSpec(
                name="test-ps-0",
                role="ps",
                index=0,
                command=("python", "-c", "print('ok')"),
                env={"DLROVER_KFP_JOB_SECRET": "another-value"},
                cpu=0.5,
                memory_mb=256,
            )
        )
        wait_for(b, "test-worker-0", running, 20)
        wait_for(b, "test-ps-0", terminal, 20)
        assert b.resize("test-worker-0", 0.25, 256).in_place
        b.emit_event(PodEvent(pod="test-worker-0", reason="Scaled", message="0.25 cpu"))
        deadline = time.monotonic() + 10
        while not b.usage() and time.monotonic() < deadline:
            time.sleep(0.2)
        b.delete("test-worker-0", grace_s=1.0)
        b.launch(quick("test-ps-0", "print('again')"))  # a relaunch under a finished name
        wait_for(b, "test-ps-0", terminal, 20)
    used = {(group, resource, verb) for group, resource, verb in api.rbac_verbs()}
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text()))
    role = next(d for d in docs if d and d["kind"] == "Role")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert used == granted, f"used but not granted: {used - granted}; unused: {granted - used}"


# -- one master per job: the job's Lease ---------------------------------------------------------

LEASE = "test-master"


def _lease(api: FakeApiServer) -> dict[str, Any]:
    lease = api.get_object("leases", NAMESPACE, LEASE)
    assert lease is not None, "no lease"
    return lease


def _freeze(b: KubernetesBackend) -> None:
    """As a master SIGKILLed (or frozen) looks from the cluster: it stops renewing its lease
    and releases nothing. Its renewal thread is stopped; the rest of the object is left as
    it was, so that a test can let it wake up again (:func:`_thaw`)."""
    b._lease_stop.set()
    b._renewer.join(timeout=10)


def _thaw(b: KubernetesBackend) -> None:
    """A frozen master (:func:`_freeze`) resumes: its renewals start again."""
    b._lease_stop.clear()
    b._renewer = threading.Thread(target=b._renew_loop, daemon=True)
    b._renewer.start()


def test_a_second_master_of_the_job_is_refused_while_the_first_runs(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    """Issue 25 item 1 on a cluster: a second master of the same job in the same namespace (a
    KFP retry, a re-run task) would replace the first one's Secret and pods; it is refused at
    once, naming the live holder, and the first one's objects are untouched."""
    with make_backend(api, tmp_path) as first:
        first.launch(quick("test-worker-0", SLEEP_FOREVER))
        wait_for(first, "test-worker-0", running, 20)
        pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in api.list_objects("pods")}
        secret = api.get_object("secrets", NAMESPACE, "test-env")
        assert secret is not None
        writes = len([c for c in api.client_calls() if c.verb != "get"])
        started = time.monotonic()
        with pytest.raises(JobHeldError) as refused:
            make_backend(api, tmp_path)
        took = time.monotonic() - started
        message = str(refused.value)
        print(f"\nsecond master refused in {took * 1000:.0f} ms: {message}")
        assert took < 5.0
        assert isinstance(refused.value, UserInputError)  # the CLI's exit 2, no traceback
        assert "\n" not in message and first.holder in message and "renewed" in message
        assert "test-master" in message and NAMESPACE in message
        # nothing of the first master's was written: its pods and Secret are as they were
        assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in api.list_objects("pods")} == (
            pods
        )
        assert api.get_object("secrets", NAMESPACE, "test-env") == secret
        wrote = [c for c in api.client_calls() if c.verb != "get"][writes:]
        assert [(c.verb, c.resource, c.code) for c in wrote] == [("create", "leases", 409)]
        assert running(next(s for s in first.statuses() if s.name == "test-worker-0"))
        assert _lease(api)["spec"]["holderIdentity"] == first.holder


def test_the_lease_is_held_while_open_and_free_after_close(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    first = make_backend(api, tmp_path)
    try:
        first.launch(quick("test-worker-0", SLEEP_FOREVER))
        lease = _lease(api)
        assert lease["spec"]["holderIdentity"] == first.holder
        assert lease["spec"]["leaseDurationSeconds"] == 30
        assert Holder.parse(first.holder) is not None
        assert Holder.parse(first.holder).pid == os.getpid()  # type: ignore[union-attr]
    finally:
        first.close()
    assert api.get_object("leases", NAMESPACE, LEASE) is None  # released
    with make_backend(api, tmp_path) as second:
        assert _lease(api)["spec"]["holderIdentity"] == second.holder != first.holder
        second.launch(quick("test-worker-0", "print('ok')"))
        assert wait_for(second, "test-worker-0", terminal, 20).phase is PodPhase.SUCCEEDED
    assert api.get_object("leases", NAMESPACE, LEASE) is None


def test_a_killed_masters_lease_is_taken_after_its_term_and_not_before(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A master that stops renewing (SIGKILLed, frozen) blocks a successor for the lease's
    term after its last renewal, no longer; if it wakes up, it finds the lease taken and
    stops acting on the job (refuses to launch or delete, leaves the successor's objects)."""
    caplog.set_level(logging.INFO, logger="dlrover_kfp.kubernetes")
    term = 2
    first = make_backend(api, tmp_path, lease_duration_s=term, lease_renew_s=0.4)
    try:
        first.launch(quick("test-worker-0", SLEEP_FOREVER))
        deadline = time.monotonic() + 10
        while not any(c.verb == "update" and c.resource == "leases" for c in api.client_calls()):
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(0.05)
        _freeze(first)
        renewed = timestamp(_lease(api)["spec"]["renewTime"])
        assert renewed is not None
        refusals = 0
        while True:
            try:
                second = make_backend(api, tmp_path, lease_duration_s=term, lease_renew_s=0.4)
                break
            except JobHeldError:
                refusals += 1
                assert time.time() < renewed + term + 10, "never taken over"
                time.sleep(0.05)
        acquired = time.time()
        try:
            waited = acquired - renewed
            print(
                f"\nsuccessor refused {refusals} times, then took the lease {waited:.2f}s "
                f"after the last renewal (term {term}s)"
            )
            assert refusals > 0
            assert term <= waited < term + 3.0  # after expiry, not before; soon after
            lease = _lease(api)
            assert lease["spec"]["holderIdentity"] == second.holder
            assert lease["spec"]["leaseTransitions"] == 1
            assert any("took over lease test-master" in r.getMessage() for r in caplog.records)
            second.launch(quick("test-worker-0", SLEEP_FOREVER))  # replaces the first's pod
            wait_for(second, "test-worker-0", running, 20)
            # the first master wakes up: its next renewal finds the lease another's
            _thaw(first)
            deadline = time.monotonic() + 10
            while first.lease_lost is None:
                assert time.monotonic() < deadline, "the first never noticed"
                time.sleep(0.05)
            assert second.holder in first.lease_lost
            with pytest.raises(LeaseLostError, match="lost its lease test-master"):
                first.launch(quick("test-worker-1", SLEEP_FOREVER, index=1))
            with pytest.raises(LeaseLostError):
                first.delete("test-worker-0")
            pod = api.get_object("pods", NAMESPACE, "test-worker-0")
            first.close()  # leaves the successor's pod, Secret and lease alone
            assert api.get_object("pods", NAMESPACE, "test-worker-0") == pod
            assert api.get_object("secrets", NAMESPACE, "test-env") is not None
            assert _lease(api)["spec"]["holderIdentity"] == second.holder
        finally:
            second.close()
    finally:
        first.close()
    assert api.get_object("leases", NAMESPACE, LEASE) is None


def test_lease_times_and_identities_keep_their_wire_form() -> None:
    # a whole second still has its six fraction digits (the client's datetime would drop them
    # and the API server would refuse the Lease)
    assert micro_time(1795718585.0) == "2026-11-26T18:43:05.000000Z"
    assert timestamp(micro_time(1795718585.25)) == 1795718585.25
    me = local_holder({"POD_NAME": "train-master-x7k2"})
    assert me.host == "train-master-x7k2" and me.pid == os.getpid()
    assert Holder.parse(me.identity) == me
    assert local_holder().identity != local_holder().identity  # two backends of one process
    assert Holder.parse("some-other-tool") is None


def _plant_lease(api: FakeApiServer, holder: str, renewed_ago_s: float) -> None:
    renewed = time.time() - renewed_ago_s
    api.create_object(
        "leases",
        {
            "metadata": {"name": LEASE},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": 30,
                "acquireTime": micro_time(renewed - 60),
                "renewTime": micro_time(renewed),
                "leaseTransitions": 4,
            },
        },
        NAMESPACE,
    )


def test_a_lease_left_by_a_gone_process_of_this_machine_is_taken_at_once(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """A master on this machine that was SIGKILLed a moment ago: its lease is fresh, but its
    process is gone (an OS fact, as the output directory's lock is), so the same command run
    again need not wait for the term. One whose process runs is refused; so is a fresh lease
    of another machine, while a lapsed one is taken."""
    from kubernetes import client as k8s  # noqa: PLC0415

    admin = k8s.CoordinationV1Api(load_client(str(api.write_kubeconfig(tmp_path / "admin"))))
    me = local_holder()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    gone = Holder(me.host, int(dead.stdout), me.boot, "0badc0de", 0)
    _plant_lease(api, gone.identity, renewed_ago_s=1.0)
    with make_backend(api, tmp_path) as b:
        assert _lease(api)["spec"]["holderIdentity"] == b.holder
        assert _lease(api)["spec"]["leaseTransitions"] == 5
    live = Holder(me.host, os.getppid(), me.boot, "0badc0de", 0)  # pytest's parent runs
    elsewhere = Holder("another-host", int(dead.stdout), "b007b007b007", "0badc0de", 0)
    for holder in (live, elsewhere):
        _plant_lease(api, holder.identity, renewed_ago_s=1.0)
        with pytest.raises(JobHeldError, match=rf"held by {holder.identity} \(renewed \d+s ago"):
            make_backend(api, tmp_path)
        admin.delete_namespaced_lease(LEASE, NAMESPACE)
    _plant_lease(api, elsewhere.identity, renewed_ago_s=31.0)  # lapsed
    with make_backend(api, tmp_path) as b:
        assert _lease(api)["spec"]["holderIdentity"] == b.holder


def test_two_masters_taking_over_at_once_one_wins(
    api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both read the lapsed lease at the same version; the other master writes first, so this
    one's update at that version gets 409 from the API server, and it is refused naming the
    winner rather than overwriting it."""
    from kubernetes import client as k8s  # noqa: PLC0415

    _plant_lease(api, "another-host:1:b007:0badc0de-0", renewed_ago_s=60.0)
    rival = k8s.CoordinationV1Api(load_client(str(api.write_kubeconfig(tmp_path / "rival"))))
    read = k8s.CoordinationV1Api.read_namespaced_lease
    raced: list[str] = []

    def read_then_race(self: Any, name: str, namespace: str, **kwargs: Any) -> Any:
        response = read(self, name, namespace, **kwargs)
        if not raced:
            seen = json.loads(response.data)
            raced.append(seen["metadata"]["resourceVersion"])
            now = micro_time(time.time())
            seen["spec"].update(holderIdentity="rival-master", renewTime=now, acquireTime=now)
            rival.replace_namespaced_lease(name, namespace, seen)
        return response

    monkeypatch.setattr(k8s.CoordinationV1Api, "read_namespaced_lease", read_then_race)
    with pytest.raises(JobHeldError, match="held by rival-master"):
        make_backend(api, tmp_path)
    updates = [c for c in api.client_calls() if c.resource == "leases" and c.verb == "update"]
    assert [c.code for c in updates] == [200, 409]  # the rival's, then this master's
    assert _lease(api)["spec"]["holderIdentity"] == "rival-master"


def test_without_rights_on_leases_the_message_says_what_to_apply(
    api: FakeApiServer, tmp_path: Path
) -> None:
    api.forbid("create", "leases")
    with pytest.raises(KubernetesApiError, match=r"403 Forbidden.*re-apply deploy/rbac.yaml"):
        make_backend(api, tmp_path)
    assert api.list_objects("secrets", NAMESPACE) == []


def _status(b: KubernetesBackend, name: str) -> PodStatus | None:
    return next((s for s in b.statuses() if s.name == name), None)


def test_no_metrics_api_means_no_usage_and_one_warning(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    api.serve_metrics = False
    caplog.set_level(logging.WARNING, logger="dlrover_kfp.kubernetes")
    with make_backend(api, tmp_path) as b:
        b.launch(quick("test-worker-0", SLEEP_FOREVER))
        wait_for(b, "test-worker-0", running, 20)
        assert b.usage() == [] and b.usage() == []
    assert sum("no pod metrics" in r.getMessage() for r in caplog.records) == 1


def test_python_is_this_interpreter_under_the_fake_kubelet() -> None:
    # The contract's pods run "python": the fake kubelet maps it to the interpreter with the
    # project installed, as an image would have it on its PATH.
    assert Path(sys.executable).exists()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
def test_kubectl_lists_and_describes_the_jobs_pods(
    api: FakeApiServer, kubelet: FakeKubelet, tmp_path: Path
) -> None:
    config = api.write_kubeconfig(tmp_path / "kubectl-config", namespace=NAMESPACE)

    def kubectl(*args: str) -> str:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(config), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    with make_backend(api, tmp_path) as b:
        b.launch(quick("test-worker-0", SLEEP_FOREVER))
        b.launch(quick("test-worker-1", SLEEP_FOREVER, index=1))
        for name in ("test-worker-0", "test-worker-1"):
            wait_for(b, name, running, 20)
        listed = kubectl("get", "pods", "-l", "job=test")
        described = kubectl("describe", "pod", "test-worker-1")
    rows = [line.split() for line in listed.splitlines()[1:]]
    assert sorted((r[0], r[2]) for r in rows) == [
        ("test-worker-0", "Running"),
        ("test-worker-1", "Running"),
    ]
    assert "Status:" in described and "Running" in described
    assert "index=1" in described and "role=worker" in described
    assert "cpu:     500m" in described or "cpu: 500m" in described.replace("  ", " ")
    assert SECRET not in listed + described


class TestKubernetesBackendOnARealCluster(ClusterBackendContract):
    """Opt-in (``pytest -m real_cluster``): the contract against the cluster ``KUBECONFIG``
    names, in namespace ``DLROVER_KFP_TEST_NAMESPACE``, with pods of image
    ``DLROVER_KFP_TEST_IMAGE`` (deploy/build.sh; it must have ``python``). Tests that need a
    directory shared with the pods skip: a real cluster's pods do not see this machine's."""

    pytestmark = pytest.mark.real_cluster
    start_timeout_s = 180.0
    oom_timeout_s = 60.0

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[KubernetesBackend]:
        missing = [
            v
            for v in ("KUBECONFIG", "DLROVER_KFP_TEST_NAMESPACE", "DLROVER_KFP_TEST_IMAGE")
            if not os.environ.get(v)
        ]
        if missing:
            pytest.skip(f"a real-cluster run needs {', '.join(missing)} set")
        b = KubernetesBackend(
            load_client(os.environ["KUBECONFIG"]),
            KubernetesSettings(
                namespace=os.environ["DLROVER_KFP_TEST_NAMESPACE"],
                image=os.environ["DLROVER_KFP_TEST_IMAGE"],
            ),
            job="contract",
        )
        yield b
        b.close()

    @pytest.fixture
    def python(self) -> tuple[str, ...]:
        return ("python",)

    @pytest.fixture
    def shared_dir(self, tmp_path: Path) -> Path:
        pytest.skip("a real cluster's pods do not share a directory with this machine")

    @pytest.fixture
    def cpu_control(self) -> None:
        return None  # the pods run on the cluster's nodes, not beside a control here
