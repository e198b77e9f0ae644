"""The fake scheduler places pods on several nodes by their requests, as Kubernetes does; each
node's kubelet runs only its own pods, and losing a node fails only the pods on it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import kubernetes  # type: ignore[import-untyped]
import pytest
from kubernetes import watch
from kubernetes.client import ApiException, CoreV1Api  # type: ignore[import-untyped]

from dlrover_kfp.backends.k8s_objects import pod_status
from dlrover_kfp.ports import PodPhase
from tests.fakes import FakeApiServer
from tests.fakes.scheduler import UNREACHABLE, FakeScheduler, Node, Resources, place

Json = dict[str, Any]
NODES = (Node("node-a", cpu="1"), Node("node-b", cpu="1"))
# Names the pod's own shared-memory directory in argv[1], leaves a file there, then sleeps.
MARK_SHM_AND_SLEEP = (
    "import os, pathlib, sys, time\n"
    "shm = pathlib.Path(os.environ['DLROVER_KFP_SHM_DIR'])\n"
    "(shm / 'mine').write_text(sys.argv[1])\n"
    "pathlib.Path(sys.argv[1]).write_text(str(shm))\n"
    "time.sleep(60)\n"
)


@dataclass
class Cluster:
    api: FakeApiServer
    scheduler: FakeScheduler
    v1: CoreV1Api

    def create(self, name: str, cpu: str, *argv: str) -> None:
        command = list(argv) or ["sleep", "60"]
        container = {
            "name": "main",
            "image": "python:3.11",
            "command": command,
            "resources": {"limits": {"cpu": cpu, "memory": "64Mi"}},
        }
        body = {
            "metadata": {"name": name, "labels": {"role": "worker", "index": "0"}},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 5,
                "containers": [container],
            },
        }
        self.v1.create_namespaced_pod("default", body)

    def raw(self, name: str) -> Json:
        """The pod as the API server sends it (the wire format the backend maps)."""
        obj = self.v1.read_namespaced_pod(name, "default")
        return self.v1.api_client.sanitize_for_serialization(obj)  # type: ignore[no-any-return]

    def node_of(self, name: str) -> str | None:
        node = self.raw(name)["spec"].get("nodeName")
        return str(node) if node else None

    def running(self, name: str) -> bool:
        return bool(self.raw(name)["status"].get("phase") == "Running")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with FakeApiServer() as api, FakeScheduler(api, NODES, log_dir=tmp_path / "nodes") as sched:
        config = api.write_kubeconfig(tmp_path / "kubeconfig")
        client = kubernetes.config.new_client_from_config(config_file=str(config))
        yield Cluster(api, sched, CoreV1Api(client))


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s}s"
        time.sleep(0.02)
    return found


def unschedulable(cluster: Cluster, name: str) -> str | None:
    """The scheduler's message on a pod it could not place, else None."""
    for cond in cluster.raw(name)["status"].get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return str(cond["message"])
    return None


def test_place_is_first_fit_and_says_why_no_node_fits() -> None:
    nodes = [
        Node("tight-memory", cpu="1", memory="1Gi"),
        Node("tight-cpu", cpu="500m", memory="4Gi"),
        Node("tight-both", cpu="500m", memory="1Gi"),
        Node("lost", cpu="8", memory="64Gi"),
    ]
    used = {n.name: Resources() for n in nodes}
    asked = Resources(Fraction(3, 4), Fraction(2 << 30))
    node, why = place(asked, nodes, used, lost=["lost"])
    assert node is None
    assert why == (
        "0/4 nodes are available: 1 " + UNREACHABLE + ", 2 Insufficient cpu, 2 Insufficient memory."
    )
    # an exact fit fits; what is used counts; the first node that fits wins
    assert place(Resources(Fraction(1), Fraction(1 << 30)), nodes, used, ()) == ("tight-memory", "")
    used["tight-memory"] = Resources(Fraction(1, 4))
    assert place(Resources(Fraction(1), Fraction(0)), nodes, used, ()) == ("lost", "")


