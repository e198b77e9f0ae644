"""The fake API server against the unmodified official client: what it serves behaves as the
real server's does, and what it does not serve is refused loudly."""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes  # type: ignore[import-untyped]
import pytest
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


def make_client(api: FakeApiServer, tmp_path: Path) -> client.ApiClient:
    path = api.write_kubeconfig(tmp_path / "kubeconfig")
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


def wait_until(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


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
        ("job=x, role=worker", True),
        ("job=x,role=ps", False),
        ("", True),
    ],
)
def test_label_selectors(selector: str, matches: bool) -> None:
    labels = {"job": "x", "role": "worker"}
    assert labels_match(parse_label_selector(selector), labels) is matches


@pytest.mark.parametrize(
    "bad",
    # malformed, then set-based (a real server serves those; the fake refuses them)
    ["job=x,", "a b", "=x", "job=bad value", "role in (worker)", "job", "!job"],
)
def test_malformed_or_set_based_label_selectors_are_rejected(bad: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(bad)


# -- objects through the official client ------------------------------------------------------


def test_create_defaults_and_system_fields(v1: CoreV1Api) -> None:
    before = int(v1.list_namespaced_pod("default").metadata.resource_version)
    created = v1.create_namespaced_pod("default", pod_body("w-0", {"job": "j"}))
    meta = created.metadata
    assert len(meta.uid) == 36
    assert int(meta.resource_version) == before + 1
    assert meta.creation_timestamp is not None
    assert created.status.phase == "Pending"
    assert created.status.qos_class == "Guaranteed"  # requests defaulted from limits
    container = created.spec.containers[0]
    assert container.resources.requests == {"cpu": "500m", "memory": "256Mi"}
    assert created.spec.termination_grace_period_seconds == 30
    burstable = pod_body("w-1", resources={"limits": {"cpu": "1"}, "requests": {"cpu": "0.5"}})
    made = v1.create_namespaced_pod("default", burstable)
    assert made.status.qos_class == "Burstable"
    assert made.spec.containers[0].resources.requests == {"cpu": "500m"}  # canonical
    listed = v1.list_namespaced_pod("default")
    assert [p.metadata.name for p in listed.items] == ["w-0", "w-1"]
    assert int(listed.metadata.resource_version) == before + 2
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


def test_what_is_not_served_is_refused_loudly(v1: CoreV1Api) -> None:
    """A call the product starts making fails here rather than meeting a half-built fake."""
    v1.create_namespaced_pod("default", pod_body("p"))
    calls: list[Callable[[], object]] = [
        lambda: v1.patch_namespaced_secret("s", "default", {"metadata": {"labels": {"a": "1"}}}),
        lambda: v1.replace_namespaced_pod("p", "default", v1.read_namespaced_pod("p", "default")),
        lambda: v1.delete_collection_namespaced_pod("default"),
        lambda: v1.list_namespaced_secret("default"),
    ]
    for call in calls:
        with pytest.raises(ApiException) as refused:
            call()
        assert refused.value.status == 405
        assert "not served by the fake API server" in status_of(refused.value)["message"]
    unknown: list[Callable[[], object]] = [
        lambda: v1.list_namespaced_config_map("default"),
        lambda: v1.list_node(),  # noqa: PLW0108 (the client's methods are untyped)
        lambda: v1.read_namespaced_pod_ephemeralcontainers("p", "default"),
    ]
    for fetch in unknown:
        with pytest.raises(ApiException) as absent:
            fetch()
        assert absent.value.status == 404
    v1.create_namespaced_pod("default", pod_body("q"))
    for kwargs in ({"field_selector": "status.phase=Running"}, {"limit": 1}):
        with pytest.raises(ApiException) as bad:
            v1.list_namespaced_pod("default", **kwargs)
        assert bad.value.status == 400
    json_patch = [{"op": "add", "path": "/status/phase", "value": "Running"}]
    with pytest.raises(ApiException) as media:
        v1.patch_namespaced_pod_status("p", "default", json_patch)
    assert media.value.status == 415


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
    ready = {"type": "Ready", "status": "False"}
    v1.patch_namespaced_pod_status("st", "default", {"status": {"conditions": [ready]}})
    got = v1.read_namespaced_pod("st", "default")
    assert got.status.phase == "Running"
    assert got.metadata.labels == {}  # only the status moved
    # Strategic merge: conditions merge by type.
    assert [(c.type, c.status) for c in got.status.conditions] == [
        ("Ready", "False"),
        ("DisruptionTarget", "True"),
    ]
    # A stale resourceVersion conflicts, as the kubelet's writes rely on.
    pod.metadata.labels = {}
    with pytest.raises(ApiException) as conflict:
        v1.replace_namespaced_pod_status("st", "default", pod)
    status = status_of(conflict.value)
    assert (conflict.value.status, status["reason"]) == (409, "Conflict")
    assert "the object has been modified" in status["message"]


def patch_resize(v1: CoreV1Api, name: str, patch: Json) -> Json:
    """PATCH pods/NAME/resize as the Kubernetes backend sends it (the pinned client has no
    method for it)."""
    response = v1.api_client.call_api(
        f"/api/v1/namespaces/default/pods/{name}/resize",
        "PATCH",
        header_params={"Content-Type": "application/strategic-merge-patch+json"},
        body=patch,
        _return_http_data_only=True,
        _preload_content=False,
    )
    result: Json = json.loads(response.data)
    return result


def resources_patch(cpu: str, memory: str, **extra: Any) -> Json:
    amounts = {"cpu": cpu, "memory": memory}
    container = {"name": "main", "resources": {"requests": amounts, "limits": amounts}}
    return {"spec": {"containers": [{**container, **extra}]}}


def test_resize_subresource_changes_only_cpu_and_memory(v1: CoreV1Api, api: FakeApiServer) -> None:
    v1.create_namespaced_pod("default", pod_body("rs"))

    resized = patch_resize(v1, "rs", resources_patch("1.5", "512Mi"))

    container = resized["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "1500m", "memory": "512Mi"}
    assert container["command"] == ["python", "-c", "pass"]  # merged by name, not replaced
    assert resized["status"]["qosClass"] == "Guaranteed"
    refusals = {
        "other field": resources_patch("1", "512Mi", image="python:3.12"),
        "qos class": {
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}},
                    }
                ]
            }
        },
    }
    for why, patch in refusals.items():
        with pytest.raises(ApiException) as refused:
            patch_resize(v1, "rs", patch)
        assert refused.value.status == 422, why
        assert "Forbidden" in status_of(refused.value)["message"], why
    api.serve_resize = False  # a cluster before 1.33
    with pytest.raises(ApiException) as older:
        patch_resize(v1, "rs", resources_patch("1", "512Mi"))
    assert older.value.status == 404
    stored = v1.read_namespaced_pod("rs", "default").spec.containers[0].resources.limits
    assert stored == {"cpu": "1500m", "memory": "512Mi"}


