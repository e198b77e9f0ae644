"""Test fakes that speak real wire protocols.

:mod:`.kube_apiserver` is a Kubernetes API server (core/v1 pods, secrets, services, events,
configmaps, nodes, namespaces, and the ``metrics.k8s.io`` PodMetrics API) on a local HTTP port,
that the unmodified official ``kubernetes`` client and ``kubectl`` talk to; :mod:`.kubelet` is a
kubelet (and scheduler) that runs the pods it is given as local processes through
:class:`dlrover_kfp.backends.LocalBackend` and reports their status through the API.
"""

from tests.fakes.kube_apiserver import (
    ApiCall,
    ApiError,
    FakeApiServer,
    format_quantity,
    parse_quantity,
)
from tests.fakes.kubelet import FakeKubelet, StatusWrite

__all__ = [
    "ApiCall",
    "ApiError",
    "FakeApiServer",
    "FakeKubelet",
    "StatusWrite",
    "format_quantity",
    "parse_quantity",
]
