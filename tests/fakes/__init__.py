"""Test fakes that speak real wire protocols, as small as what the product asks of them.

:mod:`.kube_apiserver` is a Kubernetes API server (pods and their logs, events, secrets,
leases and the ``metrics.k8s.io`` PodMetrics list: the calls of the Kubernetes backend and of
the Airflow trigger, and what ``kubectl get``, ``describe`` and ``logs`` read) on a local HTTP
port, that the unmodified official ``kubernetes`` client and ``kubectl`` talk to, with the faults
the tests inject; :mod:`.kubelet` is a kubelet that runs the pods of its node as local processes
through :class:`dlrover_kfp.backends.LocalBackend`, reports their status through the API (alone,
it binds every pod to its one node) and serves their logs (:mod:`.container_log`);
:mod:`.scheduler` places pods on several such nodes by their CPU and memory requests, leaving a
pod that fits none Pending and ``Unschedulable``.
"""

from tests.fakes.kube_apiserver import (
    ApiCall,
    ApiError,
    FakeApiServer,
    format_quantity,
    parse_quantity,
)
from tests.fakes.kubelet import FakeKubelet, StatusWrite
from tests.fakes.scheduler import FakeScheduler, Node

__all__ = [
    "ApiCall",
    "ApiError",
    "FakeApiServer",
    "FakeKubelet",
    "FakeScheduler",
    "Node",
    "StatusWrite",
    "format_quantity",
    "parse_quantity",
]
