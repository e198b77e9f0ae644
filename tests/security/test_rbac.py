"""The job master's Kubernetes rights (deploy/rbac.yaml) are namespaced and narrow.

tests/backends/test_kubernetes_backend.py::test_the_role_grants_exactly_the_calls_the_backend_makes
checks that the Role grants exactly the calls the backend makes against the fake API server;
this adds the rules no future need may break: no wildcard, no cluster-wide object, no way into
a running pod, no reading of Secrets (the master writes the job's Secret and never reads one
back: reading would expose every other Secret of the namespace, the history password among
them), and no right to grant rights.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RBAC = ROOT / "deploy" / "rbac.yaml"

CLUSTER_KINDS = {"ClusterRole", "ClusterRoleBinding"}
#: Cluster-scoped resources (kubectl api-resources --namespaced=false, the ones a Role could
#: name by mistake: in a Role they grant nothing, and their presence says someone wanted them).
CLUSTER_SCOPED = {
    "nodes",
    "namespaces",
    "persistentvolumes",
    "clusterroles",
    "clusterrolebindings",
    "customresourcedefinitions",
    "storageclasses",
    "priorityclasses",
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "certificatesigningrequests",
    "apiservices",
}
#: Subresources that run code in, or open a channel to, a pod.
INTO_PODS = {
    "pods/exec",
    "pods/attach",
    "pods/portforward",
    "pods/proxy",
    "pods/ephemeralcontainers",
}
READ_VERBS = {"get", "list", "watch"}
#: Verbs that hand out rights the holder does not have.
ESCALATING = {"escalate", "bind", "impersonate"}


def violations(docs: list[dict[str, Any]]) -> list[str]:
    """What breaks the rules of the module docstring, one line each."""
    found = []
    for doc in docs:
        kind = doc.get("kind")
        name = doc.get("metadata", {}).get("name")
        if kind in CLUSTER_KINDS:
            found.append(f"{kind} {name}: cluster-wide")
        if "namespace" in doc.get("metadata", {}):
            found.append(f"{kind} {name}: names a namespace (kubectl -n should choose)")
        if kind == "RoleBinding" and doc.get("roleRef", {}).get("kind") != "Role":
            found.append(f"RoleBinding {name}: binds a {doc.get('roleRef', {}).get('kind')}")
        if kind != "Role":
            continue
        for rule in doc.get("rules", []):
            groups = set(rule.get("apiGroups", []))
            resources = set(rule.get("resources", []))
            verbs = set(rule.get("verbs", []))
            for field, values in (
                ("apiGroups", groups),
                ("resources", resources),
                ("verbs", verbs),
            ):
                if any("*" in v for v in values):
                    found.append(f"Role {name}: wildcard in {field} {sorted(values)}")
            if rule.get("nonResourceURLs"):
                found.append(f"Role {name}: nonResourceURLs")
            if resources & CLUSTER_SCOPED:
                found.append(f"Role {name}: cluster-scoped {sorted(resources & CLUSTER_SCOPED)}")
            if resources & INTO_PODS:
                found.append(f"Role {name}: into pods {sorted(resources & INTO_PODS)}")
            if "secrets" in resources and verbs & READ_VERBS:
                found.append(f"Role {name}: reads secrets ({sorted(verbs & READ_VERBS)})")
            if verbs & ESCALATING:
                found.append(f"Role {name}: escalating verbs {sorted(verbs & ESCALATING)}")
    return found


def load() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(RBAC.read_text()) if d]


def test_the_masters_role_is_namespaced_and_narrow() -> None:
    docs = load()
    assert {d["kind"] for d in docs} == {"ServiceAccount", "Role", "RoleBinding"}
    assert violations(docs) == []


def _role(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Role")


def _widen_secrets(docs: list[dict[str, Any]]) -> None:
    for rule in _role(docs)["rules"]:
        if "secrets" in rule["resources"]:
            rule["verbs"].append("get")


BROKEN: dict[str, Callable[[list[dict[str, Any]]], object]] = {
    "wildcard verb": lambda d: _role(d)["rules"][0]["verbs"].append("*"),
    "wildcard resource": lambda d: _role(d)["rules"][0].__setitem__("resources", ["*"]),
    "pods/exec": lambda d: _role(d)["rules"][0]["resources"].append("pods/exec"),
    "nodes": lambda d: _role(d)["rules"][0]["resources"].append("nodes"),
    "reading secrets": _widen_secrets,
    "a ClusterRole": lambda d: _role(d).__setitem__("kind", "ClusterRole"),
    "bind": lambda d: _role(d)["rules"][0]["verbs"].append("bind"),
}


@pytest.mark.parametrize("change", list(BROKEN))
def test_each_rule_catches_its_breach(change: str) -> None:
    docs = copy.deepcopy(load())
    BROKEN[change](docs)
    assert violations(docs)
