"""A fake kube-scheduler and the kubelets of its nodes: a cluster of several nodes, for tests.

Kubernetes places each pod on a node whose allocatable CPU and memory still fit the pod's
requests, the requests of the pods bound there and not ended (``Succeeded``/``Failed``) counted
against it (a pod being deleted still counts until it is gone); a pod that fits no node stays
Pending, its ``PodScheduled`` condition False with reason ``Unschedulable`` and a message that
counts why each node refused it (``0/2 nodes are available: 2 Insufficient cpu.``), and is tried
again when a pod ends or goes. A node that stops answering is tainted unreachable: nothing new is
placed there, and its pods fail (:meth:`FakeKubelet.lose_node`).

:class:`FakeScheduler` does this over the API server's HTTP interface (a list and watch of pods,
``pods/NAME/binding``, a strategic-merge patch of ``pods/NAME/status``), for ``N`` nodes whose
allocatable resources the test chooses, each run by a :class:`~tests.fakes.kubelet.FakeKubelet`
that runs only the pods bound to it. A one-node fake cluster needs none of this: a lone
``FakeKubelet`` binds every pod to itself.

Choices, as small as what the product needs: first fit, nodes in the order given, pending pods in
creation order (the real scheduler scores nodes and spreads; a test that wants a pod on a node
sizes the pods so); only CPU and memory requests count (no pod count, affinity, taints other
than a lost node's, priorities or preemption, so no ``preemption:`` clause in the message); no
``FailedScheduling`` event, since the product reads pods, not events; no Node objects (the API
server serves none; the test's :class:`Node` list is the cluster). Every node's pods run on this
host, each with a private ``/dev/shm`` (the local backend's, see :mod:`.kubelet`); no node has a
local disk of its own, as no pod of the product mounts a ``hostPath``.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Self

from tests.fakes.kube_apiserver import FakeApiServer, Json, parse_quantity, rfc3339
from tests.fakes.kubelet import ApiClient, FakeKubelet, watch_pods

#: What the real scheduler says of a node tainted ``node.kubernetes.io/unreachable``.
UNREACHABLE = "node(s) had untolerated taint {node.kubernetes.io/unreachable: }"
_ENDED = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class Node:
    """A node and what it has for pods (allocatable ``cpu`` cores and ``memory``, quantities)."""

    name: str
    cpu: str | int = "1"
    memory: str = "4Gi"


@dataclass(frozen=True, slots=True)
class Resources:
    """CPU cores and memory bytes, exactly (quantities are decimal: ``750m`` is 3/4)."""

    cpu: Fraction = Fraction(0)
    memory: Fraction = Fraction(0)

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.memory + other.memory)


def requests_of(pod: Json) -> Resources:
    """The sum of the pod's containers' requests (the API server has defaulted a request to
    its limit where only the limit was given)."""
    total = Resources()
    for container in (pod.get("spec") or {}).get("containers") or []:
        asked = (container.get("resources") or {}).get("requests") or {}
        total += Resources(
            parse_quantity(asked.get("cpu") or 0), parse_quantity(asked.get("memory") or 0)
        )
    return total


def place(
    asked: Resources, nodes: Sequence[Node], used: Mapping[str, Resources], lost: Iterable[str]
) -> tuple[str | None, str]:
    """The first node where ``asked`` fits beside what is ``used`` there, else None and why
    none does, in the real scheduler's words: each node's reasons counted, the counts sorted
    as strings (``1 Insufficient memory, 2 Insufficient cpu``)."""
    reasons: Counter[str] = Counter()
    gone = set(lost)
    for node in nodes:
        if node.name in gone:
            reasons[UNREACHABLE] += 1
            continue
        free_cpu = parse_quantity(node.cpu) - used[node.name].cpu
        free_memory = parse_quantity(node.memory) - used[node.name].memory
        short = [
            f"Insufficient {kind}"
            for kind, fits in (
                ("cpu", asked.cpu <= free_cpu),
                ("memory", asked.memory <= free_memory),
            )
            if not fits
        ]
        if not short:
            return node.name, ""
        reasons.update(short)
    counted = ", ".join(sorted(f"{n} {why}" for why, n in reasons.items()))
    return None, f"0/{len(nodes)} nodes are available: {counted}."


class FakeScheduler:
    """Places the pods of ``api`` on ``nodes`` and runs each node's kubelet (``kubelets``,
    made with ``kubelet_options``, logs under ``log_dir/NODE``); see the module docstring. Use
    as a context manager."""

    def __init__(
        self, api: FakeApiServer, nodes: Sequence[Node], *, log_dir: Path, **kubelet_options: Any
    ) -> None:
        names = [n.name for n in nodes]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"nodes need distinct names, at least one: {names}")
        self.nodes = tuple(nodes)
        self._client = ApiClient(api, "kube-scheduler")
        self._lock = threading.RLock()
        self._pods: dict[str, Json] = {}  # by uid, as last seen
        # Bound by this scheduler and not yet seen bound (the real scheduler's "assumed"
        # pods): their requests count on that node even if an older event arrives first.
        self._assumed: dict[str, str] = {}
        self._lost: set[str] = set()
        self._stop = threading.Event()
        with contextlib.ExitStack() as stack:  # a kubelet that fails to start: close the others
            self.kubelets = {
                node.name: stack.enter_context(
                    FakeKubelet(
                        api,
                        node_name=node.name,
                        log_dir=Path(log_dir) / node.name,
                        schedules=False,
                        # what its kubelet admits an in-place resize against
                        allocatable=(parse_quantity(node.cpu), parse_quantity(node.memory)),
                        **kubelet_options,
                    )
                )
                for node in nodes
            }
            self._kubelets = stack.pop_all()
        synced = threading.Event()
        self._thread = threading.Thread(
            target=watch_pods,
            args=(self._client, self._stop, synced, self._seen),
            name="fake-scheduler",
            daemon=True,
        )
        self._thread.start()
        synced.wait(timeout=10)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop placing pods, then stop every node's kubelet and its processes."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._client.close_watch()
        self._thread.join(timeout=10)
        self._kubelets.close()

    def lose_node(self, name: str) -> None:
        """Node ``name`` stops answering: it is tainted unreachable (nothing more is placed
        there) and its pods fail as :meth:`FakeKubelet.lose_node` says; the other nodes'
        pods run on."""
        kubelet = self.kubelets[name]
        with self._lock:
            self._lost.add(name)
        kubelet.lose_node()
        with self._lock:
            self._schedule()

    # -- the informer and the scheduling pass ------------------------------------------------

    def _seen(self, kind: str, obj: Json) -> None:
        with self._lock:
            if kind == "SYNC":
                self._pods = {p["metadata"]["uid"]: p for p in obj["items"]}
            elif kind == "DELETED":
                self._pods.pop(obj["metadata"]["uid"], None)
            else:
                self._pods[obj["metadata"]["uid"]] = obj
            for uid in list(self._assumed):
                pod = self._pods.get(uid)
                if pod is None or (pod.get("spec") or {}).get("nodeName"):
                    del self._assumed[uid]
            self._schedule()

    def _node_of(self, pod: Json) -> str | None:
        node = (pod.get("spec") or {}).get("nodeName")
        return node or self._assumed.get(pod["metadata"]["uid"])

    def _schedule(self) -> None:
        """One pass, as after every event: each unplaced pod, oldest first, on the first node
        that fits, else marked Unschedulable (caller holds ``_lock``)."""
        pending = sorted(
            (
                p
                for p in self._pods.values()
                if not self._node_of(p) and not p["metadata"].get("deletionTimestamp")
            ),
            key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]),
        )
        if not pending or self._stop.is_set():
            return
        used = {n.name: Resources() for n in self.nodes}
        for pod in self._pods.values():
            node = self._node_of(pod)
            if node in used and (pod.get("status") or {}).get("phase") not in _ENDED:
                used[node] += requests_of(pod)
        for pod in pending:
            asked = requests_of(pod)
            node, why = place(asked, self.nodes, used, self._lost)
            if node is None:
                self._mark_unschedulable(pod, why)
            elif self._bind(pod, node):
                self._assumed[pod["metadata"]["uid"]] = node
                used[node] += asked

    def _path(self, pod: Json) -> str:
        meta = pod["metadata"]
        return f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"

    def _bind(self, pod: Json, node: str) -> bool:
        """Bind through ``pods/NAME/binding``; a 409 (being deleted, or already bound) means
        a newer event is on its way."""
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod["metadata"]["name"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        code, _ = self._client.request("POST", self._path(pod) + "/binding", binding)
        return code == 201

    def _mark_unschedulable(self, pod: Json, why: str) -> None:
        """``PodScheduled`` False, ``Unschedulable``, ``why``: written when it changes only
        (the pass runs on every event, and this write is one)."""
        current: Json = next(
            (
                c
                for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled"
            ),
            {},
        )
        if current.get("status") == "False" and current.get("message") == why:
            return
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "lastProbeTime": None,
            "lastTransitionTime": (
                current["lastTransitionTime"]
                if current.get("status") == "False" and current.get("lastTransitionTime")
                else rfc3339()
            ),
            "reason": "Unschedulable",
            "message": why,
        }
        code, updated = self._client.request(
            "PATCH",
            self._path(pod) + "/status",
            {"status": {"conditions": [condition]}},
            content_type="application/strategic-merge-patch+json",
        )
        if code == 200:  # seen at once, so that the next pass does not write it again
            self._pods[pod["metadata"]["uid"]] = updated


__all__ = ["UNREACHABLE", "FakeScheduler", "Node", "Resources", "place"]