def test_pods_wait_unschedulable_for_capacity_and_run_once_it_frees(cluster: Cluster) -> None:
    for name in ("p1", "p2", "p3"):  # 0.75 cpu each on two nodes of 1 cpu
        cluster.create(name, "750m")
    wait_for(lambda: cluster.running("p1") and cluster.running("p2"), "p1 and p2 running")
    assert (cluster.node_of("p1"), cluster.node_of("p2")) == ("node-a", "node-b")
    why = wait_for(lambda: unschedulable(cluster, "p3"), "p3 marked Unschedulable")
    assert why == "0/2 nodes are available: 2 Insufficient cpu."
    p3 = cluster.raw("p3")
    assert p3["status"]["phase"] == "Pending" and not p3["spec"].get("nodeName")
    # what the backend makes of it: the master can say why the pod waits
    status = pod_status(p3)
    assert (status.phase, status.message) == (PodPhase.PENDING, why)
    kubelets = cluster.scheduler.kubelets
    assert kubelets["node-a"].pid_of("p3") is None and kubelets["node-b"].pid_of("p3") is None

    cluster.v1.delete_namespaced_pod("p1", "default")
    wait_for(lambda: cluster.running("p3"), "p3 running once p1 is gone")
    assert cluster.node_of("p3") == "node-a"
    assert unschedulable(cluster, "p3") is None  # PodScheduled is True now
    assert pod_status(cluster.raw("p3")).message is None
    # each kubelet runs only the pods bound to its node
    assert kubelets["node-a"].pid_of("p3") is not None and kubelets["node-b"].pid_of("p3") is None
    assert kubelets["node-b"].pid_of("p2") is not None and kubelets["node-a"].pid_of("p2") is None


def test_losing_a_node_fails_only_its_pods_and_places_nothing_there(cluster: Cluster) -> None:
    cluster.create("on-a", "750m")
    cluster.create("on-b", "750m")
    wait_for(lambda: cluster.running("on-a") and cluster.running("on-b"), "both running")
    assert (cluster.node_of("on-a"), cluster.node_of("on-b")) == ("node-a", "node-b")
    kubelets = cluster.scheduler.kubelets
    pid_b = kubelets["node-b"].pid_of("on-b")
    rv = cluster.v1.list_namespaced_pod("default").metadata.resource_version

    cluster.scheduler.lose_node("node-a")
    # a new pod goes nowhere near the lost node: it waits, and says why
    cluster.create("new", "750m")
    why = wait_for(lambda: unschedulable(cluster, "new"), "new marked Unschedulable")
    assert why == f"0/2 nodes are available: 1 Insufficient cpu, 1 {UNREACHABLE}."
    assert not cluster.node_of("new")

    # what was deleted, up to the new pod's creation: the lost node's pod only, as NodeLost
    deleted = {}
    for event in watch.Watch().stream(
        cluster.v1.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=10
    ):
        obj = event["raw_object"]
        if event["type"] == "DELETED":
            deleted[obj["metadata"]["name"]] = obj
        if event["type"] == "ADDED" and obj["metadata"]["name"] == "new":
            break
    assert list(deleted) == ["on-a"]
    assert pod_status(deleted["on-a"], gone=True).reason == "NodeLost"
    with pytest.raises(ApiException) as gone:
        cluster.v1.read_namespaced_pod("on-a", "default")
    assert gone.value.status == 404
    # the other node's pod runs on, the same process
    assert cluster.running("on-b") and kubelets["node-b"].pid_of("on-b") == pid_b


def test_every_pod_has_its_own_shm_on_one_node_and_across_nodes(
    cluster: Cluster, tmp_path: Path
) -> None:
    names = ("s1", "s2", "s3")  # 0.5 cpu each: s1 and s2 on node-a, s3 on node-b
    for name in names:
        cluster.create(name, "500m", sys.executable, "-c", MARK_SHM_AND_SLEEP, str(tmp_path / name))
    shm = {name: Path(wait_for(_text(tmp_path / name), f"{name} started")) for name in names}
    assert [cluster.node_of(n) for n in names] == ["node-a", "node-a", "node-b"]
    assert len(set(shm.values())) == 3
    for name in names:  # each sees only what it wrote there itself
        assert [p.name for p in shm[name].iterdir()] == ["mine"]
        assert (shm[name] / "mine").read_text() == str(tmp_path / name)
    cluster.v1.delete_namespaced_pod("s1", "default")
    wait_for(lambda: not shm["s1"].exists(), "s1's shared memory removed with it")
    assert shm["s2"].exists() and shm["s3"].exists()


def _text(path: Path) -> Callable[[], str]:
    """What ``path`` says once written, else ""."""
    return lambda: path.read_text() if path.exists() else ""
