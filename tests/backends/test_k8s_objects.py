"""The Kubernetes backend's pure half: manifests rendered, pod objects read back, quantities."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlrover_kfp.backends import PodPhase, PodSpec
from dlrover_kfp.backends.k8s_objects import (
    OwnerRef,
    Volume,
    dns_name,
    job_labels,
    label_value,
    pod_status,
    redacted,
    render_pod,
    render_secret,
    resize_patch,
    resize_progress,
    secret_keys,
)
from dlrover_kfp.cli.main import main as cli_main
from dlrover_kfp.training.wire import secret_to_env

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SECRET = "s3cr3t-value-that-must-not-leak"


def spec(role: str = "ps", **env: str) -> PodSpec:
    return PodSpec(
        name=f"ctr-{role}-0",
        role=role,  # type: ignore[arg-type]
        index=0,
        command=("python", "-m", "dlrover_kfp.training.node", role, "0", "--master", "m:1"),
        env={"DLROVER_KFP_SECRET": SECRET, **env},
        cpu=0.25,
        memory_mb=1536,
        labels={"job": "ctr", "role": role, "index": "0", "run": "ctr-20261124T050316"},
    )


def pod(s: PodSpec, **kw: Any) -> dict[str, Any]:
    keys = secret_keys(s.env, {})[0]
    return render_pod(
        s,
        namespace="ml",
        image="dlrover-kfp:0.1.0",
        labels=job_labels("ctr"),
        secret_name="ctr-env",
        secret_keys=keys,
        **kw,
    )


def test_a_pod_is_guaranteed_never_restarted_and_labelled() -> None:
    body = pod(spec("worker"))
    container = body["spec"]["containers"][0]
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert container["resources"]["limits"] == {"cpu": "250m", "memory": "1536Mi"}
    assert body["spec"]["restartPolicy"] == "Never"
    assert body["spec"]["automountServiceAccountToken"] is False
    labels = body["metadata"]["labels"]
    assert labels["job"] == "ctr" and labels["role"] == "worker" and labels["index"] == "0"
    assert labels["run"] == "ctr-20261124T050316"
    assert container["command"][:3] == ["python", "-m", "dlrover_kfp.training.node"]
    # the trainer sizes its threads by these: plain values, the pod's own limits
    env = {e["name"]: e for e in container["env"]}
    assert env["DLROVER_KFP_POD_CPU"]["value"] == "0.25"
    assert env["DLROVER_KFP_POD_MEMORY_MB"]["value"] == "1536"


def test_both_resources_resize_without_a_restart_and_the_patch_keeps_the_class() -> None:
    container = pod(spec("worker"))["spec"]["containers"][0]
    assert container["resizePolicy"] == [
        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
        {"resourceName": "memory", "restartPolicy": "NotRequired"},
    ]
    bigger = PodSpec(**{**_fields(spec("worker")), "cpu": 1.5, "memory_mb": 2048})
    (patched,) = resize_patch(bigger)["spec"]["containers"]
    assert patched["name"] == container["name"] == "worker"
    amounts = {"cpu": "1500m", "memory": "2048Mi"}
    assert patched["resources"] == {"requests": amounts, "limits": amounts}


def _fields(s: PodSpec) -> dict[str, Any]:
    return {f: getattr(s, f) for f in s.__slots__}


def _resizing(conditions: list[dict[str, Any]], limits: dict[str, str]) -> dict[str, Any]:
    return {
        "status": {
            "phase": "Running",
            "conditions": [{"status": "True", **c} for c in conditions],
            "containerStatuses": [{"name": "worker", "resources": {"limits": limits}}],
        }
    }


@pytest.mark.parametrize(
    ("conditions", "limits", "state", "message"),
    [
        ([], {"cpu": "250m", "memory": "1536Mi"}, "waiting", ""),  # not seen yet
        ([], {"cpu": "1500m", "memory": "1Gi"}, "waiting", ""),  # memory not yet
        ([], {"cpu": "1.5", "memory": "1536Mi"}, "applied", ""),
        ([{"type": "PodResizeInProgress"}], {"cpu": "1500m", "memory": "1536Mi"}, "waiting", ""),
        (
            [{"type": "PodResizePending", "reason": "Deferred", "message": "no room"}],
            {"cpu": "250m", "memory": "1536Mi"},
            "waiting",
            "Deferred: no room",
        ),
        (
            [{"type": "PodResizePending", "reason": "Infeasible", "message": "too big"}],
            {"cpu": "250m", "memory": "1536Mi"},
            "refused",
            "Infeasible: too big",
        ),
        (
            [{"type": "PodResizeInProgress", "reason": "Error", "message": "below usage"}],
            {"cpu": "250m", "memory": "1536Mi"},
            "refused",
            "Error: below usage",
        ),
    ],
)
def test_resize_progress_reads_the_kubelets_conditions_and_the_actual_resources(
    conditions: list[dict[str, Any]], limits: dict[str, str], state: str, message: str
) -> None:
    target = PodSpec(**{**_fields(spec("worker")), "cpu": 1.5})
    progress = resize_progress(_resizing(conditions, limits), target)
    assert (progress.state, progress.message) == (state, message)


def test_env_values_are_only_secret_references() -> None:
    body = pod(spec("ps", OMP_WAIT_POLICY="PASSIVE"))
    assert SECRET not in json.dumps(body)
    env = {e["name"]: e for e in body["spec"]["containers"][0]["env"]}
    ref = env["DLROVER_KFP_SECRET"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "ctr-env", "key": "dlrover-kfp-secret-0"}
    with pytest.raises(ValueError, match="no Secret key"):
        render_pod(
            spec("ps"),
            namespace="ml",
            image="i",
            labels={},
            secret_name="s",
            secret_keys={},
        )


def test_the_secret_holds_the_values_and_redacts_for_display() -> None:
    s = spec("ps")
    data = secret_keys(s.env, {})[1]
    body = render_secret("ctr-env", "ml", data, {"job": "ctr"}, OwnerRef("master", "u-1"))
    assert body["type"] == "Opaque"
    assert SECRET not in json.dumps(body)  # base64, as the API wants it
    assert SECRET not in json.dumps(redacted(body))
    assert set(redacted(body)["data"].values()) == {"***"}
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_ps_gets_an_in_memory_shm_and_every_pod_the_runs_volume() -> None:
    ps = pod(spec("ps"), volume=Volume("runs", "/var/lib/dlrover-kfp"))
    volumes = {v["name"]: v for v in ps["spec"]["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1536Mi"}
    assert volumes["runs"]["persistentVolumeClaim"] == {"claimName": "runs"}
    mounts = {m["name"]: m["mountPath"] for m in ps["spec"]["containers"][0]["volumeMounts"]}
    assert mounts == {"shm": "/dev/shm", "runs": "/var/lib/dlrover-kfp"}
    worker = pod(spec("worker"))
    assert "volumes" not in worker["spec"]


def test_owner_reference_makes_the_master_own_its_pods() -> None:
    body = pod(spec("worker"), owner=OwnerRef("master-abc", "uid-9"))
    (ref,) = body["metadata"]["ownerReferences"]
    assert ref == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "master-abc",
        "uid": "uid-9",
    }


def obj(
    phase: str,
    *,
    terminated: dict[str, Any] | None = None,
    last: dict[str, Any] | None = None,
    reason: str | None = None,
    conditions: list[dict[str, Any]] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    cs: dict[str, Any] = {"name": "ps", "state": {}, "lastState": {}}
    if terminated is not None:
        cs["state"] = {"terminated": terminated}
    if last is not None:
        cs["lastState"] = {"terminated": last}
    meta: dict[str, Any] = {"name": "ctr-ps-1", "labels": {"role": "ps", "index": "1"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-24T05:00:00Z"
    status: dict[str, Any] = {
        "phase": phase,
        "startTime": "2026-11-24T04:59:00Z",
        "containerStatuses": [cs],
    }
    if reason:
        status["reason"] = reason
    if conditions:
        status["conditions"] = conditions
    return {"metadata": meta, "status": status}


END = "2026-11-24T05:01:00Z"


@pytest.mark.parametrize(
    ("pod_object", "phase", "reason", "code"),
    [
        (obj("Pending"), PodPhase.PENDING, None, None),
        (obj("Running"), PodPhase.RUNNING, None, None),
        (obj("Succeeded", terminated={"exitCode": 0, "reason": "Completed", "finishedAt": END}),
         PodPhase.SUCCEEDED, "Completed", 0),
        (obj("Failed", terminated={"exitCode": 3, "reason": "Error", "finishedAt": END}),
         PodPhase.FAILED, "Error", 3),
        (obj("Failed", terminated={"exitCode": 137, "reason": "OOMKilled", "finishedAt": END}),
         PodPhase.FAILED, "OOMKilled", 137),
        # a container restarted in place keeps its last end in lastState
        (obj("Failed", last={"exitCode": 137, "reason": "OOMKilled", "finishedAt": END}),
         PodPhase.FAILED, "OOMKilled", 137),
        (obj("Failed", terminated={"exitCode": 128, "reason": "StartError", "finishedAt": END}),
         PodPhase.FAILED, "StartError", 128),
        # the kubelet's eviction: the pod's own reason
        (obj("Failed", reason="Evicted", terminated={"exitCode": 137, "reason": "Error"}),
         PodPhase.FAILED, "Evicted", 137),
        (obj("Failed", terminated={"exitCode": 143, "reason": "Error"},
             conditions=[{"type": "DisruptionTarget", "status": "True",
                          "reason": "EvictionByEvictionAPI"}]),
         PodPhase.FAILED, "Evicted", 143),
        (obj("Failed", terminated={"exitCode": 143, "reason": "Error"},
             conditions=[{"type": "DisruptionTarget", "status": "True",
                          "reason": "PreemptionByScheduler"}]),
         PodPhase.FAILED, "Preempted", 143),
        (obj("Failed", terminated={"exitCode": 137, "reason": "Error"},
             conditions=[{"type": "DisruptionTarget", "status": "True",
                          "reason": "DeletionByTaintManager"}]),
         PodPhase.FAILED, "NodeLost", 137),
        # a condition that is not True does not count
        (obj("Failed", terminated={"exitCode": 1, "reason": "Error"},
             conditions=[{"type": "DisruptionTarget", "status": "False",
                          "reason": "PreemptionByScheduler"}]),
         PodPhase.FAILED, "Error", 1),
        # someone deleted it (kubectl delete): SIGTERM's 143 is not the pod's own failure
        (obj("Failed", terminated={"exitCode": 143, "reason": "Error"}, deleting=True),
         PodPhase.FAILED, "Deleted", 143),
    ],
)  # fmt: skip
def test_pod_status_reads_the_cause(
    pod_object: dict[str, Any], phase: PodPhase, reason: str | None, code: int | None
) -> None:
    st = pod_status(pod_object)
    assert (st.phase, st.reason, st.exit_code) == (phase, reason, code)
    assert (st.name, st.role, st.index) == ("ctr-ps-1", "ps", 1)
    if END in json.dumps(pod_object):
        assert st.finished_at is not None and st.finished_at > (st.started_at or 0)


def test_a_pod_gone_while_running_was_deleted_or_disrupted() -> None:
    assert pod_status(obj("Running"), gone=True).reason == "Deleted"
    lost = obj(
        "Running",
        conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}],
    )
    assert pod_status(lost, gone=True).reason == "NodeLost"
    # deleted by the backend itself: Deleted whatever the exit code
    done = obj("Succeeded", terminated={"exitCode": 0, "reason": "Completed"})
    st = pod_status(done, gone=True, deleted_by_us=True)
    assert (st.phase, st.reason) == (PodPhase.FAILED, "Deleted")


def test_a_pending_pod_says_why_the_scheduler_left_it_unplaced() -> None:
    why = "0/2 nodes are available: 2 Insufficient cpu."
    unplaced = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": why}  # fmt: skip
    st = pod_status(obj("Pending", conditions=[unplaced]))
    assert (st.phase, st.reason, st.message) == (PodPhase.PENDING, None, why)
    # placed (the condition True), or waiting for another reason: nothing to say
    placed = {**unplaced, "status": "True", "reason": None, "message": None}
    assert pod_status(obj("Pending", conditions=[placed])).message is None
    gated = {**unplaced, "reason": "SchedulingGated"}
    assert pod_status(obj("Pending", conditions=[gated])).message is None
    # a failed pod's message stays its own last error line, not the scheduler's
    ended = obj("Failed", terminated={"exitCode": 1, "reason": "Error", "message": "OSError: boom"},
                conditions=[unplaced])  # fmt: skip
    assert pod_status(ended).message == "OSError: boom"


def test_secret_keys_are_per_distinct_value_and_reveal_nothing() -> None:
    known: dict[tuple[str, str], str] = {}
    a, new_a = secret_keys({"TOKEN": "v1", "MODE": "x"}, known)
    b, new_b = secret_keys({"TOKEN": "v1", "MODE": "x"}, known)
    c, new_c = secret_keys({"TOKEN": "v2"}, known)
    assert a == b and new_b == {}
    assert a["TOKEN"] == "token-0" and c["TOKEN"] == "token-1" and new_c == {"token-1": "v2"}
    assert set(new_a.values()) == {"v1", "x"}
    assert all("v1" not in k and "v2" not in k for k in (*a.values(), *c.values()))


def test_label_values_and_names_are_made_valid_and_stay_distinct() -> None:
    assert label_value("ctr-20261124T050316") == "ctr-20261124T050316"
    long = "x" * 80
    assert len(label_value(long)) <= 63 and label_value(long) != label_value(long + "y")
    assert label_value("a b/c") != label_value("a-b-c")
    assert dns_name("ctr-20261124T050316") != "ctr-20261124T050316"
    assert dns_name("ctr-20261124T050316").startswith("ctr-20261124t050316-")
    assert dns_name("ok-name") == "ok-name"


# -- validated against Kubernetes' own schemas ------------------------------------------------


def validate(doc: dict[str, Any]) -> None:
    """Strict (unknown fields fail) against the Kubernetes 1.30 schemas."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    try:
        kubernetes_validate.validate(doc, "1.30", strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(p) for p in error.path)
        raise AssertionError(f"{doc['kind']} {where}: {error.message}") from None