def test_secrets_fold_string_data_and_are_replaced_whole(v1: CoreV1Api) -> None:
    secret = v1.create_namespaced_secret(
        "default", {"metadata": {"name": "tok"}, "stringData": {"token": "hunter2"}}
    )
    assert secret.data == {"token": "aHVudGVyMg=="} and secret.string_data is None
    assert secret.type == "Opaque"
    replaced = v1.replace_namespaced_secret(
        "tok", "default", {"metadata": {"name": "tok"}, "data": {"other": "eA=="}}
    )
    assert replaced.data == {"other": "eA=="}  # secrets allow an unconditional update
    assert int(replaced.metadata.resource_version) > int(secret.metadata.resource_version)
    with pytest.raises(ApiException) as not_base64:
        v1.create_namespaced_secret("default", {"metadata": {"name": "b"}, "data": {"k": "!"}})
    assert not_base64.value.status == 400


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
    assert names("job=j,role!=ps") == ["w0"]
    assert names("role!=ps") == ["o0", "w0"]
    with pytest.raises(ApiException) as bad_selector:
        v1.list_namespaced_pod("default", label_selector="a in b")
    assert bad_selector.value.status == 400


# -- deletion ---------------------------------------------------------------------------------


def test_delete_returns_the_object_and_is_graceful_only_with_a_kubelet(
    v1: CoreV1Api, api: FakeApiServer
) -> None:
    v1.create_namespaced_pod("default", pod_body("gone"))
    deleted = v1.delete_namespaced_pod("gone", "default")
    assert deleted.kind == "Pod" and deleted.metadata.name == "gone"  # 200 with the object
    with pytest.raises(ApiException):
        v1.read_namespaced_pod("gone", "default")

    api.kubelet_nodes.add("fake-node-0")
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
    with pytest.raises(ApiException) as wrong_uid:
        v1.delete_namespaced_pod(
            "bound",
            "default",
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-it")),
        )
    assert wrong_uid.value.status == 409
    v1.delete_namespaced_pod(
        "bound", "default", body=client.V1DeleteOptions(grace_period_seconds=0)
    )
    with pytest.raises(ApiException) as gone:
        v1.read_namespaced_pod("bound", "default")
    assert gone.value.status == 404


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
    v1.create_namespaced_pod("default", pod_body("free"))
    v1.delete_namespaced_pod("master", "default")  # Background: dependents go after it
    wait_until(lambda: not exists("w0") and not exists("w1"))
    with pytest.raises(ApiException):
        v1.read_namespaced_secret("s", "default")
    assert exists("free")


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
    v1.create_namespaced_pod("default", pod_body("b", {"job": "k"}))
    v1.patch_namespaced_pod_status("a", "default", {"status": {"phase": "Running"}})
    v1.delete_namespaced_pod("b", "default")
    events: list[tuple[str, str, str]] = []
    collect(v1, events, 3, resource_version=since, timeout_seconds=5).join(10)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    rvs = [int(rv) for _, _, rv in events]
    assert rvs == sorted(rvs) and rvs[0] > int(since)
    selected: list[tuple[str, str, str]] = []
    collect(v1, selected, 1, resource_version=since, label_selector="job=j", timeout_seconds=5
            ).join(10)  # fmt: skip
    assert [(t, n) for t, n, _ in selected] == [("MODIFIED", "a")]
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


