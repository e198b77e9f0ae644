"""The fake API server against the unmodified official client (and kubectl where installed)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes  # type: ignore[import-untyped]
import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client import (  # type: ignore[import-untyped]
    ApiException,
    CoreV1Api,
    CustomObjectsApi,
)

from tests.fakes.kube_apiserver import (
    KUBELET_HEADER,
    FakeApiServer,
    SelectorError,
    canonical_quantity,
    format_quantity,
    labels_match,
    parse_label_selector,
    parse_quantity,
)

Json = dict[str, Any]


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


def make_client(api: FakeApiServer, tmp_path: Path, token: str | None = None) -> client.ApiClient:
    path = api.write_kubeconfig(tmp_path / "kubeconfig", token=token)
    return kubernetes.config.new_client_from_config(config_file=str(path))


@pytest.fixture
def v1(api: FakeApiServer, tmp_path: Path) -> CoreV1Api:
    return CoreV1Api(make_client(api, tmp_path))


def pod_body(name: str, labels: dict[str, str] | None = None, **container: Any) -> Json:
    spec = {
        "name": "main",
        "image": "python:3.11",
        "command": ["python", "-c", "pass"],
        "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}},
    }
    spec.update(container)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"restartPolicy": "Never", "containers": [spec]},
    }


def status_of(e: ApiException) -> Json:
    body: Json = json.loads(e.body)
    return body


# -- pure parts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value", "canonical"),
    [
        ("500m", 0.5, "500m"),
        ("1", 1, "1"),
        ("0.25", 0.25, "250m"),
        ("1.5", 1.5, "1500m"),
        ("2Gi", 2 * 2**30, "2Gi"),
        ("512Mi", 512 * 2**20, "512Mi"),
        ("1024Mi", 2**30, "1Gi"),
        ("1G", 10**9, "1G"),
        ("100M", 10**8, "100M"),
        ("1k", 1000, "1k"),
        ("1e3", 1000, "1e3"),
        ("1000m", 1, "1"),
    ],
)
def test_quantities_parse_and_canonicalize_like_the_real_server(
    text: str, value: float, canonical: str
) -> None:
    assert parse_quantity(text) == pytest.approx(value)
    assert canonical_quantity(text) == canonical


def test_quantity_rendering_matches_metrics_server() -> None:
    assert format_quantity(0.25) == "250m"
    assert format_quantity(1234e-9) == "1234n"
    assert format_quantity(123456 * 1024, "BinarySI") == "123456Ki"
    assert format_quantity(1000, "BinarySI") == "1k"  # under 1Ki: decimal
    for bad in ("abc", "1K", "1.2.3", "", "Mi"):
        with pytest.raises(ValueError):
            parse_quantity(bad)


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("job=x", True),
        ("job==x", True),
        ("job!=x", False),
        ("job!=y", True),
        ("absent!=y", True),  # != matches objects without the label
        ("role in (worker,ps)", True),
        ("role in (ps)", False),
        ("role notin (ps)", True),
        ("absent notin (ps)", True),
        ("job", True),
        ("!job", False),
        ("!absent", True),
        ("job=x,role in (worker), !absent", True),
        ("job=x,role=ps", False),
        ("", True),
    ],
)
def test_label_selectors(selector: str, matches: bool) -> None:
    labels = {"job": "x", "role": "worker"}
    assert labels_match(parse_label_selector(selector), labels) is matches


@pytest.mark.parametrize("bad", ["job=x,", "a b", "role in worker", "=x", "job=bad value"])
def test_malformed_label_selectors_are_rejected(bad: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(bad)


# -- objects through the official client ------------------------------------------------------


def test_create_defaults_and_system_fields(v1: CoreV1Api, api: FakeApiServer) -> None:
    before = api.resource_version
    created = v1.create_namespaced_pod("default", pod_body("w-0", {"job": "j"}))
    meta = created.metadata
    assert len(meta.uid) == 36 and meta.generation == 1
    assert int(meta.resource_version) == before + 1 == api.resource_version
    assert meta.creation_timestamp is not None
    assert created.status.phase == "Pending"
    assert created.status.qos_class == "Guaranteed"  # requests defaulted from limits
    container = created.spec.containers[0]
    assert container.resources.requests == {"cpu": "500m", "memory": "256Mi"}
    assert created.spec.termination_grace_period_seconds == 30
    burstable = pod_body("w-1", resources={"limits": {"cpu": "1"}, "requests": {"cpu": "0.5"}})
    assert v1.create_namespaced_pod("default", burstable).status.qos_class == "Burstable"
    named = pod_body("")
    named["metadata"] = {"generateName": "ps-"}
    generated = v1.create_namespaced_pod("default", named).metadata.name
    assert generated.startswith("ps-") and len(generated) == 8
    listed = v1.list_namespaced_pod("default")
    assert [p.metadata.name for p in listed.items] == sorted(["w-0", "w-1", generated])
    assert int(listed.metadata.resource_version) == api.resource_version
    got = v1.read_namespaced_pod("w-0", "default")
    assert got.metadata.uid == meta.uid


def test_already_exists_not_found_and_invalid_are_real_statuses(v1: CoreV1Api) -> None:
    v1.create_namespaced_pod("default", pod_body("dup"))
    with pytest.raises(ApiException) as exists:
        v1.create_namespaced_pod("default", pod_body("dup"))
    status = status_of(exists.value)
    assert (exists.value.status, status["reason"], status["kind"]) == (
        409,
        "AlreadyExists",
        "Status",
    )
    assert status["details"] == {"name": "dup", "kind": "pods"}
    assert status["message"] == 'pods "dup" already exists'

    with pytest.raises(ApiException) as missing:
        v1.read_namespaced_pod("nope", "default")
    assert missing.value.status == 404
    assert status_of(missing.value)["reason"] == "NotFound"

    bad = pod_body("Bad_Name", {"ok": "bad value!"}, image="")
    with pytest.raises(ApiException) as invalid:
        v1.create_namespaced_pod("default", bad)
    status = status_of(invalid.value)
    assert (invalid.value.status, status["reason"]) == (422, "Invalid")
    assert status["details"]["kind"] == "Pod"
    causes = {c["field"]: c for c in status["details"]["causes"]}
    assert causes["spec.containers[0].image"]["reason"] == "FieldValueRequired"
    assert causes["metadata.name"]["reason"] == "FieldValueInvalid"
    assert causes["metadata.labels"]["message"].startswith('Invalid value: "bad value!"')
    assert status["message"].startswith('Pod "Bad_Name" is invalid: [')

    no_containers = pod_body("empty")
    no_containers["spec"]["containers"] = []
    with pytest.raises(ApiException) as empty:
        v1.create_namespaced_pod("default", no_containers)
    assert status_of(empty.value)["details"]["causes"][0]["field"] == "spec.containers"

    over = pod_body("over", resources={"limits": {"cpu": "1"}, "requests": {"cpu": "2"}})
    with pytest.raises(ApiException) as too_much:
        v1.create_namespaced_pod("default", over)
    assert too_much.value.status == 422

    # As on the real server, a quantity that does not parse fails decoding: 400, not 422.
    unparsable = pod_body("q", resources={"limits": {"cpu": "lots"}})
    with pytest.raises(ApiException) as decode:
        v1.create_namespaced_pod("default", unparsable)
    assert decode.value.status == 400
    assert "quantities must match the regular expression" in status_of(decode.value)["message"]

    with pytest.raises(ApiException) as no_ns:
        v1.create_namespaced_pod("elsewhere", pod_body("x"))
    assert status_of(no_ns.value)["message"] == 'namespaces "elsewhere" not found'


def test_stale_resource_version_conflicts(v1: CoreV1Api) -> None:
    v1.create_namespaced_pod("default", pod_body("c"))
    stale = v1.read_namespaced_pod("c", "default")
    v1.patch_namespaced_pod("c", "default", {"metadata": {"labels": {"a": "1"}}})
    stale.metadata.labels = {"b": "2"}
    with pytest.raises(ApiException) as conflict:
        v1.replace_namespaced_pod("c", "default", stale)
    status = status_of(conflict.value)
    assert (conflict.value.status, status["reason"]) == (409, "Conflict")
    assert "the object has been modified" in status["message"]
    fresh = v1.read_namespaced_pod("c", "default")
    fresh.metadata.labels = {"b": "2"}
    replaced = v1.replace_namespaced_pod("c", "default", fresh)
    assert replaced.metadata.labels == {"b": "2"}
    assert int(replaced.metadata.resource_version) > int(fresh.metadata.resource_version)


def test_pod_spec_is_immutable_except_image(v1: CoreV1Api) -> None:
    v1.create_namespaced_pod("default", pod_body("im"))
    for patch in (
        {"spec": {"restartPolicy": "Always"}},
        {"spec": {"containers": [{"name": "main", "resources": {"limits": {"cpu": "2"}}}]}},
    ):
        with pytest.raises(ApiException) as forbidden:
            v1.patch_namespaced_pod("im", "default", patch)
        status = status_of(forbidden.value)
        assert forbidden.value.status == 422
        cause = status["details"]["causes"][0]
        assert (cause["field"], cause["reason"]) == ("spec", "FieldValueForbidden")
        assert cause["message"].startswith(
            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`"
        )
    # Strategic merge by container name: only the image changes, which is allowed.
    patched = v1.patch_namespaced_pod(
        "im",
        "default",
        {
            "metadata": {"labels": {"x": "y"}, "annotations": {"note": "n"}},
            "spec": {"containers": [{"name": "main", "image": "python:3.12"}]},
        },
    )
    assert patched.spec.containers[0].image == "python:3.12"
    assert patched.spec.containers[0].command == ["python", "-c", "pass"]
    assert patched.metadata.labels == {"x": "y"}
    assert patched.metadata.generation == 2
    # A JSON patch works too.
    v1.patch_namespaced_pod(
        "im", "default", [{"op": "add", "path": "/metadata/labels/z", "value": "1"}]
    )
    assert v1.read_namespaced_pod("im", "default").metadata.labels == {"x": "y", "z": "1"}


def test_status_subresource_changes_only_status(v1: CoreV1Api) -> None:
    v1.create_namespaced_pod("default", pod_body("st"))
    pod = v1.read_namespaced_pod("st", "default")
    pod.status.phase = "Running"
    pod.metadata.labels = {"ignored": "yes"}
    v1.replace_namespaced_pod_status("st", "default", pod)
    cond = {"type": "Ready", "status": "True"}
    v1.patch_namespaced_pod_status("st", "default", {"status": {"conditions": [cond]}})
    two = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    v1.patch_namespaced_pod_status("st", "default", {"status": {"conditions": [two]}})
    got = v1.read_namespaced_pod("st", "default")
    assert got.status.phase == "Running"
    assert got.metadata.labels == {}  # only the status moved
    # Strategic merge: conditions merge by type.
    assert [c.type for c in got.status.conditions] == ["Ready", "DisruptionTarget"]
    # ...and the main resource ignores status.
    v1.patch_namespaced_pod("st", "default", {"status": {"phase": "Failed"}})
    assert v1.read_namespaced_pod("st", "default").status.phase == "Running"


def test_secrets_fold_string_data_and_field_selectors(v1: CoreV1Api) -> None:
    secret = v1.create_namespaced_secret(
        "default", {"metadata": {"name": "tok"}, "stringData": {"token": "hunter2"}}
    )
    assert secret.data == {"token": "aHVudGVyMg=="} and secret.string_data is None
    assert secret.type == "Opaque"
    for name in ("a", "b"):
        v1.create_namespaced_pod("default", pod_body(name))
    v1.patch_namespaced_pod_status("b", "default", {"status": {"phase": "Running"}})
    running = v1.list_namespaced_pod("default", field_selector="status.phase=Running")
    assert [p.metadata.name for p in running.items] == ["b"]
    named = v1.list_namespaced_pod("default", field_selector="metadata.name!=b")
    assert [p.metadata.name for p in named.items] == ["a"]
    for kwargs in ({}, {"watch": True}):
        with pytest.raises(ApiException) as unsupported:
            v1.list_namespaced_pod("default", field_selector="spec.bogus=1", **kwargs)
        assert unsupported.value.status == 400
        assert status_of(unsupported.value)["message"] == "field label not supported: spec.bogus"
    events = v1.list_namespaced_event("default", field_selector="involvedObject.name=a").items
    assert events == []
    with pytest.raises(ApiException) as bad_selector:
        v1.list_namespaced_pod("default", label_selector="a in b")
    assert bad_selector.value.status == 400


def test_label_selectors_through_the_client(v1: CoreV1Api) -> None:
    for name, labels in (
        ("w0", {"job": "j", "role": "worker"}),
        ("p0", {"job": "j", "role": "ps"}),
        ("o0", {"job": "other"}),
    ):
        v1.create_namespaced_pod("default", pod_body(name, labels))

    def names(selector: str) -> list[str]:
        items = v1.list_namespaced_pod("default", label_selector=selector).items
        return [p.metadata.name for p in items]

    assert names("job=j") == ["p0", "w0"]
    assert names("job=j,role notin (ps)") == ["w0"]
    assert names("role in (ps,worker)") == ["p0", "w0"]
    assert names("!role") == ["o0"]
    assert names("role!=ps") == ["o0", "w0"]


def test_chunked_list_with_continue(v1: CoreV1Api, api: FakeApiServer) -> None:
    for i in range(7):
        v1.create_namespaced_pod("default", pod_body(f"p{i}"))
    first = v1.list_namespaced_pod("default", limit=3)
    assert [p.metadata.name for p in first.items] == ["p0", "p1", "p2"]
    assert first.metadata.remaining_item_count == 4 and first.metadata._continue
    rv = first.metadata.resource_version
    second = v1.list_namespaced_pod("default", limit=3, _continue=first.metadata._continue)
    third = v1.list_namespaced_pod("default", limit=3, _continue=second.metadata._continue)
    assert [p.metadata.name for p in second.items + third.items] == [f"p{i}" for i in range(3, 7)]
    assert third.metadata._continue is None
    assert second.metadata.resource_version == rv  # pages report the first page's version
    v1.create_namespaced_pod("default", pod_body("p9"))
    api.compact()
    with pytest.raises(ApiException) as expired:
        v1.list_namespaced_pod("default", limit=3, _continue=first.metadata._continue)
    assert (expired.value.status, status_of(expired.value)["reason"]) == (410, "Expired")


# -- deletion ---------------------------------------------------------------------------------


def test_delete_returns_the_object_and_is_graceful_only_with_a_kubelet(
    v1: CoreV1Api, api: FakeApiServer
) -> None:
    v1.create_namespaced_pod("default", pod_body("gone"))
    deleted = v1.delete_namespaced_pod("gone", "default")
    assert deleted.kind == "Pod" and deleted.metadata.name == "gone"  # 200 with the object
    with pytest.raises(ApiException):
        v1.read_namespaced_pod("gone", "default")

    api.kubelet_attached = True
    v1.create_namespaced_pod("default", pod_body("bound"))
    binding = {"target": {"apiVersion": "v1", "kind": "Node", "name": "fake-node-0"},
               "metadata": {"name": "bound"}}  # fmt: skip
    # As a scheduler does; the server answers with a Status, hence no model to decode into.
    v1.create_namespaced_pod_binding("bound", "default", binding, _preload_content=False)
    assert v1.read_namespaced_pod("bound", "default").spec.node_name == "fake-node-0"
    marked = v1.delete_namespaced_pod("bound", "default", grace_period_seconds=7)
    assert marked.metadata.deletion_timestamp is not None
    assert marked.metadata.deletion_grace_period_seconds == 7
    assert v1.read_namespaced_pod("bound", "default").metadata.deletion_timestamp is not None
    v1.delete_namespaced_pod(
        "bound", "default", body=client.V1DeleteOptions(grace_period_seconds=0)
    )
    with pytest.raises(ApiException) as gone:
        v1.read_namespaced_pod("bound", "default")
    assert gone.value.status == 404

    for i in range(3):
        v1.create_namespaced_pod("default", pod_body(f"dc{i}", {"batch": "1"}))
    v1.create_namespaced_pod("default", pod_body("keep"))
    v1.delete_collection_namespaced_pod("default", label_selector="batch=1")
    assert [p.metadata.name for p in v1.list_namespaced_pod("default").items] == ["keep"]


def test_deleting_a_namespace_deletes_its_contents(v1: CoreV1Api) -> None:
    v1.create_namespace({"metadata": {"name": "job-1"}})
    v1.create_namespaced_pod("job-1", pod_body("p"))
    v1.create_namespaced_secret("job-1", {"metadata": {"name": "s"}})
    # The server answers with the Namespace; the client's model for it is V1Status, so read it raw.
    marked = json.loads(v1.delete_namespace("job-1", _preload_content=False).data)
    assert (marked["kind"], marked["status"]["phase"]) == ("Namespace", "Terminating")
    wait_until(lambda: [n.metadata.name for n in v1.list_namespace().items] == [
        "default", "kube-public", "kube-system"
    ])  # fmt: skip
    assert v1.list_pod_for_all_namespaces().items == []
    with pytest.raises(ApiException) as protected:
        v1.delete_namespace("default")
    assert protected.value.status == 403


def wait_until(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def test_owner_reference_garbage_collection(v1: CoreV1Api) -> None:
    def owned_by(owner: Any, name: str) -> Json:
        body = pod_body(name)
        body["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner.metadata.name,
             "uid": owner.metadata.uid, "controller": True}
        ]  # fmt: skip
        return body

    def exists(name: str) -> bool:
        try:
            v1.read_namespaced_pod(name, "default")
        except ApiException:
            return False
        return True

    master = v1.create_namespaced_pod("default", pod_body("master"))
    for name in ("w0", "w1"):
        v1.create_namespaced_pod("default", owned_by(master, name))
    secret = v1.create_namespaced_secret(
        "default",
        {"metadata": {"name": "s", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "master", "uid": master.metadata.uid}
        ]}},
    )  # fmt: skip
    assert secret.metadata.owner_references[0].uid == master.metadata.uid
    v1.delete_namespaced_pod("master", "default")  # Background: dependents go after it
    wait_until(lambda: not exists("w0") and not exists("w1"))
    with pytest.raises(ApiException):
        v1.read_namespaced_secret("s", "default")

    master = v1.create_namespaced_pod("default", pod_body("master"))
    v1.create_namespaced_pod("default", owned_by(master, "orphan"))
    v1.delete_namespaced_pod("master", "default", propagation_policy="Orphan")
    wait_until(lambda: not exists("master"))
    assert v1.read_namespaced_pod("orphan", "default").metadata.owner_references is None

    master = v1.create_namespaced_pod("default", pod_body("master"))
    v1.create_namespaced_pod("default", owned_by(master, "fg"))
    marked = v1.delete_namespaced_pod("master", "default", propagation_policy="Foreground")
    assert "foregroundDeletion" in marked.metadata.finalizers
    wait_until(lambda: not exists("master") and not exists("fg"))


# -- watches ----------------------------------------------------------------------------------


def collect(
    v1: CoreV1Api, out: list[tuple[str, str, str]], stop_after: int, **kwargs: Any
) -> threading.Thread:
    """Watch pods in a thread until ``stop_after`` events, recording (type, name, rv)."""

    def run() -> None:
        w = watch.Watch()
        for event in w.stream(v1.list_namespaced_pod, "default", **kwargs):
            obj = event["object"]
            out.append((event["type"], obj.metadata.name, obj.metadata.resource_version))
            if len(out) >= stop_after:
                w.stop()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_watch_resumes_from_a_resource_version(v1: CoreV1Api) -> None:
    v1.create_namespaced_pod("default", pod_body("a", {"job": "j"}))
    since = v1.list_namespaced_pod("default").metadata.resource_version
    v1.create_namespaced_pod("default", pod_body("b", {"job": "j"}))
    v1.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"job": "k"}}})
    v1.delete_namespaced_pod("b", "default")
    events: list[tuple[str, str, str]] = []
    collect(v1, events, 3, resource_version=since, timeout_seconds=5).join(10)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    # With a selector, an object leaving it reads DELETED (as from the real watch cache).
    selected: list[tuple[str, str, str]] = []
    collect(v1, selected, 3, resource_version=since, label_selector="job=j", timeout_seconds=5
            ).join(10)  # fmt: skip
    assert [(t, n) for t, n, _ in selected] == [
        ("ADDED", "b"), ("DELETED", "a"), ("DELETED", "b")
    ]  # fmt: skip
    # Without a resourceVersion: the current objects as ADDED first.
    initial: list[tuple[str, str, str]] = []
    collect(v1, initial, 1, timeout_seconds=5).join(10)
    assert [(t, n) for t, n, _ in initial] == [("ADDED", "a")]


def test_watch_after_compaction_raises_410_through_the_official_client(
    v1: CoreV1Api, api: FakeApiServer
) -> None:
    v1.create_namespaced_pod("default", pod_body("a"))
    old = v1.list_namespaced_pod("default").metadata.resource_version
    v1.create_namespaced_pod("default", pod_body("b"))
    api.compact()
    # With timeout_seconds the client does not retry: the first ERROR event raises.
    with pytest.raises(ApiException) as expired:
        for _ in watch.Watch().stream(
            v1.list_namespaced_pod, "default", resource_version=old, timeout_seconds=5
        ):
            pass
    assert expired.value.status == 410
    assert expired.value.reason.startswith("Expired: too old resource version")
    # Without it, the client retries once from the same version, then raises the same.
    started = time.monotonic()
    with pytest.raises(ApiException) as again:
        for _ in watch.Watch().stream(v1.list_namespaced_pod, "default", resource_version=old):
            pass
    assert again.value.status == 410 and time.monotonic() - started < 3
    # The raw stream: HTTP 200, one ERROR event with a Status, then the stream ends.
    raw = v1.list_namespaced_pod(
        "default", watch=True, resource_version=old, _preload_content=False
    )
    lines = [json.loads(line) for line in raw.read().splitlines() if line.strip()]
    assert raw.status == 200 and len(lines) == 1
    assert lines[0]["type"] == "ERROR"
    assert {k: lines[0]["object"][k] for k in ("kind", "code", "reason")} == {
        "kind": "Status", "code": 410, "reason": "Expired"
    }  # fmt: skip


def test_expire_watches_mid_stream(v1: CoreV1Api, api: FakeApiServer) -> None:
    v1.create_namespaced_pod("default", pod_body("a"))
    rv = v1.list_namespaced_pod("default").metadata.resource_version
    errors: list[ApiException] = []
    seen: list[str] = []

    def run(**kwargs: Any) -> None:
        try:
            for event in watch.Watch().stream(
                v1.list_namespaced_pod, "default", resource_version=rv, **kwargs
            ):
                seen.append(event["object"].metadata.name)
        except ApiException as e:
            errors.append(e)

    with_timeout = threading.Thread(target=run, kwargs={"timeout_seconds": 30}, daemon=True)
    with_timeout.start()
    wait_until(lambda: api.open_watches == 1)
    v1.create_namespaced_pod("default", pod_body("b"))
    wait_until(lambda: seen == ["b"])
    assert api.expire_watches() == 1
    with_timeout.join(5)
    assert [e.status for e in errors] == [410]
    # Without timeout_seconds the client silently resumes from the last version it saw; once
    # that version is compacted away as well, it raises.
    errors.clear()
    resuming = threading.Thread(target=run, daemon=True)
    resuming.start()
    wait_until(lambda: api.open_watches == 1)
    api.expire_watches()
    wait_until(lambda: api.open_watches == 1)  # it came back
    assert not errors
    api.compact()
    api.expire_watches()
    resuming.join(5)
    assert [e.status for e in errors] == [410]


def test_two_hundred_pods_churned_without_a_missed_event(v1: CoreV1Api) -> None:
    n = 200
    events: list[tuple[str, str, str]] = []
    since = v1.list_namespaced_pod("default").metadata.resource_version
    watcher = collect(v1, events, 3 * n, resource_version=since, timeout_seconds=60)
    written: list[int] = []
    lock = threading.Lock()

    def churn(names: list[str]) -> None:
        for name in names:
            rvs = [
                v1.create_namespaced_pod("default", pod_body(name)).metadata.resource_version,
                v1.patch_namespaced_pod(
                    name, "default", {"metadata": {"labels": {"step": "2"}}}
                ).metadata.resource_version,
                v1.delete_namespaced_pod(name, "default").metadata.resource_version,
            ]
            with lock:
                written.extend(int(rv) for rv in rvs)

    names = [f"pod-{i}" for i in range(n)]
    workers = [threading.Thread(target=churn, args=(names[i::4],)) for i in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    watcher.join(30)
    rvs = [int(rv) for _, _, rv in events]
    assert len(events) == 3 * n
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)  # in order, none twice
    assert set(rvs) == set(written)  # every write seen
    per_pod: dict[str, list[str]] = {}
    for kind, name, _ in events:
        per_pod.setdefault(name, []).append(kind)
    assert all(kinds == ["ADDED", "MODIFIED", "DELETED"] for kinds in per_pod.values())


def test_bookmarks_as_the_official_client_yields_them(v1: CoreV1Api, api: FakeApiServer) -> None:
    rv = v1.list_namespaced_pod("default").metadata.resource_version
    seen: list[tuple[str, Any]] = []
    w = watch.Watch()

    def run() -> None:
        for event in w.stream(
            v1.list_namespaced_pod,
            "default",
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=10,
        ):
            seen.append((event["type"], event["object"]))
            w.stop()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_until(lambda: api.open_watches == 1)
    v1.create_namespaced_secret("default", {"metadata": {"name": "bump"}})  # not a pod event
    api.send_bookmarks()
    thread.join(5)
    # The client passes a BOOKMARK through undecoded (a dict, not a V1Pod), and does not
    # resume from its resourceVersion: a consumer must handle the type itself.
    [(kind, obj)] = seen
    assert kind == "BOOKMARK"
    assert obj == {"kind": "Pod", "apiVersion": "v1",
                   "metadata": {"resourceVersion": str(api.resource_version)}}  # fmt: skip


def test_close_ends_open_watches(tmp_path: Path) -> None:
    api = FakeApiServer()
    v1 = CoreV1Api(make_client(api, tmp_path))
    done = threading.Event()

    def run() -> None:
        for _ in watch.Watch().stream(v1.list_namespaced_pod, "default", timeout_seconds=60):
            pass
        done.set()

    threading.Thread(target=run, daemon=True).start()
    wait_until(lambda: api.open_watches == 1)
    api.close()
    assert done.wait(5)


# -- faults, audit, authorization -------------------------------------------------------------


def raw_get(api: FakeApiServer, path: str, kubelet: bool) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    headers = {KUBELET_HEADER: "fake-node-0"} if kubelet else {}
    conn.request("GET", path, headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def test_storm_fails_clients_but_not_the_kubelet(v1: CoreV1Api, api: FakeApiServer) -> None:
    api.storm(0.6, code=500)
    with pytest.raises(ApiException) as storm:
        v1.list_namespaced_pod("default")
    status = status_of(storm.value)
    assert (storm.value.status, status["reason"], status["code"]) == (500, "InternalError", 500)
    assert raw_get(api, "/api/v1/namespaces/default/pods", kubelet=True) == 200
    time.sleep(0.65)
    assert v1.list_namespaced_pod("default").items == []

    api.fail(2, code=503, verb="create", resource="pods")
    v1.list_namespaced_pod("default")  # not a create: unaffected
    for _ in range(2):
        with pytest.raises(ApiException) as unavailable:
            v1.create_namespaced_pod("default", pod_body("x"))
        assert unavailable.value.status == 503
    v1.create_namespaced_pod("default", pod_body("x"))


def test_throttle_sends_429_with_retry_after(v1: CoreV1Api, api: FakeApiServer) -> None:
    api.throttle(5.0, retry_after=3)
    with pytest.raises(ApiException) as throttled:  # a POST: urllib3 does not retry it
        v1.create_namespaced_pod("default", pod_body("x"))
    assert throttled.value.status == 429
    assert throttled.value.headers["Retry-After"] == "3"
    status = status_of(throttled.value)
    assert status["reason"] == "TooManyRequests"
    assert status["details"]["retryAfterSeconds"] == 3
    api.clear_faults()
    # A GET is retried by urllib3 itself after sleeping Retry-After (up to 3 times).
    api.throttle(0.5, retry_after=1)
    started = time.monotonic()
    assert v1.list_namespaced_pod("default").items == []
    assert time.monotonic() - started >= 1.0
    assert [c.code for c in api.calls[-2:]] == [429, 200]
    api.slow(0.3, duration_s=5.0)
    started = time.monotonic()
    v1.list_namespaced_pod("default")
    assert time.monotonic() - started >= 0.3


def test_connection_reset(v1: CoreV1Api, api: FakeApiServer) -> None:
    api.reset_connections(1, verb="create")
    with pytest.raises(urllib3.exceptions.ProtocolError):  # POST is not retried by urllib3
        v1.create_namespaced_pod("default", pod_body("r"))
    assert api.calls[-1].code == 0 and api.calls[-1].verb == "create"
    # urllib3 retries a GET on its own (3 times): one reset goes unnoticed, four do not.
    api.reset_connections(1)
    assert v1.list_namespaced_pod("default").items == []
    api.reset_connections(4)
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        v1.list_namespaced_pod("default")


def test_audit_records_rbac_verbs(v1: CoreV1Api, api: FakeApiServer) -> None:
    v1.create_namespaced_pod("default", pod_body("a", {"job": "j"}))
    v1.read_namespaced_pod("a", "default")
    v1.list_namespaced_pod("default", label_selector="job=j")
    for _ in watch.Watch().stream(v1.list_namespaced_pod, "default", timeout_seconds=1):
        pass
    v1.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"x": "1"}}})
    v1.replace_namespaced_pod("a", "default", v1.read_namespaced_pod("a", "default"))
    v1.patch_namespaced_pod_status("a", "default", {"status": {"phase": "Running"}})
    v1.delete_namespaced_pod("a", "default")
    v1.delete_collection_namespaced_pod("default")
    v1.create_namespaced_secret("default", {"metadata": {"name": "s"}})
    raw_get(api, "/api/v1/namespaces/default/secrets/s", kubelet=True)
    assert api.rbac_verbs() == {
        ("", "pods", verb)
        for verb in ("create", "get", "list", "watch", "patch", "update", "delete",
                     "deletecollection")
    } | {("", "pods/status", "patch"), ("", "secrets", "create")}  # fmt: skip
    kubelet_calls = [c for c in api.calls if c.from_kubelet]
    assert [(c.verb, c.resource, c.name) for c in kubelet_calls] == [("get", "secrets", "s")]
    first = api.calls[0]
    assert (first.verb, first.namespace, first.code) == ("create", "default", 201)
    assert first.user_agent.startswith("OpenAPI-Generator/")


def test_forbid_restrict_and_tokens(v1: CoreV1Api, api: FakeApiServer, tmp_path: Path) -> None:
    api.forbid("delete", "pods")
    v1.create_namespaced_pod("default", pod_body("a"))
    with pytest.raises(ApiException) as forbidden:
        v1.delete_namespaced_pod("a", "default")
    status = status_of(forbidden.value)
    assert (forbidden.value.status, status["reason"]) == (403, "Forbidden")
    assert status["message"] == (
        'pods "a" is forbidden: User "system:serviceaccount:default:default" cannot delete'
        ' resource "pods" in API group "" in the namespace "default"'
    )
    api.allow("delete", "pods")
    api.restrict([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}])
    v1.list_namespaced_pod("default")
    with pytest.raises(ApiException) as denied:
        v1.patch_namespaced_pod_status("a", "default", {"status": {"phase": "Running"}})
    assert 'cannot patch resource "pods/status"' in status_of(denied.value)["message"]
    api.restrict(None)

    with FakeApiServer(require_token=True) as secured:
        assert secured.token
        wrong = CoreV1Api(make_client(secured, tmp_path / "wrong", token="nope"))
        with pytest.raises(ApiException) as unauthorized:
            wrong.list_namespaced_pod("default")
        assert unauthorized.value.status == 401
        right = CoreV1Api(make_client(secured, tmp_path / "right"))
        assert right.list_namespaced_pod("default").items == []


# -- metrics and discovery --------------------------------------------------------------------


def test_pod_metrics_api(api: FakeApiServer, tmp_path: Path) -> None:
    api_client = make_client(api, tmp_path)
    v1, custom = CoreV1Api(api_client), CustomObjectsApi(api_client)
    v1.create_namespaced_pod("default", pod_body("w0", {"role": "worker"}))
    v1.create_namespaced_pod("default", pod_body("p0", {"role": "ps"}))
    api.set_pod_metrics("default", "w0", 0.25, 123456 * 1024)
    api.set_pod_metrics("default", "p0", 1.5, 1000)
    listed = custom.list_namespaced_custom_object(
        "metrics.k8s.io", "v1beta1", "default", "pods", label_selector="role=worker"
    )
    assert listed["kind"] == "PodMetricsList"
    [item] = listed["items"]
    assert item["metadata"]["name"] == "w0" and item["metadata"]["labels"] == {"role": "worker"}
    assert item["containers"] == [{"name": "main", "usage": {"cpu": "250m", "memory": "123456Ki"}}]
    one = custom.get_namespaced_custom_object("metrics.k8s.io", "v1beta1", "default", "pods", "p0")
    assert one["containers"][0]["usage"] == {"cpu": "1500m", "memory": "1k"}
    v1.delete_namespaced_pod("p0", "default")
    with pytest.raises(ApiException) as gone:
        custom.get_namespaced_custom_object("metrics.k8s.io", "v1beta1", "default", "pods", "p0")
    assert gone.value.status == 404

    groups = client.ApisApi(api_client).get_api_versions()
    assert [g.name for g in groups.groups] == ["coordination.k8s.io", "metrics.k8s.io"]
    api.serve_metrics = False
    groups = client.ApisApi(api_client).get_api_versions()
    assert [g.name for g in groups.groups] == ["coordination.k8s.io"]
    with pytest.raises(ApiException) as absent:
        custom.list_namespaced_custom_object("metrics.k8s.io", "v1beta1", "default", "pods")
    assert absent.value.status == 404


def test_discovery(api: FakeApiServer, tmp_path: Path) -> None:
    api_client = make_client(api, tmp_path)
    assert client.VersionApi(api_client).get_code().git_version.startswith("v1.32")
    resources = {r.name: r for r in CoreV1Api(api_client).get_api_resources().resources}
    assert resources["pods"].short_names == ["po"] and resources["pods"].namespaced
    assert resources["services"].short_names == ["svc"]
    assert "watch" in resources["pods"].verbs and resources["pods/status"].verbs
    assert not resources["nodes"].namespaced
    nodes = CoreV1Api(api_client).list_node().items
    assert [n.metadata.name for n in nodes] == ["fake-node-0"]
    ready = [c for c in nodes[0].status.conditions if c.type == "Ready"]
    assert ready[0].status == "True"


# -- coordination.k8s.io/v1 leases -----------------------------------------------------------


def lease_body(name: str, **spec: Any) -> Json:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {
            "holderIdentity": "master-a",
            "leaseDurationSeconds": 30,
            "acquireTime": "2026-11-24T05:12:18.000000Z",
            "renewTime": "2026-11-24T05:12:18.250000+01:00",
            **spec,
        },
    }


@pytest.fixture
def leases(api: FakeApiServer, tmp_path: Path) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(make_client(api, tmp_path))


def test_leases_are_served_discovered_and_audited(
    leases: client.CoordinationV1Api, api: FakeApiServer, tmp_path: Path
) -> None:
    created = leases.create_namespaced_lease("default", lease_body("job-master"))
    assert created.api_version == "coordination.k8s.io/v1" and created.kind == "Lease"
    raw = json.loads(
        leases.read_namespaced_lease("job-master", "default", _preload_content=False).data
    )
    # MicroTimes come back in UTC, six fraction digits, as the real server re-encodes them
    assert raw["spec"]["renewTime"] == "2026-11-24T04:12:18.250000Z"
    assert raw["spec"]["acquireTime"] == "2026-11-24T05:12:18.000000Z"
    assert [x.metadata.name for x in leases.list_namespaced_lease("default").items] == [
        "job-master"
    ]
    leases.delete_namespaced_lease("job-master", "default")
    with pytest.raises(ApiException) as gone:
        leases.read_namespaced_lease("job-master", "default")
    status = status_of(gone.value)
    assert gone.value.status == 404
    assert status["message"] == 'leases.coordination.k8s.io "job-master" not found'
    assert status["details"] == {
        "name": "job-master",
        "group": "coordination.k8s.io",
        "kind": "leases",
    }
    assert ("coordination.k8s.io", "leases", "create") in api.rbac_verbs()
    resources = client.CoordinationV1Api(make_client(api, tmp_path)).get_api_resources()
    assert resources.group_version == "coordination.k8s.io/v1"
    assert [(r.name, r.namespaced, r.kind) for r in resources.resources] == [
        ("leases", True, "Lease")
    ]
    with pytest.raises(ApiException) as core:  # not a core/v1 resource
        raw_get_json(api, "/api/v1/namespaces/default/leases")
    assert core.value.status == 404


def raw_get_json(api: FakeApiServer, path: str) -> Json:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    conn.request("GET", path)
    response = conn.getresponse()
    body: Json = json.loads(response.read())
    conn.close()
    if response.status >= 400:
        raise ApiException(status=response.status, reason=body.get("reason"))
    return body


def test_a_stale_lease_update_conflicts(leases: client.CoordinationV1Api) -> None:
    """Optimistic concurrency, as leader election relies on: of two candidates that read the
    same version, the second writer gets 409; an update must carry a resourceVersion."""
    leases.create_namespaced_lease("default", lease_body("job-master"))
    read = leases.read_namespaced_lease("job-master", "default")
    first = lease_body("job-master", holderIdentity="master-b")
    first["metadata"]["resourceVersion"] = read.metadata.resource_version
    taken = leases.replace_namespaced_lease("job-master", "default", first)
    assert taken.spec.holder_identity == "master-b"
    assert int(taken.metadata.resource_version) > int(read.metadata.resource_version)
    second = lease_body("job-master", holderIdentity="master-c")
    second["metadata"]["resourceVersion"] = read.metadata.resource_version  # stale now
    with pytest.raises(ApiException) as conflict:
        leases.replace_namespaced_lease("job-master", "default", second)
    status = status_of(conflict.value)
    assert (conflict.value.status, status["reason"]) == (409, "Conflict")
    assert status["message"].startswith(
        'Operation cannot be fulfilled on leases.coordination.k8s.io "job-master": the object'
        " has been modified"
    )
    unconditional = lease_body("job-master", holderIdentity="master-c")
    with pytest.raises(ApiException) as no_version:
        leases.replace_namespaced_lease("job-master", "default", unconditional)
    assert no_version.value.status == 422
    assert "metadata.resourceVersion" in status_of(no_version.value)["message"]
    assert leases.read_namespaced_lease("job-master", "default").spec.holder_identity == (
        "master-b"
    )
    # a delete on a stale version's precondition is refused too
    with pytest.raises(ApiException) as stale_delete:
        leases.delete_namespaced_lease(
            "job-master",
            "default",
            body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(
                    resource_version=read.metadata.resource_version
                )
            ),
        )
    assert stale_delete.value.status == 409


@pytest.mark.parametrize(
    ("spec", "code", "message"),
    [
        (
            {"holderIdentity": 7},
            400,
            "json: cannot unmarshal number into Go struct field LeaseSpec.spec.holderIdentity"
            " of type string",
        ),
        (
            {"leaseDurationSeconds": "30"},
            400,
            "cannot unmarshal string into Go struct field LeaseSpec.spec.leaseDurationSeconds"
            " of type int32",
        ),
        # what the official client sends for a datetime without microseconds: refused
        (
            {"renewTime": "2026-11-24T05:12:18+00:00"},
            400,
            'parsing time "2026-11-24T05:12:18+00:00" as "2006-01-02T15:04:05.000000Z07:00"',
        ),
        ({"acquireTime": "2026-11-24T05:12:18.123Z"}, 400, "cannot parse"),
        (
            {"leaseDurationSeconds": 0},
            422,
            "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0",
        ),
        (
            {"leaseTransitions": -1},
            422,
            "spec.leaseTransitions: Invalid value: -1: must be greater than or equal to 0",
        ),
    ],
)
def test_lease_fields_are_decoded_and_validated_like_the_real_server(
    leases: client.CoordinationV1Api, spec: Json, code: int, message: str
) -> None:
    with pytest.raises(ApiException) as refused:
        leases.create_namespaced_lease("default", lease_body("job-master", **spec))
    assert refused.value.status == code
    assert message in status_of(refused.value)["message"]
    assert leases.list_namespaced_lease("default").items == []


# -- kubectl ----------------------------------------------------------------------------------

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


@pytest.mark.skipif(not os.path.exists(KUBECTL), reason="kubectl is not installed")
def test_kubectl_get_describe_yaml_delete(api: FakeApiServer, tmp_path: Path) -> None:
    config = api.write_kubeconfig(tmp_path / "kubeconfig")
    v1 = CoreV1Api(make_client(api, tmp_path))
    v1.create_namespaced_pod("default", pod_body("w-0", {"job": "x"}))
    v1.create_namespaced_pod("default", pod_body("other", {"job": "y"}))
    uid = v1.read_namespaced_pod("w-0", "default").metadata.uid
    v1.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "w-0.1"},
            "involvedObject": {"kind": "Pod", "name": "w-0", "namespace": "default", "uid": uid},
            "reason": "Scheduled",
            "message": "Successfully assigned default/w-0 to fake-node-0",
            "type": "Normal",
            "source": {"component": "default-scheduler"},
            "count": 1,
        },
    )
    env = dict(os.environ, HOME=str(tmp_path), KUBECONFIG=str(config))

    def kubectl(*args: str) -> str:
        done = subprocess.run(
            [KUBECTL, "--cache-dir", str(tmp_path / "cache"), *args],
            capture_output=True, text=True, env=env, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    table = kubectl("get", "pods").splitlines()
    assert table[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert [line.split()[:4] for line in table[1:]] == [
        ["other", "0/1", "Pending", "0"], ["w-0", "0/1", "Pending", "0"]
    ]  # fmt: skip
    selected = kubectl("get", "pods", "-l", "job=x").splitlines()
    assert [line.split()[0] for line in selected[1:]] == ["w-0"]
    described = kubectl("describe", "pod", "w-0")
    assert "Name:         w-0" in described and "QoS Class:        Guaranteed" in described
    assert "Successfully assigned default/w-0 to fake-node-0" in described  # events read
    as_yaml = kubectl("get", "pod", "w-0", "-o", "yaml")
    assert f"uid: {uid}" in as_yaml and "cpu: 500m" in as_yaml
    assert 'pod "w-0" deleted' in kubectl("delete", "pod", "w-0")
    assert [p.metadata.name for p in v1.list_namespaced_pod("default").items] == ["other"]
    assert any(c.verb == "delete" and c.user_agent.startswith("kubectl") for c in api.calls)