def test_rendered_manifests_are_valid_kubernetes_1_30() -> None:
    validate(pod(spec("worker")))
    validate(pod(spec("ps"), volume=Volume("runs", "/runs"), owner=OwnerRef("m", "u")))
    s = spec("ps")
    validate(render_secret("ctr-env", "ml", secret_keys(s.env, {})[1], {"job": "ctr"}))
    broken = pod(spec("worker"))
    broken["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(AssertionError, match="imagePullPolcy"):
        validate(broken)


def test_dry_run_prints_valid_manifests_without_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    key = bytes(range(32))
    monkeypatch.setattr("dlrover_kfp.runtime.kube.new_secret", lambda: key)
    code = cli_main(
        [
            "run",
            "--job",
            str(EXAMPLES / "ctr-local.yaml"),
            "--backend",
            "kubernetes",
            "--namespace",
            "ml",
            "--image",
            "dlrover-kfp:0.1.0",
            "--claim",
            "runs",
            "--output-dir",
            "/var/lib/dlrover-kfp/run",
            "--dry-run",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert secret_to_env(key) not in out and key.hex() not in out
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert docs[0]["kind"] == "Secret"
    assert {d["kind"] for d in docs[1:]} == {"Pod"}
    assert set(docs[0]["data"].values()) == {"***"}
    for d in docs:
        validate(d)
    roles = sorted(d["metadata"]["labels"]["role"] for d in docs[1:])
    assert roles == ["ps", "worker"]  # examples/ctr-local.yaml: 1 PS, 1 worker
    assert all(d["spec"]["containers"][0]["command"][0] == "python" for d in docs[1:])