def test_bookmarks_as_the_official_client_yields_them(v1: CoreV1Api, api: FakeApiServer) -> None:
    api.bookmark_interval_s = 0.3
    rv = v1.list_namespaced_pod("default").metadata.resource_version
    v1.create_namespaced_secret("default", {"metadata": {"name": "bump"}})  # not a pod event
    seen: list[tuple[str, Any]] = []
    w = watch.Watch()

    def run(**kwargs: Any) -> None:
        for event in w.stream(v1.list_namespaced_pod, "default", resource_version=rv, **kwargs):
            seen.append((event["type"], event["object"]))
            w.stop()

    run(timeout_seconds=1)  # bookmarks not asked for: none, the watch runs to its timeout
    assert seen == []
    run(timeout_seconds=5, allow_watch_bookmarks=True)
    # The client passes a BOOKMARK through undecoded (a dict, not a V1Pod), and does not
    # resume from its resourceVersion: a consumer must handle the type itself.
    [(kind, obj)] = seen
    assert kind == "BOOKMARK"
    assert obj == {"kind": "Pod", "apiVersion": "v1",
                   "metadata": {"resourceVersion": str(int(rv) + 1)}}  # fmt: skip


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


def test_audit_records_rbac_verbs(v1: CoreV1Api, api: FakeApiServer) -> None:
    v1.create_namespaced_pod("default", pod_body("a", {"job": "j"}))
    v1.read_namespaced_pod("a", "default")
    v1.list_namespaced_pod("default", label_selector="job=j")
    for _ in watch.Watch().stream(v1.list_namespaced_pod, "default", timeout_seconds=1):
        pass
    v1.patch_namespaced_pod_status("a", "default", {"status": {"phase": "Running"}})
    v1.delete_namespaced_pod("a", "default")
    v1.create_namespaced_secret("default", {"metadata": {"name": "s"}})
    raw_get(api, "/api/v1/namespaces/default/secrets/s", kubelet=True)
    assert api.rbac_verbs() == {
        ("", "pods", verb) for verb in ("create", "get", "list", "watch", "delete")
    } | {("", "pods/status", "patch"), ("", "secrets", "create")}  # fmt: skip
    kubelet_calls = [c for c in api.calls if c.from_kubelet]
    assert [(c.verb, c.resource, c.name) for c in kubelet_calls] == [("get", "secrets", "s")]
    first = api.calls[0]
    assert (first.verb, first.namespace, first.code) == ("create", "default", 201)


