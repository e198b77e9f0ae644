"""``ElasticTrainOperator(backend="kubernetes")`` against the fake cluster, for real.

The operator submits the job master as a pod; the fake kubelet runs it as a real process (the
command the pod names, with the env the downward API and the Secret give it), and that master
creates the PS and worker pods through the same API server, which the kubelet runs too. The
trigger watches the master pod through the API only (no pid, no shared file) and logs its
lines; the task then reads the profile the pod printed, and the record task stores it. Nothing
of the run is read from the Airflow side's disk: the run's directory is the "claim" the pods
mount (here a directory of this host, as the fake kubelet does not mount volumes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

pytest.importorskip("airflow.sdk", reason="the airflow extra is not installed")
pytest.importorskip("kubernetes", reason="the kubernetes extra is not installed")

from airflow.sdk.exceptions import TaskDeferred

from airflow_plugin import cancel as airflow_cancel
from airflow_plugin.operators import ElasticTrainOperator, RecordProfileOperator
from airflow_plugin.triggers import KubernetesTrainTrigger
from dlrover_kfp.history import open_history
from tests.airflow.jobs import tiny_job
from tests.fakes.kube_apiserver import FakeApiServer
from tests.fakes.kubelet import FakeKubelet

NAMESPACE = "default"
IMAGE = "registry.example/dlrover-kfp:test"
JOB = tiny_job("dlrm-kube", "dlrm-airflow-kube")


class _Cluster:
    def __init__(self, api: FakeApiServer, kubeconfig: Path, claim: Path) -> None:
        self.api = api
        self.kubeconfig = kubeconfig
        self.claim = claim


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Cluster]:
    with FakeApiServer() as api, FakeKubelet(api, log_dir=tmp_path / "kubelet"):
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        # The fake kubelet's pods inherit this process's environment: the master pod reaches
        # the fake API server through it, as a real one would through its service account.
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.setenv("DLROVER_KFP_RUNS_DIR", str(tmp_path / "worker-runs"))
        yield _Cluster(api, kubeconfig, tmp_path / "claim")


def _context() -> dict[str, Any]:
    ti = mock.MagicMock(dag_id="dlrm_kube", task_id="train", map_index=-1)
    return {"ti": ti, "run_id": "scheduled__2026-11-20T00:00:00+00:00", "ds": "2026-11-20",
            "ds_nodash": "20261120"}  # fmt: skip


def _operator(cluster: _Cluster, history: str, **kw: Any) -> ElasticTrainOperator:
    kw.setdefault("job_spec", JOB)
    return ElasticTrainOperator(
        task_id="train",
        backend="kubernetes",
        history_conn_id=None,
        history_url=history,
        poll_interval=0.5,
        deferrable=True,
        sample_interval=1.0,
        kubernetes={
            "namespace": NAMESPACE,
            "image": IMAGE,
            "claim": "dlrover-kfp-runs",
            "mount_path": str(cluster.claim),
            "kubeconfig": str(cluster.kubeconfig),
            "master_cpu": "1",
        },
        **kw,
    )


def _defer(operator: ElasticTrainOperator, context: dict[str, Any]) -> KubernetesTrainTrigger:
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(context)  # type: ignore[arg-type]
    trigger = deferred.value.trigger
    assert isinstance(trigger, KubernetesTrainTrigger)
    return trigger


async def _first(trigger: KubernetesTrainTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        payload: dict[str, Any] = event.payload
        return payload
    raise AssertionError("no event")


def test_the_master_runs_as_a_pod_watched_through_the_api(
    cluster: _Cluster, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    history = f"sqlite:///{tmp_path}/history.db"
    context = _context()
    trigger = _defer(_operator(cluster, history), context)

    # The master is a pod: the downward API, the history URL from a Secret the pod owns.
    pod = cluster.api.get_object("pods", NAMESPACE, trigger.pod)
    assert pod is not None and pod["metadata"]["uid"] == trigger.uid
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["DLROVER_KFP_HISTORY_URL"]["valueFrom"]["secretKeyRef"]["key"] == "url"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert history not in str(pod)  # the URL is in the Secret only
    secret = cluster.api.get_object(
        "secrets", NAMESPACE, f"{trigger.pod[: -len('-master')]}-history"
    )
    assert secret is not None
    assert secret["metadata"]["ownerReferences"][0]["uid"] == trigger.uid
    # the trigger carries names, never a pid or a host
    assert set(trigger.serialize()[1]) == {
        "namespace", "pod", "uid", "kubeconfig", "context", "poll_interval", "deadline"
    }  # fmt: skip

    # Cleared or retried while the master pod runs: the task waits for that pod again.
    again = _defer(_operator(cluster, history), _context())
    assert (again.pod, again.uid) == (trigger.pod, trigger.uid)
    created = [c.name for c in cluster.api.calls if c.verb == "create" and c.resource == "pods"]
    assert [name for name in created if name.endswith("-master")] == [trigger.pod]

    capfd.readouterr()
    started = time.monotonic()
    event = asyncio.run(_first(trigger))
    waited = time.monotonic() - started
    assert event["status"] == "success", event
    # the trigger's log (Airflow's structlog: the task's log in a triggerer) shows the lines
    streamed = [line for line in capfd.readouterr().out.splitlines() if "[master]" in line]
    # the master's own progress lines, as it wrote them, in the trigger's (the task's) log
    assert any("created pod dlrm-kube-ps-0" in line for line in streamed), streamed[-20:]
    assert any("samples/s" in line for line in streamed), streamed[-20:]
    assert not any("DLROVER_KFP_PROFILE" in line for line in streamed)
    # the master created its PS and worker as pods of the same cluster, owned by its pod
    run_pods = [p for p in cluster.api.calls if p.verb == "create" and p.resource == "pods"]
    assert len(run_pods) >= 3, run_pods

    summary = _operator(cluster, history).execute_complete(context, event)  # type: ignore[arg-type]
    assert summary["outcome"]["status"] == "succeeded"
    pushed = {c.kwargs["key"]: c.kwargs["value"] for c in context["ti"].xcom_push.call_args_list}
    profile = pushed["profile"]
    assert profile["run_id"].startswith("dlrm-kube-20261120-")
    assert profile["outcome"]["samples_processed"] > 0
    # the ended master pod is deleted, and its Secret goes with it (owner reference)
    deadline = time.monotonic() + 10
    while cluster.api.get_object("pods", NAMESPACE, trigger.pod) is not None:
        assert time.monotonic() < deadline, "the ended master pod was not deleted"
        time.sleep(0.2)

    # the record task stores the document it got by XCom: no path of the train worker's disk
    record = RecordProfileOperator(
        task_id="record", profile=profile, history_conn_id=None, history_url=history
    )
    assert record.execute({}) == profile["run_id"]  # type: ignore[arg-type]
    with open_history(history) as store:
        assert [s.run_id for s in store.list()] == [profile["run_id"]]
    print(f"\nkubernetes master pod: trained and ended in {waited:.1f}s; {len(streamed)} log lines")


@pytest.mark.long
def test_marking_the_task_failed_stops_the_master_pod_and_records_a_cancel(
    cluster: _Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = f"sqlite:///{tmp_path}/history.db"
    big = JOB.replace("rows: 8000", "rows: 400000")
    operator = _operator(cluster, history, job_spec=big)
    trigger = _defer(operator, _context())
    trigger.task_instance = mock.MagicMock(  # what the triggerer sets
        dag_id="dlrm_kube", task_id="train", run_id="r", map_index=-1
    )
    monkeypatch.setattr(airflow_cancel, "_read_state", lambda ti: "failed")

    async def wait_then_kill() -> float:
        watch = asyncio.ensure_future(_first(trigger))
        deadline = time.monotonic() + 120
        while not any(
            p["metadata"]["name"].endswith("worker-0")
            and (p.get("status") or {}).get("phase") == "Running"
            for p in cluster.api.list_objects("pods", NAMESPACE)
        ):
            assert time.monotonic() < deadline, "training never started"
            await asyncio.sleep(0.5)
        watch.cancel()
        started = time.monotonic()
        await trigger.on_kill()
        return time.monotonic() - started

    stopped_in = asyncio.run(wait_then_kill())
    assert cluster.api.list_objects("pods", NAMESPACE) == []
    with open_history(history) as store:
        (summary,) = store.list()
        profile = store.get(summary.run_id)
    assert profile.outcome.status == "cancelled"
    assert "marked failed by a user" in profile.outcome.reason
    print(f"\ncancelled on kubernetes: every pod gone in {stopped_in:.1f}s")
