"""The fake kubelet runs the fake API server's pods as local processes, as a kubelet would."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import kubernetes  # type: ignore[import-untyped]
import pytest
from kubernetes import watch
from kubernetes.client import (  # type: ignore[import-untyped]
    ApiException,
    CoreV1Api,
    CustomObjectsApi,
)

from tests.fakes import FakeApiServer, FakeKubelet

Json = dict[str, Any]

# Grows to 400 MiB in 20 MiB steps (as the local backend's own OOM test does).
GROW_400_MB = (
    "import time\n"
    "chunks = []\n"
    "for _ in range(20):\n"
    "    chunks.append(b'x' * (20 << 20))\n"
    "    time.sleep(0.02)\n"
    "time.sleep(30)\n"
)
IGNORE_SIGTERM = (
    "import pathlib, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "pathlib.Path(sys.argv[1]).write_text('ready')\n"
    "time.sleep(60)\n"
)


# Names the pod's own shared-memory directory in argv[1], then sleeps.
NAME_SHM_AND_SLEEP = (
    "import os, pathlib, sys, time\n"
    "pathlib.Path(sys.argv[1]).write_text(os.environ['DLROVER_KFP_SHM_DIR'])\n"
    "time.sleep(60)\n"
)


def wait_text(path: Path, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} not written within {timeout_s}s"
        time.sleep(0.02)
    return path.read_text()


@dataclass
class Cluster:
    api: FakeApiServer
    kubelet: FakeKubelet
    v1: CoreV1Api
    custom: CustomObjectsApi


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with (
        FakeApiServer() as api,
        FakeKubelet(api, log_dir=tmp_path / "logs") as kubelet,
    ):
        config = api.write_kubeconfig(tmp_path / "kubeconfig")
        client = kubernetes.config.new_client_from_config(config_file=str(config))
        yield Cluster(api, kubelet, CoreV1Api(client), CustomObjectsApi(client))


def pod(
    name: str,
    code: str,
    *args: str,
    memory: str = "128Mi",
    env: list[Json] | None = None,
    command: str = sys.executable,
    labels: dict[str, str] | None = None,
    cpu: str = "500m",
) -> Json:
    return {
        "metadata": {"name": name, "labels": labels or {"role": "worker", "index": "0"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": [command, "-c", code],
                    "args": list(args),
                    "env": env or [],
                    "resources": {"limits": {"cpu": cpu, "memory": memory}},
                }
            ],
        },
    }


class PodWatch:
    """Records every pod event an official-client watch sees, with its arrival time."""

    def __init__(self, v1: CoreV1Api) -> None:
        self.events: list[tuple[float, str, Json]] = []
        self._watch = watch.Watch()
        rv = v1.list_namespaced_pod("default").metadata.resource_version
        self._thread = threading.Thread(target=self._run, args=(v1, rv), daemon=True)
        self._thread.start()

    def _run(self, v1: CoreV1Api, rv: str) -> None:
        for event in self._watch.stream(
            v1.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=60
        ):
            self.events.append((time.monotonic(), event["type"], event["raw_object"]))

    def wait(self, predicate: Callable[[str, Json], bool], timeout_s: float = 10.0) -> Json:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for _, kind, obj in list(self.events):
                if predicate(kind, obj):
                    return obj
            time.sleep(0.02)
        seen = [(k, o["metadata"]["name"], o["status"].get("phase")) for _, k, o in self.events]
        raise AssertionError(f"no such event within {timeout_s}s; saw {seen}")

    def phases(self, name: str) -> list[str]:
        phases: list[str] = []
        for _, _, obj in self.events:
            phase = obj["status"].get("phase")
            if obj["metadata"]["name"] == name and (not phases or phases[-1] != phase):
                phases.append(phase)
        return phases

    def stop(self) -> None:
        self._watch.stop()


def phase_is(name: str, *phases: str) -> Callable[[str, Json], bool]:
    return lambda kind, obj: (
        obj["metadata"]["name"] == name and obj["status"].get("phase") in phases
    )


def container_state(obj: Json) -> Json:
    state: Json = obj["status"]["containerStatuses"][0]["state"]
    return state


def conditions(obj: Json) -> dict[str, Json]:
    return {c["type"]: c for c in obj["status"].get("conditions") or []}


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie not yet reaped still answers; the backend reaps on delete.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] == "Z"


def test_pod_runs_to_completion_with_env_from_a_secret(cluster: Cluster, tmp_path: Path) -> None:
    v1 = cluster.v1
    v1.create_namespaced_secret(
        "default", {"metadata": {"name": "creds"}, "stringData": {"token": "hunter2"}}
    )
    out = tmp_path / "out.txt"
    code = (
        "import os, sys, time\n"
        "time.sleep(0.3)\n"
        "open(sys.argv[1], 'w').write(os.environ['TOKEN'] + ' ' + os.environ['PLAIN'])\n"
    )
    env: list[Json] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "PLAIN", "value": "$(TOKEN)"},  # expanded from the variables before it
    ]
    events = PodWatch(v1)
    v1.create_namespaced_pod("default", pod("w-0", code, str(out), env=env))
    done = events.wait(phase_is("w-0", "Succeeded", "Failed"))
    assert events.phases("w-0") == ["Pending", "Running", "Succeeded"]
    assert out.read_text() == "hunter2 hunter2"
    running = events.wait(phase_is("w-0", "Running"))
    started = container_state(running)["running"]["startedAt"]
    assert running["status"]["podIP"] == "127.0.0.1" and running["status"]["startTime"]
    assert conditions(running)["Ready"]["status"] == "True"
    assert running["status"]["containerStatuses"][0]["ready"] is True
    terminated = container_state(done)["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    assert terminated["startedAt"] == started and terminated["finishedAt"]
    assert conditions(done)["Ready"]["status"] == "False"
    assert conditions(done)["PodScheduled"]["status"] == "True"
    assert done["spec"]["nodeName"] == "fake-node-0"
    log = cluster.kubelet.backend.log_path("w-0").read_text()
    assert "dlrover-kfp launch w-0 role=worker index=0 cpu=0.5 memory_mb=128" in log
    assert "hunter2" not in log  # env values are never logged
    # The kubelet's requests are in the audit log, marked, and apart from the client's.
    kubelet_verbs = {(c.rbac_resource, c.verb) for c in cluster.api.calls if c.from_kubelet}
    assert {("pods", "watch"), ("pods/binding", "create"), ("pods/status", "update"),
            ("secrets", "get")} <= kubelet_verbs  # fmt: skip
    assert ("", "pods/status", "update") not in cluster.api.rbac_verbs()
    events.stop()


def test_failing_command_is_failed_with_its_exit_code(cluster: Cluster) -> None:
    events = PodWatch(cluster.v1)
    # "python" in a command resolves to this interpreter, as if the image had it.
    cluster.v1.create_namespaced_pod(
        "default", pod("w-1", "import sys; sys.exit(3)", command="python")
    )
    done = events.wait(phase_is("w-1", "Failed", "Succeeded"))
    terminated = container_state(done)["terminated"]
    assert (done["status"]["phase"], terminated["reason"], terminated["exitCode"]) == (
        "Failed",
        "Error",
        3,
    )
    # A command that cannot start: StartError, exit code 128, as containerd reports.
    cluster.v1.create_namespaced_pod("default", pod("w-2", "", command="/no/such/binary"))
    failed = events.wait(phase_is("w-2", "Failed"))
    terminated = container_state(failed)["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("StartError", 128)
    events.stop()


def test_over_its_memory_limit_is_oom_killed_and_seen_quickly(cluster: Cluster) -> None:
    events = PodWatch(cluster.v1)
    cluster.v1.create_namespaced_pod("default", pod("ps-0", GROW_400_MB, memory="200Mi"))
    done = events.wait(phase_is("ps-0", "Failed", "Succeeded"), timeout_s=15)
    terminated = container_state(done)["terminated"]
    assert (done["status"]["phase"], terminated["reason"], terminated["exitCode"]) == (
        "Failed",
        "OOMKilled",
        137,
    )
    write = cluster.kubelet.status_write("ps-0", ("Failed",))
    assert write.reason == "OOMKilled"
    [seen_at] = [
        at
        for at, _, obj in events.events
        if obj["status"].get("containerStatuses")
        and container_state(obj).get("terminated", {}).get("reason") == "OOMKilled"
    ]
    latency = seen_at - write.at
    assert 0 <= latency < 0.5, f"kubelet write to client watch took {latency:.3f}s"
    events.stop()


def test_delete_with_grace_stops_the_process_then_removes_the_pod(
    cluster: Cluster, tmp_path: Path
) -> None:
    events = PodWatch(cluster.v1)
    ready = tmp_path / "ready"
    cluster.v1.create_namespaced_pod("default", pod("w-3", IGNORE_SIGTERM, str(ready)))
    events.wait(phase_is("w-3", "Running"))
    deadline = time.monotonic() + 10
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = cluster.kubelet.pid_of("w-3")
    assert pid is not None and not process_gone(pid)
    started = time.monotonic()
    marked = cluster.v1.delete_namespaced_pod("w-3", "default", grace_period_seconds=1)
    assert marked.metadata.deletion_grace_period_seconds == 1
    assert marked.metadata.deletion_timestamp is not None
    events.wait(lambda kind, obj: kind == "DELETED" and obj["metadata"]["name"] == "w-3")
    assert time.monotonic() - started >= 1.0  # SIGTERM ignored: killed when the grace ran out
    assert process_gone(pid)
    kinds = [(k, o["status"].get("phase")) for _, k, o in events.events if k != "ADDED"]
    assert ("MODIFIED", "Running") in kinds and kinds[-1][0] == "DELETED"
    last_status = [o for _, k, o in events.events if k == "MODIFIED"][-1]
    assert last_status["metadata"]["deletionTimestamp"]
    terminated = container_state(last_status)["terminated"]
    assert (last_status["status"]["phase"], terminated["exitCode"]) == ("Failed", 137)
    with pytest.raises(ApiException) as gone:
        cluster.v1.read_namespaced_pod("w-3", "default")
    assert gone.value.status == 404
    events.stop()


def test_evict_preempt_and_lose_node(cluster: Cluster, tmp_path: Path) -> None:
    v1, kubelet = cluster.v1, cluster.kubelet
    events = PodWatch(v1)
    for name in ("ev", "pre", "lost"):
        v1.create_namespaced_pod("default", pod(name, NAME_SHM_AND_SLEEP, str(tmp_path / name)))
    for name in ("ev", "pre", "lost"):
        events.wait(phase_is(name, "Running"))
    pids = {name: kubelet.pid_of(name) for name in ("ev", "pre", "lost")}
    shm = {name: Path(wait_text(tmp_path / name)) for name in ("ev", "pre", "lost")}
    assert len(set(shm.values())) == 3 and all(d.is_dir() for d in shm.values())

    kubelet.evict("ev", message="The node was low on resource: memory.")
    evicted = v1.read_namespaced_pod("ev", "default")  # the object stays, Failed
    assert (evicted.status.phase, evicted.status.reason) == ("Failed", "Evicted")
    assert evicted.status.message == "The node was low on resource: memory."
    target = {c.type: c for c in evicted.status.conditions}["DisruptionTarget"]
    assert (target.status, target.reason) == ("True", "TerminationByKubelet")
    pid = pids["ev"]
    assert pid is not None and process_gone(pid)

    kubelet.preempt("pre")
    gone = events.wait(lambda kind, obj: kind == "DELETED" and obj["metadata"]["name"] == "pre")
    assert conditions(gone)["DisruptionTarget"]["reason"] == "PreemptionByScheduler"

    kubelet.lose_node()
    gone = events.wait(lambda kind, obj: kind == "DELETED" and obj["metadata"]["name"] == "lost")
    assert conditions(gone)["DisruptionTarget"]["reason"] == "DeletionByTaintManager"
    assert gone["status"]["phase"] == "Running"  # the lost node never reported an end
    for name in ("pre", "lost"):
        pid = pids[name]
        assert pid is not None and process_gone(pid)
    # Each pod's /dev/shm went with it: evicted, preempted, or lost with its node.
    assert not any(d.exists() for d in shm.values())
    events.stop()


def test_missing_secret_waits_then_starts(cluster: Cluster) -> None:
    events = PodWatch(cluster.v1)
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "later", "key": "t"}}}]
    cluster.v1.create_namespaced_pod("default", pod("w-4", "pass", env=env))
    waiting = events.wait(
        lambda kind, obj: (
            obj["status"].get("containerStatuses") is not None and obj["metadata"]["name"] == "w-4"
        )
    )
    assert waiting["status"]["phase"] == "Pending"
    assert container_state(waiting)["waiting"] == {
        "reason": "CreateContainerConfigError",
        "message": 'secret "later" not found',
    }
    cluster.v1.create_namespaced_secret("default", {"metadata": {"name": "later"},
                                                    "stringData": {"t": "x"}})  # fmt: skip
    events.wait(phase_is("w-4", "Succeeded"))
    events.stop()


def test_usage_reaches_the_metrics_api(cluster: Cluster) -> None:
    events = PodWatch(cluster.v1)
    cluster.v1.create_namespaced_pod(
        "default", pod("busy", "while True: pass", labels={"role": "ps", "index": "1"})
    )
    events.wait(phase_is("busy", "Running"))
    deadline = time.monotonic() + 5
    items: list[Json] = []
    while not items and time.monotonic() < deadline:
        listing = cluster.custom.list_namespaced_custom_object(
            "metrics.k8s.io", "v1beta1", "default", "pods", label_selector="role=ps"
        )
        items = listing["items"]
        time.sleep(0.1)
    [metrics] = items
    usage = metrics["containers"][0]["usage"]
    assert usage["cpu"].endswith(("n", "u", "m")) or usage["cpu"].isdigit()
    assert usage["memory"].endswith("Ki")
    cluster.v1.delete_namespaced_pod("busy", "default", grace_period_seconds=0)
    events.stop()


def test_kubelet_is_exempt_from_api_storms(cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "ran"
    code = "import sys, time; time.sleep(0.3); open(sys.argv[1], 'w').write('ok')"
    cluster.v1.create_namespaced_pod("default", pod("w-6", code, str(out)))
    cluster.api.storm(3.0, code=503)
    with pytest.raises(ApiException):
        cluster.v1.list_namespaced_pod("default")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        obj = cluster.api.get_object("pods", "default", "w-6")
        if obj and obj["status"]["phase"] == "Succeeded":
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the pod did not complete during the storm")
    assert out.read_text() == "ok"
    cluster.api.clear_faults()


def test_kubelet_relists_after_its_watch_expires(cluster: Cluster) -> None:
    cluster.api.compact()
    assert cluster.api.expire_watches() == 1  # the kubelet's: it relists and watches again
    deadline = time.monotonic() + 5
    while cluster.api.open_watches < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    cluster.v1.create_namespaced_pod("default", pod("after", "pass"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        obj = cluster.api.get_object("pods", "default", "after")
        if obj and obj["status"]["phase"] == "Succeeded":
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the kubelet did not run a pod created after its watch expired")
    lists = [c for c in cluster.api.calls if c.from_kubelet and c.verb == "list"]
    assert len(lists) == 2  # the initial list and the relist after the 410


# -- the downward API, $(VAR) expansion, the image's command -----------------------------------

# Writes its argv and the variables it was given to argv[1], as JSON.
DUMP_ENV = (
    "import json, os, sys\n"
    "keys = ('POD_NAME', 'POD_NAMESPACE', 'POD_UID', 'POD_IP', 'NODE', 'ACCOUNT', 'ROLE',\n"
    "        'NOTE', 'GREETING')\n"
    "env = {k: os.environ.get(k) for k in keys}\n"
    "open(sys.argv[1], 'w').write(json.dumps({'argv': sys.argv[2:], 'env': env}))\n"
)


def field_env(name: str, path: str) -> Json:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def test_env_from_the_downward_api_and_expansion_in_command_and_args(
    cluster: Cluster, tmp_path: Path
) -> None:
    """What a master pod's manifest relies on (deploy/master-pod.yaml): ``fieldRef`` env and
    ``$(POD_NAMESPACE)`` in its command line, resolved as the kubelet resolves them."""
    out = tmp_path / "env.json"
    env = [
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_UID", "metadata.uid"),
        field_env("POD_IP", "status.podIP"),
        field_env("NODE", "spec.nodeName"),
        field_env("ACCOUNT", "spec.serviceAccountName"),
        field_env("ROLE", "metadata.labels['role']"),
        field_env("NOTE", "metadata.annotations['example.com/note']"),
        {"name": "GREETING", "value": "hello $(POD_NAME) $(LATER) $$(POD_NAME)"},
    ]
    body = pod("downward", DUMP_ENV, str(out), env=env)
    body["metadata"]["annotations"] = {"example.com/note": "noted"}
    body["spec"]["serviceAccountName"] = "dlrover-kfp-master"
    body["spec"]["containers"][0]["args"] += [
        "--namespace=$(POD_NAMESPACE)",
        "$(UNDEFINED)",
        "$$(POD_NAME)",
        "cost: $5",
        "$(POD_IP",
    ]
    created = cluster.v1.create_namespaced_pod("default", body)
    seen = json.loads(wait_text(out))
    assert seen["env"] == {
        "POD_NAME": "downward",
        "POD_NAMESPACE": "default",
        "POD_UID": created.metadata.uid,
        "POD_IP": "127.0.0.1",
        "NODE": "fake-node-0",
        "ACCOUNT": "dlrover-kfp-master",
        "ROLE": "worker",
        "NOTE": "noted",
        # a value is expanded from the variables before it only; "$$" is a literal "$"
        "GREETING": "hello downward $(LATER) $(POD_NAME)",
    }
    # an undefined reference, an escaped one, a lone "$" and an unclosed "$(" stay as written
    assert seen["argv"] == [
        "--namespace=default",
        "$(UNDEFINED)",
        "$(POD_NAME)",
        "cost: $5",
        "$(POD_IP",
    ]


def test_dlrover_kfp_is_the_images_command(cluster: Cluster) -> None:
    """``dlrover-kfp`` as argv[0] runs this project's console script, as in the image, even
    where this environment's ``bin`` is not on the pod's ``PATH``."""
    body = pod("cli", "", env=[{"name": "PATH", "value": "/usr/bin:/bin"}])
    body["spec"]["containers"][0]["command"] = ["dlrover-kfp", "--version"]
    cluster.v1.create_namespaced_pod("default", body)
    done = wait_phase(cluster.v1, "cli", ("Succeeded", "Failed"), timeout_s=30)
    assert done["status"]["phase"] == "Succeeded"
    assert read_log(cluster.v1, "cli").startswith(b"dlrover-kfp ")


# -- pods/log ------------------------------------------------------------------------------------

# Prints a line, another 0.4 s later, then after 1.2 s more two lines and an unterminated one,
# then waits for argv[1] to appear before it exits.
TALK = (
    "import os, sys, time\n"
    "print('first', flush=True)\n"
    "time.sleep(0.4)\n"
    "print('second', flush=True)\n"
    "time.sleep(1.2)\n"
    "print('third\\nfourth', flush=True)\n"
    "sys.stderr.write('no newline')\n"
    "sys.stderr.flush()\n"
    "while not os.path.exists(sys.argv[1]):\n"
    "    time.sleep(0.02)\n"
)
STAMPED = re.compile(rb"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9})Z (.*)")


def stamped(line: bytes) -> tuple[float, bytes]:
    """A line served with ``timestamps``: its time (to the microsecond) and its text."""
    match = STAMPED.fullmatch(line)
    assert match is not None, f"not RFC 3339 with nanoseconds, a space, the line: {line!r}"
    return datetime.fromisoformat(match.group(1).decode()[:26] + "+00:00").timestamp(), match[2]


def wait_phase(v1: CoreV1Api, name: str, phases: tuple[str, ...], timeout_s: float = 10.0) -> Json:
    deadline = time.monotonic() + timeout_s
    while True:
        response = v1.read_namespaced_pod(name, "default", _preload_content=False)
        found: Json = json.loads(response.data)
        if found["status"].get("phase") in phases:
            return found
        assert time.monotonic() < deadline, f"{name} not {phases} in {timeout_s}s: {found}"
        time.sleep(0.05)


def read_log(v1: CoreV1Api, name: str, **options: Any) -> bytes:
    """The log through the official client, its bytes as sent (no decoding)."""
    response = v1.read_namespaced_pod_log(name, "default", _preload_content=False, **options)
    data: bytes = response.data
    return data


def wait_log(v1: CoreV1Api, name: str, text: bytes, timeout_s: float = 10.0) -> bytes:
    deadline = time.monotonic() + timeout_s
    while text not in (log := read_log(v1, name)):
        assert time.monotonic() < deadline, f"{text!r} not in the log of {name}: {log!r}"
        time.sleep(0.05)
    return log


def log_error(v1: CoreV1Api, name: str, **options: Any) -> tuple[int, str]:
    with pytest.raises(ApiException) as refused:
        read_log(v1, name, **options)
    return refused.value.status, json.loads(refused.value.body)["message"]


def test_pod_log_as_the_kubelet_serves_it(cluster: Cluster, tmp_path: Path) -> None:
    """``pods/NAME/log`` through the official client: stdout and stderr, each line stamped
    when it was written (to the runtime's poll), tail, since, limit, follow, and what a real
    server refuses; readable once the container has ended, gone with the pod."""
    v1, done = cluster.v1, tmp_path / "done"
    v1.create_namespaced_pod("default", pod("talk", TALK, str(done)))
    wait_phase(v1, "talk", ("Running",))
    wait_log(v1, "talk", b"second\n")
    follower = v1.read_namespaced_pod_log("talk", "default", follow=True, _preload_content=False)
    [(t1, first), (t2, second)] = map(stamped, read_log(v1, "talk", timestamps=True).splitlines())
    assert (first, second) == (b"first", b"second")
    assert 0.3 <= t2 - t1 <= 2.0  # each line its own time, not the read's

    wait_log(v1, "talk", b"fourth\n")
    assert read_log(v1, "talk", since_seconds=1) == b"third\nfourth\n"  # 1.2 s after second
    # written in one go, read in one go: still a time each, in order (the runtime's per line)
    lines = read_log(v1, "talk", timestamps=True).splitlines()
    assert lines[2].endswith(b" third") and lines[3].endswith(b" fourth")
    assert lines[2].partition(b" ")[0] < lines[3].partition(b" ")[0]  # fixed width: sortable
    time.sleep(0.2)  # "no newline" is written too, but a line is recorded once it ends
    whole = b"first\nsecond\nthird\nfourth\n"
    assert read_log(v1, "talk") == whole
    assert read_log(v1, "talk", tail_lines=2) == b"third\nfourth\n"
    assert read_log(v1, "talk", tail_lines=0) == b""
    assert read_log(v1, "talk", limit_bytes=8) == b"first\nse"
    assert read_log(v1, "talk", container="main") == whole

    assert log_error(v1, "talk", previous=True) == (
        400,
        'previous terminated container "main" in pod "talk" not found',
    )
    assert log_error(v1, "talk", container="sidecar") == (
        400,
        "container sidecar is not valid for pod talk",
    )
    assert log_error(v1, "talk", tail_lines=-1)[0] == 422
    assert log_error(v1, "talk", since_seconds=0)[0] == 422
    assert log_error(v1, "talk", limit_bytes=0)[0] == 422

    done.write_text("")  # the container ends: the follower's stream ends with its last line
    assert follower.read() == whole + b"no newline"
    ended = wait_phase(v1, "talk", ("Succeeded", "Failed"))
    assert ended["status"]["phase"] == "Succeeded"
    assert read_log(v1, "talk", tail_lines=1) == b"no newline"  # after its end, as it was
    assert ("", "pods/log", "get") in cluster.api.rbac_verbs()

    v1.delete_namespaced_pod("talk", "default")
    assert log_error(v1, "talk") == (404, 'pods "talk" not found')


def test_pod_log_of_a_container_not_started(cluster: Cluster) -> None:
    """No log yet: 400 with the container's waiting reason, as the kubelet says it."""
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}]
    cluster.v1.create_namespaced_pod("default", pod("blocked", "", env=env))
    wait_phase(cluster.v1, "blocked", ("Pending",))
    deadline = time.monotonic() + 10

    def refusal() -> tuple[int, str] | None:
        """The refusal of a log read; None while the pod is not yet bound to the node (the
        server answers an unscheduled pod with an empty log, as the real one does)."""
        try:
            read_log(cluster.v1, "blocked")
        except ApiException as refused:
            return refused.status, json.loads(refused.body)["message"]
        return None

    while (found := refusal()) is None or found[1].endswith("ContainerCreating"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert found == (
        400,
        'container "main" in pod "blocked" is waiting to start: CreateContainerConfigError',
    )