def test_forbid(v1: CoreV1Api, api: FakeApiServer) -> None:
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
    v1.delete_namespaced_pod("a", "default")


# -- metrics and discovery --------------------------------------------------------------------


def test_pod_metrics_api(api: FakeApiServer, tmp_path: Path) -> None:
    api_client = make_client(api, tmp_path)
    v1, custom = CoreV1Api(api_client), CustomObjectsApi(api_client)
    v1.create_namespaced_pod("default", pod_body("w0", {"role": "worker"}))
    v1.create_namespaced_pod("default", pod_body("p0", {"role": "ps"}))
    api.set_pod_metrics("default", "w0", 0.25, 123456 * 1024)
    api.set_pod_metrics("default", "p0", 1.5, 1000)

    def listed(selector: str) -> list[Json]:
        got = custom.list_namespaced_custom_object(
            "metrics.k8s.io", "v1beta1", "default", "pods", label_selector=selector
        )
        assert got["kind"] == "PodMetricsList"
        items: list[Json] = got["items"]
        return items

    [item] = listed("role=worker")
    assert item["metadata"]["name"] == "w0" and item["metadata"]["labels"] == {"role": "worker"}
    assert item["containers"] == [{"name": "main", "usage": {"cpu": "250m", "memory": "123456Ki"}}]
    [one] = listed("role=ps")
    assert one["containers"][0]["usage"] == {"cpu": "1500m", "memory": "1k"}
    v1.delete_namespaced_pod("p0", "default")
    assert listed("role=ps") == []  # a deleted pod has no metrics

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
    assert client.VersionApi(api_client).get_code().git_version.startswith("v1.34")
    resources = {r.name: r for r in CoreV1Api(api_client).get_api_resources().resources}
    assert set(resources) == {
        "pods",
        "pods/status",
        "pods/binding",
        "pods/resize",
        "pods/log",
        "events",
        "secrets",
    }
    assert resources["pods"].short_names == ["po"] and resources["pods"].namespaced
    assert set(resources["pods"].verbs) == {"create", "delete", "get", "list", "patch", "watch"}
    assert resources["pods/status"].verbs == ["get", "patch", "update"]
    assert resources["pods/log"].verbs == ["get"]
    assert set(resources["events"].verbs) == {"create", "get", "list", "patch"}


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
    assert raw_get(api, "/api/v1/namespaces/default/leases/job-master", kubelet=False) == 404


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
    leases: client.CoordinationV1Api, api: FakeApiServer, spec: Json, code: int, message: str
) -> None:
    with pytest.raises(ApiException) as refused:
        leases.create_namespaced_lease("default", lease_body("job-master", **spec))
    assert refused.value.status == code
    assert message in status_of(refused.value)["message"]
    assert api.list_objects("leases") == []


# -- env from the downward API ------------------------------------------------------------------


def env_pod(name: str, *env: Json) -> Json:
    return pod_body(name, env=list(env))


