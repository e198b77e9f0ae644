"""The Kubernetes backend through the unmodified official client, against the fake API server
(tests/fakes/kube_apiserver.py) whose fake kubelet runs each pod as a real local process.

:class:`TestKubernetesBackend` runs the whole :class:`ClusterBackendContract`; the rest is what
only a cluster has: evictions, preemption, node loss, API error storms, watch expiry, the
rights the master needs, where the job secret may appear.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlrover_kfp.backends import PodPhase, PodSpec, PodStatus
from dlrover_kfp.backends.k8s_objects import KubernetesSettings, OwnerRef, RetryPolicy
from dlrover_kfp.backends.kubernetes import (
    KubernetesApiError,
    KubernetesBackend,
    KubernetesUnavailableError,
    load_client,
)
from tests.backends.test_local_backend import (
    GROW_400_MB,
    SECRET,
    SLEEP_FOREVER,
    ClusterBackendContract,
    running,
    terminal,
    wait_for,
)
from tests.fakes.kube_apiserver import FakeApiServer
from tests.fakes.kubelet import FakeKubelet

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
    watch, usage, delete, relaunch of a finished pod, close."""
    with make_backend(api, tmp_path) as b:
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
