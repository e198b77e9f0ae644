"""The elastic runtime on the Kubernetes backend, unchanged: the official client against the fake
API server (tests/fakes/kube_apiserver.py), whose fake kubelet runs every pod as a real
trainer process with its CPU and memory limits. Exact sample counts, and the events in the
profile, as on the local backend (tests/integration/test_elastic_run.py)."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dlrover_kfp.backends.k8s_objects import KubernetesSettings, RetryPolicy
from dlrover_kfp.backends.kubernetes import KubernetesBackend, load_client
from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.plan import ResourcePlan, Stage
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.runtime.elastic import ElasticPolicy, elastic_run
from dlrover_kfp.runtime.job import JobRun, RunResult
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.training.wire import secret_to_env
from tests.fakes.kube_apiserver import FakeApiServer
from tests.fakes.kubelet import FakeKubelet
from tests.integration.test_elastic_run import PLANNER, QUIET, _spec, _trained_rows
from tests.integration.test_master_restart import (
    JOB,
    kill_after_two_checkpoints,
    resume_after_the_pods_stop,
)

NAMESPACE = "default"

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/cmdline").exists(), reason="finds the pods' processes in /proc (Linux)"
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeApiServer, FakeKubelet]]:
    with (
        FakeApiServer() as api,
        FakeKubelet(api, log_dir=tmp_path / "kubelet", metrics_interval_s=1.0) as kubelet,
    ):
        yield api, kubelet


During = Callable[[JobRun[ElasticPolicy], FakeApiServer, FakeKubelet], None]


def _run(
    spec: JobSpec,
    tmp_path: Path,
    cluster: tuple[FakeApiServer, FakeKubelet],
    settings: RunSettings,
    planner: PlannerSettings,
    during: During | None = None,
) -> RunResult:
    api, kubelet = cluster
    client = load_client(str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    kube = KubernetesSettings(
        namespace=NAMESPACE, image="dlrover-kfp:test", retry=RetryPolicy(initial_s=0.1, max_s=2.0)
    )
    plan = ResourcePlan(
        workers=spec.resources.workers.to_group(),  # type: ignore[union-attr]
        ps=spec.resources.ps.to_group(),  # type: ignore[union-attr]
        stage=Stage.MANUAL,
        reason="the user's guess",
    )
    with KubernetesBackend(client, kube, job=spec.name) as backend:
        options = RunOptions(
            output_dir=tmp_path / "out",
            base_dir=tmp_path,
            settings=dataclasses.replace(settings, python="python"),
            planner=planner,
        )
        run = elastic_run(spec, backend, options, plan=plan, progress=lambda line: None)
        if during is not None:
            threading.Thread(target=during, args=(run, api, kubelet), daemon=True).start()
        return run.run()


def _training(run: JobRun[ElasticPolicy], deadline: float) -> None:
    while time.monotonic() < deadline:
        if run.samples and run.samples[-1].throughput > 0:
            return
        time.sleep(0.05)
    raise AssertionError("the job never trained")


# 16-36 s: the chaos suite (tests/chaos) runs these faults on this backend with the same checks;
# kept opt-in to hold the default suite under 10 minutes.
@pytest.mark.long
def test_scale_up_ps_move_worker_sigkill_and_eviction_on_kubernetes(
    tmp_path: Path, cluster: tuple[FakeApiServer, FakeKubelet]
) -> None:
    """From 1 worker x 0.25 + 1 PS x 0.25: Stage 2 grows the job (the PS count changes: the PS
    move live to new pods), then a worker is SIGKILLed and another evicted; every row once."""
    spec = _spec(
        1_500_000, "{count: 1, cpu: 0.25, memory: 2Gi}", "{count: 1, cpu: 0.25, memory: 2Gi}"
    )
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0)
    done: dict[str, str] = {}

    def faults(run: JobRun[ElasticPolicy], api: FakeApiServer, kubelet: FakeKubelet) -> None:
        deadline = time.monotonic() + 240
        # after the first auto-scale step, with the grown shape training
        while time.monotonic() < deadline:
            steps = [p for p in run.policy.plans if p.stage is Stage.AUTO_SCALE]
            last = run.samples[-1] if run.samples else None
            if steps and last and last.time > steps[0].time + 3 and last.throughput > 0:
                break
            time.sleep(0.1)
        pid = kubelet.pid_of("elastic-worker-0")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        done["killed"] = "elastic-worker-0"
        time.sleep(3.0)
        statuses = {s.name: s for s in run.backend.statuses()}
        victim = next((n for n in ("elastic-worker-1", "elastic-worker-0") if n in statuses), None)
        assert victim is not None
        while time.monotonic() < deadline and statuses[victim].phase.value != "Running":
            time.sleep(0.1)
            statuses = {s.name: s for s in run.backend.statuses()}
        kubelet.evict(victim)
        done["evicted"] = victim

    # One growth step to the quota's optimum (no trust region): the faults come after it, and
    # what this test is about is the backend, not how the planner steps (test_elastic_run.py).
    one_step = dataclasses.replace(
        PLANNER, auto_scale=dataclasses.replace(PLANNER.auto_scale, max_job_cpu_growth=100.0)
    )
    result = _run(spec, tmp_path, cluster, settings, one_step, during=faults)
    profile = result.profile
    assert result.succeeded, profile.outcome.reason
    assert done.keys() == {"killed", "evicted"}, done
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    steps = [p for p in profile.plans if p.stage is Stage.AUTO_SCALE]
    assert steps and steps[0].ps.count > 1, profile.plans  # the PS set changed
    moved = [e for e in profile.events if e.kind == "migration"]
    assert moved, profile.events
    failures = [e for e in profile.events if e.kind == "failure"]
    assert any(e.node == "elastic-worker-0" and "137" in e.detail for e in failures), failures
    relaunches = [e for e in profile.events if e.kind == "relaunch"]
    evicted = [e for e in relaunches if e.node == done["evicted"] and "evicted" in e.detail]
    assert evicted and "not counted against the job" in evicted[0].detail, relaunches
    print(
        "\nkubernetes elastic run: "
        + "; ".join(
            f"{e.time:.1f}s {e.kind} {e.node or ''} {e.detail[:70]}" for e in profile.events
        )
    )


# 14 s: the local test runs the same relaunch-bigger scenario; the Kubernetes parts (an OOM
# kill seen in the pod's status) are in the backend's contract suite and its status tests.
@pytest.mark.long
def test_an_oom_killed_worker_is_relaunched_bigger_on_kubernetes(
    tmp_path: Path, cluster: tuple[FakeApiServer, FakeKubelet], caplog: pytest.LogCaptureFixture
) -> None:
    """And the job secret is in no pod object, log line or profile: only in the Secret."""
    caplog.set_level(logging.DEBUG)
    spec = _spec(
        200_000, "{count: 1, cpu: 0.5, memory: 128Mi}", "{count: 1, cpu: 0.5, memory: 2Gi}"
    )
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0)
    seen: dict[str, object] = {}

    def watch_objects(run: JobRun[ElasticPolicy], api: FakeApiServer, kubelet: FakeKubelet) -> None:
        seen["secret"] = secret_to_env(run.secret)
        _training(run, time.monotonic() + 120)
        seen["pods"] = api.list_objects("pods", NAMESPACE)
        seen["secrets"] = api.list_objects("secrets", NAMESPACE)

    result = _run(spec, tmp_path, cluster, settings, QUIET, during=watch_objects)
    profile = result.profile
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    ooms = [e for e in profile.events if e.kind == "oom"]
    assert ooms and ooms[0].node == "elastic-worker-0", profile.events
    relaunches = [e for e in profile.events if e.kind == "relaunch"]
    assert relaunches and "OOM-killed at 128Mi: relaunched with 512Mi" in relaunches[0].detail
    secret = str(seen["secret"])
    (stored,) = seen["secrets"]  # type: ignore[misc]
    assert secret in {base64.b64decode(v).decode() for v in stored["data"].values()}
    assert seen["pods"] and secret not in json.dumps(seen["pods"])
    assert secret not in (tmp_path / "out" / "profile.json").read_text()
    assert secret not in caplog.text
    logs = "".join(p.read_text() for p in (tmp_path / "kubelet").glob("*.log"))
    assert logs and secret not in logs


# 22 s: the backend riding out the same storm, throttle and expired watch is tested in
# tests/backends/test_kubernetes_backend.py (5 s); this is the whole run through it.
@pytest.mark.long
def test_a_run_rides_out_an_api_storm_a_throttle_and_an_expired_watch(
    tmp_path: Path,
    cluster: tuple[FakeApiServer, FakeKubelet],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The API answers 500 for 10 s, then 429 (Retry-After: 1) for 3 s, and the master's watch
    expires (410) with its history compacted: the job finishes, nothing lost, and the retries
    and the relist are in the log."""
    caplog.set_level(logging.WARNING, logger="dlrover_kfp.kubernetes")
    spec = _spec(
        1_200_000, "{count: 2, cpu: 0.5, memory: 2Gi}", "{count: 1, cpu: 0.5, memory: 2Gi}"
    )
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0)
    done: dict[str, float] = {}

    def storm(run: JobRun[ElasticPolicy], api: FakeApiServer, kubelet: FakeKubelet) -> None:
        _training(run, time.monotonic() + 120)
        api.storm(10.0, code=500)
        time.sleep(10.0)
        api.throttle(3.0, retry_after=1)
        time.sleep(3.0)
        api.compact()
        api.expire_watches()
        done["at"] = time.monotonic()

    result = _run(spec, tmp_path, cluster, settings, QUIET, during=storm)
    profile = result.profile
    assert done, "the job ended before the faults were over"
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    messages = [r.getMessage() for r in caplog.records]
    retried_500 = [m for m in messages if "500" in m and "retry" in m]
    retried_429 = [m for m in messages if "429" in m and "retry" in m]
    relists = [m for m in messages if "410" in m and "relisting" in m]
    assert retried_500 and retried_429 and relists, messages
    print(
        f"\nAPI storm: {len(retried_500)} calls retried after 500, {len(retried_429)} after "
        f"429, {len(relists)} relist(s) after 410; e.g. {retried_500[0]!r}"
    )