def field_env(path: str, name: str = "V", **ref: Any) -> Json:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path, **ref}}}


def test_env_value_from_is_validated_as_the_real_server_does(v1: CoreV1Api) -> None:
    """What a kubelet could not resolve never reaches it: the server refuses it at creation
    (422), with the real server's causes; a good fieldRef gets its apiVersion defaulted."""
    created = v1.create_namespaced_pod(
        "default",
        env_pod(
            "ok",
            field_env("metadata.uid"),
            field_env("status.podIP", "IP"),
            field_env("metadata.labels['app.kubernetes.io/name']", "APP"),
        ),
    )
    assert created.spec.containers[0].env[0].value_from.field_ref.api_version == "v1"
    assert created.spec.service_account_name == "default"  # the admission plugin's default
    refused = {
        "status.phase": (
            "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath",
            'Unsupported value: "status.phase": supported values: "metadata.name",',
        ),
        "metadata.labels": (
            "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath",
            'Unsupported value: "metadata.labels"',
        ),
        "metadata.owner": (
            "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath",
            "error converting fieldPath: field label not supported: metadata.owner",
        ),
        "spec.containers['main']": (
            "spec.containers[0].env[0].valueFrom.fieldRef.fieldPath",
            "field label does not support subscript",
        ),
    }
    for i, (path, (where, why)) in enumerate(refused.items()):
        with pytest.raises(ApiException) as bad:
            v1.create_namespaced_pod("default", env_pod(f"bad{i}", field_env(path)))
        assert bad.value.status == 422, path
        [cause] = status_of(bad.value)["details"]["causes"]
        assert cause["field"] == where and why in cause["message"], (path, cause)
    two_sources = {
        "name": "V",
        "valueFrom": {
            "fieldRef": {"fieldPath": "metadata.name"},
            "secretKeyRef": {"name": "s", "key": "k"},
        },
    }
    with_value = {"name": "V", "value": "x", **field_env("metadata.name")}
    other_version = field_env("metadata.name", apiVersion="v2")
    for env, why in (
        (two_sources, "may not have more than one field specified at a time"),
        (with_value, "may not be specified when `value` is not empty"),
        (other_version, "unsupported pod version: v2"),
    ):
        with pytest.raises(ApiException) as bad:
            v1.create_namespaced_pod("default", env_pod("bad", env))
        assert bad.value.status == 422 and why in status_of(bad.value)["message"]


# -- pod metadata patches --------------------------------------------------------------------


