"""The ports are importable on their own: naming a port does not load an adapter.

The job master's logic and its tests name :class:`~dlrover_kfp.ports.ClusterBackend` and its
values; they must not pay for (or depend on) psutil and the cgroup probes of the local backend,
nor the Kubernetes client. ``dlrover_kfp.backends`` re-exports the port and loads
``LocalBackend`` on first use only.

Each case runs in a fresh interpreter and reads ``sys.modules`` (what was imported), as
tests/unit/test_cli_imports.py does: deterministic, whatever the machine's load.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Modules that only a backend implementation needs.
ADAPTERS = (
    "psutil",
    "sqlalchemy",
    "kubernetes",
    "dlrover_kfp.backends.local",
    "dlrover_kfp.backends.cgroups",
    "dlrover_kfp.backends.kubernetes",
)


def _loaded(code: str) -> list[str]:
    """Which of :data:`ADAPTERS` a fresh interpreter holds after running ``code``."""
    report = f"print(json.dumps(sorted(set({ADAPTERS!r}) & set(sys.modules))))"
    probe = f"import json, sys\n{code}\n{report}"
    out = subprocess.check_output([sys.executable, "-c", probe], text=True, timeout=120)
    return list(json.loads(out.splitlines()[-1]))


@pytest.mark.parametrize(
    "code",
    [
        "from dlrover_kfp.ports import ClusterBackend, PodSpec, PodStatus, PodUsage, PodPhase",
        "from dlrover_kfp.backends import ClusterBackend, PodSpec, PodStatus, PodPhase",
        "import dlrover_kfp.backends.k8s_objects",
    ],
)
def test_the_cluster_port_loads_no_backend(code: str) -> None:
    assert _loaded(code) == []


def test_the_local_backend_is_loaded_when_used() -> None:
    """The lazy re-export still gives the class, and only then loads psutil and cgroups."""
    code = (
        "from dlrover_kfp.backends import LocalBackend\n"
        "from dlrover_kfp.backends.local import LocalBackend as direct\n"
        "assert LocalBackend is direct\n"
    )
    assert _loaded(code) == [
        "dlrover_kfp.backends.cgroups",
        "dlrover_kfp.backends.local",
        "psutil",
    ]


def test_the_backends_package_names_only_what_it_has() -> None:
    from dlrover_kfp import backends  # noqa: PLC0415

    with pytest.raises(AttributeError, match="KubernetesBackend"):
        _ = backends.KubernetesBackend  # type: ignore[attr-defined]
    assert set(backends.__all__) >= {"ClusterBackend", "LocalBackend", "PodSpec"}