# 41 s: the local backend's master restart runs in the default suite (test_master_restart.py);
# a new master taking over the job's lease from a killed one is tested in
# tests/backends/test_kubernetes_backend.py.
@pytest.mark.long
def test_a_master_killed_on_kubernetes_resumes_with_the_same_command(
    tmp_path: Path, cluster: tuple[FakeApiServer, FakeKubelet]
) -> None:
    api, _ = cluster
    (tmp_path / "job.yaml").write_text(JOB)
    out = tmp_path / "out"
    config = api.write_kubeconfig(tmp_path / "kubeconfig")
    argv = [sys.executable, "-m", "dlrover_kfp.cli.main", "run", "--job", "job.yaml"]
    argv += ["--output-dir", "out", "--checkpoint-interval", "2", "--sample-interval", "1"]
    argv += ["--backend", "kubernetes", "--namespace", NAMESPACE, "--image", "dlrover-kfp:test"]
    argv += ["--kubeconfig", str(config), "--master-host", "127.0.0.1"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run_file = kill_after_two_checkpoints(argv, tmp_path, env, out)
    pod = api.get_object("pods", NAMESPACE, "restart-ps-0")
    assert pod is not None
    port = int(pod["spec"]["containers"][0]["command"][-1].rsplit(":", 1)[1])
    expected = _trained_rows(parse(JobSpec, load_text(JOB, "test"), "test"), RunSettings())
    resume_after_the_pods_stop(argv, tmp_path, env, port, run_file, expected)
    # the new master replaced the old master's finished pod objects, and cleaned up at the end
    assert api.list_objects("pods", NAMESPACE) == []
    assert api.list_objects("secrets", NAMESPACE) == []


def test_without_a_metrics_api_the_pods_report_their_own_usage(
    tmp_path: Path, cluster: tuple[FakeApiServer, FakeKubelet]
) -> None:
    """No metrics-server: the profile's per-pod CPU and memory come from what each pod
    measures of itself and reports to the master, and they agree with the pods' limits."""
    api, _ = cluster
    api.serve_metrics = False
    spec = _spec(300_000, "{count: 1, cpu: 0.5, memory: 2Gi}", "{count: 1, cpu: 0.5, memory: 2Gi}")
    settings = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=0.0)
    result = _run(spec, tmp_path, cluster, settings, QUIET)
    profile = result.profile
    assert result.succeeded, profile.outcome.reason
    assert profile.outcome.samples_processed == _trained_rows(spec, settings)
    training = [s for s in profile.samples if s.throughput > 0]
    workers = [n for s in training for n in s.nodes if n.role == "worker"]
    ps = [n for s in training for n in s.nodes if n.role == "ps"]
    assert workers and ps, "no self-reported usage in the profile"
    # A busy worker held to half a core by its CFS quota uses about that; unthrottled it would
    # read ~1 on this 2-core machine. It read 0.54-0.66 while a pod took its CPU time before a
    # slow /proc scan and its clock after (training/node.py own_usage); 0.49-0.51 since.
    assert 0.2 < max(n.cpu_used for n in workers) <= 0.5 * 1.1, workers
    assert all(100 < n.memory_used_mb < 2048 for n in workers + ps)
    assert all(n.cpu_requested == 0.5 and n.memory_requested_mb == 2048 for n in workers + ps)