def test_pod_patch_changes_its_metadata_only(v1: CoreV1Api, api: FakeApiServer) -> None:
    """A strategic merge patch of a pod (an annotation, a label) as the real server takes it:
    its status stays the kubelet's, its spec may not change (422), and a watch whose selector
    the pod stops matching sees it DELETED."""
    v1.create_namespaced_pod("default", pod_body("p", {"job": "j"}))
    events: list[tuple[str, str, str]] = []
    watcher = collect(v1, events, 3, label_selector="job=j")
    wait_until(lambda: events)
    before = v1.read_namespaced_pod("p", "default")
    patched = v1.patch_namespaced_pod(
        "p",
        "default",
        {"metadata": {"annotations": {"example.com/cancel": "user"}}, "status": {"phase": "X"}},
    )
    assert patched.metadata.annotations == {"example.com/cancel": "user"}
    assert patched.status.phase == "Pending"  # not through the pod: through pods/status
    assert int(patched.metadata.resource_version) > int(before.metadata.resource_version)
    with pytest.raises(ApiException) as spec:
        v1.patch_namespaced_pod("p", "default", {"spec": {"restartPolicy": "Always"}})
    assert spec.value.status == 422
    assert "pod updates may not change fields other than" in status_of(spec.value)["message"]
    v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"job": "other"}}})
    watcher.join(timeout=5)
    assert [kind for kind, _, _ in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert ("", "pods", "patch") in api.rbac_verbs()


# -- events --------------------------------------------------------------------------------------


def event_body(pod: Any, **fields: Any) -> Json:
    now = "2026-11-27T05:40:00.123456+00:00"  # what the client sends for an aware datetime
    body: Json = {
        "metadata": {"generateName": f"{pod.metadata.name}."},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.metadata.name,
            "namespace": "default",
            "uid": pod.metadata.uid,
        },
        "reason": "Relaunched",
        "message": "worker 1 relaunched after OOMKilled",
        "type": "Warning",
        "source": {"component": "dlrover-kfp-master"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    body.update(fields)
    return body


def test_events_are_created_listed_by_object_and_patched(v1: CoreV1Api, api: FakeApiServer) -> None:
    """core/v1 Events: what a master reports and what ``kubectl describe pod`` lists (by a
    field selector on the involved object); a repeat is a patch of count and lastTimestamp."""
    first = v1.create_namespaced_pod("default", pod_body("w-0"))
    other = v1.create_namespaced_pod("default", pod_body("w-1"))
    made = v1.create_namespaced_event("default", event_body(first))
    assert made.metadata.name.startswith("w-0.") and len(made.metadata.name) == len("w-0.") + 5
    assert made.first_timestamp.isoformat() == "2026-11-27T05:40:00+00:00"  # whole seconds
    v1.create_namespaced_event("default", event_body(other, reason="Scaled", type="Normal"))
    assert v1.read_namespaced_event(made.metadata.name, "default").reason == "Relaunched"

    def listed(selector: str) -> list[str]:
        found = v1.list_namespaced_event("default", field_selector=selector)
        return sorted(e.involved_object.name for e in found.items)

    describe = (
        f"involvedObject.uid={first.metadata.uid},involvedObject.name=w-0,"
        "involvedObject.namespace=default"
    )
    assert listed(describe) == ["w-0"]
    assert listed("involvedObject.kind=Pod") == ["w-0", "w-1"]
    assert listed("type!=Warning,reason==Scaled") == ["w-1"]
    assert listed("source=dlrover-kfp-master") == ["w-0", "w-1"]
    with pytest.raises(ApiException) as unknown:
        listed("involvedObject.labels=x")
    assert unknown.value.status == 400

    later = "2026-11-27T05:41:30Z"
    repeat = v1.patch_namespaced_event(
        made.metadata.name, "default", {"count": 2, "lastTimestamp": later}
    )
    assert (repeat.count, repeat.last_timestamp.isoformat()) == (2, "2026-11-27T05:41:30+00:00")
    assert repeat.message == made.message
    assert {("", "events", "create"), ("", "events", "list"), ("", "events", "patch")} <= (
        api.rbac_verbs()
    )


def test_events_are_validated_as_core_v1_validates_them(v1: CoreV1Api) -> None:
    """What a real server refuses of a core/v1 Event, and what it lets through (a ``type``
    other than Normal or Warning: that check is the events.k8s.io API's only)."""
    pod = v1.create_namespaced_pod("default", pod_body("w-0"))
    odd = v1.create_namespaced_event("default", event_body(pod, type="Odd"))
    assert odd.type == "Odd"

    naive = event_body(pod, firstTimestamp="2026-11-27T05:40:00.123456")  # no zone
    with pytest.raises(ApiException) as decode:
        v1.create_namespaced_event("default", naive)
    assert decode.value.status == 400
    assert 'cannot parse "" as "Z07:00"' in status_of(decode.value)["message"]

    elsewhere = event_body(pod)
    elsewhere["involvedObject"]["namespace"] = "kube-system"
    with pytest.raises(ApiException) as mismatch:
        v1.create_namespaced_event("default", elsewhere)
    assert mismatch.value.status == 422
    [cause] = status_of(mismatch.value)["details"]["causes"]
    assert cause["field"] == "involvedObject.namespace"

    # A "new" event (with eventTime) needs what identifies its reporter and action.
    new = event_body(pod, eventTime="2026-11-27T05:40:00.123456Z", reason="")
    with pytest.raises(ApiException) as incomplete:
        v1.create_namespaced_event("default", new)
    fields = {c["field"] for c in status_of(incomplete.value)["details"]["causes"]}
    assert fields == {"reportingComponent", "reportingInstance", "action", "reason"}
    complete = dict(
        new, reason="Scaled", action="Scale", reportingComponent="dlrover-kfp.io/master",
        reportingInstance="master-0",
    )  # fmt: skip
    assert v1.create_namespaced_event("default", complete).action == "Scale"

    unnamed = event_body(pod, metadata={})
    with pytest.raises(ApiException) as no_name:
        v1.create_namespaced_event("default", unnamed)
    assert no_name.value.status == 422


# -- pods/log: what the server answers before the kubelet --------------------------------------


def raw_log(api: FakeApiServer, name: str, query: str = "") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    conn.request("GET", f"/api/v1/namespaces/default/pods/{name}/log{query}")
    response = conn.getresponse()
    found = response.status, response.read()
    conn.close()
    return found


def test_pod_log_requests_the_server_answers_itself(v1: CoreV1Api, api: FakeApiServer) -> None:
    """The options and the container are the server's to check; an unscheduled pod's log is
    empty; a node without a kubelet cannot be reached; ``get pods/log`` is its own right."""
    v1.create_namespaced_pod("default", pod_body("alone"))
    assert raw_log(api, "alone") == (200, b"")  # not on a node: nothing to proxy to
    two = pod_body("two")
    two["spec"]["containers"].append(dict(two["spec"]["containers"][0], name="sidecar"))
    v1.create_namespaced_pod("default", two)
    code, body = raw_log(api, "two")
    assert code == 400
    assert json.loads(body)["message"] == (
        "a container name must be specified for pod two, choose one of: [main sidecar]"
    )
    for query, status in (
        ("?tailLines=x", 400),
        ("?sinceTime=2026-11-27T05:40:00", 400),
        ("?sinceSeconds=5&sinceTime=2026-11-27T05:40:00Z", 422),
        ("?limitBytes=0", 422),
    ):
        assert raw_log(api, "alone", query)[0] == status, query
    assert raw_log(api, "absent")[0] == 404

    binding = {"target": {"name": "gone-node"}, "metadata": {"name": "alone"}}
    v1.create_namespaced_pod_binding("alone", "default", binding, _preload_content=False)
    code, body = raw_log(api, "alone")
    assert code == 500 and "gone-node:10250/containerLogs/default/alone/main" in body.decode()

    api.forbid("get", "pods/log")
    with pytest.raises(ApiException) as forbidden:
        v1.read_namespaced_pod_log("two", "default", container="main")
    assert forbidden.value.status == 403
    assert [c.rbac_resource for c in api.client_calls() if c.code == 403] == ["pods/log"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed here")
def test_kubectl_describe_pod_lists_its_events(
    v1: CoreV1Api, api: FakeApiServer, tmp_path: Path
) -> None:
    """The field selector ``kubectl describe pod`` sends finds the pod's events, not others."""
    pod = v1.create_namespaced_pod("default", pod_body("w-0"))
    v1.create_namespaced_event("default", event_body(pod))
    other = v1.create_namespaced_pod("default", pod_body("w-1"))
    v1.create_namespaced_event("default", event_body(other, reason="Scaled", message="other"))
    config = api.write_kubeconfig(tmp_path / "kubectl-config")
    described = subprocess.run(
        ["kubectl", "--kubeconfig", str(config), "describe", "pod", "w-0"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    events = described.split("Events:", 1)[1]
    assert "Warning  Relaunched" in events and "dlrover-kfp-master" in events
    assert "worker 1 relaunched after OOMKilled" in events and "other" not in events
    [listing] = [c for c in api.calls if c.resource == "events" and c.verb == "list"]
    assert "fieldSelector=involvedObject" in listing.path
