"""Operators for the three steps of scheduled retraining: plan, train, record.

Thin over :mod:`dlrover_kfp.steps`, so that a DAG does what ``dlrover-kfp plan``, ``run``
and ``record`` do:

- :class:`PlanResourcesOperator`: Stage 1's plan from the history (warm start from similar
  runs, else a cold start). XCom ``return_value``: the plan as a JSON document (a dict).
- :class:`ElasticTrainOperator`: validates the job spec, starts the job master as a process
  of its own and defers to :class:`~airflow_plugin.triggers.ElasticTrainTrigger` until it
  ends; then reads the profile and writes the run report. XComs ``run_id``, ``profile`` (its
  path), ``report`` (the report's path, when drawn) and ``return_value`` (a summary).
- :class:`RecordProfileOperator`: the profile into the history store. XCom ``return_value``:
  the run id.
- :class:`PublishModelOperator`: the publish gate: the trained model to its published
  location unless its held-out AUC is worse than the served one's (refused: the task is
  skipped).

Errors keep their retry meaning: a bad job spec or plan, a failed run, a history that is not
one (:class:`~dlrover_kfp.errors.PermanentError`) fail the task without retries
(``AirflowFailException``); a locked or unreachable history and a killed master
(:class:`~dlrover_kfp.errors.TransientError`) fail it for Airflow's retries. A bad spec fails
before anything is written anywhere.

The history store: ``history_url`` when given, else the connection ``history_conn_id``
(default ``dlrover_kfp_history``) when it is configured, else ``$DLROVER_KFP_HISTORY_URL``,
else the default SQLite file (:func:`airflow_plugin.hooks.resolve_history_url`).

The steps (the planner: scipy) and the report (matplotlib) are imported inside ``execute``:
DAG files import this module every time they are parsed, and parsing should not pay for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from airflow.sdk import BaseOperator, conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from airflow_plugin.data import DataLocation, resolve_data_location
from airflow_plugin.hooks import DEFAULT_CONN_ID, describe_history_url, resolve_history_url
from airflow_plugin.links import REPORT_XCOM_KEY, RunReportLink
from airflow_plugin.runs import (
    JOB_FILE,
    MASTER_EXIT,
    MASTER_FILE,
    MASTER_LOG,
    PLAN_FILE,
    PROFILE_FILE,
    REPORT_FILE,
    default_output_dir,
    runs_dir,
    task_dir,
)
from airflow_plugin.triggers import (
    ElasticTrainTrigger,
    KubernetesTrainTrigger,
    master_alive,
    process_create_time,
    terminate_master,
)
from dlrover_kfp.errors import (
    EXIT_TRANSIENT,
    EXIT_USER_ERROR,
    PermanentError,
    TransientError,
    UserInputError,
)
from dlrover_kfp.files import write_atomic
from dlrover_kfp.history import ENV_VAR
from dlrover_kfp.steps.cancel import CANCEL_FILE, request_cancel
from dlrover_kfp.steps.documents import (
    JobProfile,
    ResourcePlan,
    plan_from_document,
    profile_from_document,
    standalone_spec_yaml,
    to_dict,
    to_json,
)
from dlrover_kfp.steps.image import check_image
from dlrover_kfp.steps.run_ids import stable_run_id

if TYPE_CHECKING:
    from airflow.sdk import Context

    from dlrover_kfp.steps.spec import LoadedSpec

#: The train operator's Kubernetes options (``kubernetes={...}``): where and how the master pod
#: runs. ``kubeconfig`` and ``context`` are the operator's and trigger's own access to the API
#: (default: in-cluster, else ``$KUBECONFIG``); the master pod uses its service account.
KUBE_OPTIONS: Final = (
    "namespace",
    "image",
    "claim",
    "mount_path",
    "service_account",
    "master_cpu",
    "master_memory",
    "kubeconfig",
    "context",
)
_MOUNT_PATH: Final = "/var/lib/dlrover-kfp"


@contextlib.contextmanager
def task_errors() -> Iterator[None]:
    """Turn the library's errors into Airflow's: permanent ones are not retried."""
    try:
        yield
    except PermanentError as exc:
        raise AirflowFailException(str(exc)) from None
    except TransientError as exc:
        raise AirflowException(f"temporary failure, a retry may succeed: {exc}") from exc


class _HistoryMixin:
    """The history-store parameters every operator shares."""

    history_conn_id: str | None
    history_url: str | None

    def _history(self, log: Any) -> str:
        url, source = resolve_history_url(conn_id=self.history_conn_id, url=self.history_url)
        log.info("history store: %s (from %s)", describe_history_url(url), source)
        return url


class _DataMixin:
    """The data-location parameters of the plan and train operators (:mod:`airflow_plugin.data`)."""

    data_path: str | None
    data_conn_id: str | None
    log: Any

    def _data_location(self, loaded: LoadedSpec) -> tuple[LoadedSpec, DataLocation | None]:
        """The spec with ``data_path`` for its data path, and the credentials to read it."""
        from dlrover_kfp.steps.spec import with_data_path  # noqa: PLC0415 - as above

        path = (self.data_path or "").strip()
        conn_id = (self.data_conn_id or "").strip() or None
        if not path and conn_id is None:
            return loaded, None
        if path:
            data = resolve_data_location(path, conn_id)
            loaded = with_data_path(loaded, data.url, "data_path")
        else:
            spec_path = getattr(loaded.spec.data, "path", None)
            if spec_path is None:
                raise UserInputError(
                    f"data_conn_id: {conn_id!r} given, but the job spec's data is synthetic "
                    "(it reads no files)"
                )
            data = resolve_data_location(spec_path, conn_id)
        self.log.info("data: %s", data.describe())
        return loaded, data


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in this process's environment while the block runs (the plan reads the
    data's metadata here, with the connection's credentials), then as they were."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class PlanResourcesOperator(_DataMixin, _HistoryMixin, BaseOperator):
    """Stage 1's resource plan for a job: a warm start from similar runs in the history, else
    the spec's own resources (a cold start). Reads the history, writes nothing.

    :param job_spec: a path to the job spec (YAML or JSON), or the YAML document (templated).
    :param backend: ``local`` (pods as processes of the worker) or ``kubernetes``: what the
        plan is for (templated).
    :param history_conn_id: the connection of the history store, used when it is configured.
    :param history_url: a SQLAlchemy URL or SQLite path that overrides the connection
        (templated).
    :param data_path: the data the run will train on, as the train operator's (templated):
        the plan sizes it (a Parquet file's footer states its rows).
    :param data_conn_id: as the train operator's (templated); its credentials are this task's
        environment while it reads the data's metadata.

    XCom ``return_value``: the plan (``dlrover-kfp schema plan``) as a dict.
    """

    template_fields: Sequence[str] = (
        "job_spec",
        "backend",
        "history_url",
        "data_path",
        "data_conn_id",
    )
    ui_color = "#e8f0fe"

    def __init__(
        self,
        *,
        job_spec: str,
        backend: str = "local",
        history_conn_id: str | None = DEFAULT_CONN_ID,
        history_url: str | None = None,
        data_path: str | None = None,
        data_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_spec = job_spec
        self.backend = backend
        self.history_conn_id = history_conn_id
        self.history_url = history_url
        self.data_path = data_path
        self.data_conn_id = data_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from dlrover_kfp.steps.plan import plan_step  # noqa: PLC0415 - scipy: not at parse time
        from dlrover_kfp.steps.spec import load_job_spec  # noqa: PLC0415 - as above

        with task_errors():
            _, data = self._data_location(load_job_spec(self.job_spec))
            url = self._history(self.log)
            with _environment(data.environment if data is not None else {}):
                result = plan_step(
                    self.job_spec,
                    url,
                    self.backend,
                    data_path=data.url if data is not None and self.data_path else "",
                )
        self.log.info("%s", result.markdown)
        return to_dict(result.plan)


class RecordProfileOperator(_HistoryMixin, BaseOperator):
    """Record a run's profile in the history store, for the next runs' warm start. The run
    replaces an earlier attempt of the same run (a re-run keeps its run id); recording the same
    profile again (a retried task) changes nothing.

    :param profile: the run's profile: the train task's XCom ``profile`` (the document; in a
        DAG ``train.output["profile"]``, which works whatever worker ran train), its JSON text,
        or the path of a ``profile.json`` on this worker (templated).
    :param history_conn_id: the connection of the history store, used when it is configured.
    :param history_url: a SQLAlchemy URL or SQLite path that overrides it (templated).

    XCom ``return_value``: the run id.
    """

    template_fields: Sequence[str] = ("profile", "history_url")
    ui_color = "#e6f4ea"

    def __init__(
        self,
        *,
        profile: str | Mapping[str, Any],
        history_conn_id: str | None = DEFAULT_CONN_ID,
        history_url: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.profile = profile
        self.history_conn_id = history_conn_id
        self.history_url = history_url

    def execute(self, context: Context) -> str:
        from dlrover_kfp.steps.record import record_step  # noqa: PLC0415 - as above

        with task_errors():
            profile = profile_from_document(self.profile)
            url = self._history(self.log)
            result = record_step(profile, url)
        self.log.info("%s", result.markdown)
        return result.run_id


class ElasticTrainOperator(_DataMixin, _HistoryMixin, BaseOperator):
    """Train a job elastically to the end, from a plan, without holding a worker slot.

    The operator validates the job spec and the plan (a bad one fails the task, nothing is
    written), writes them to the run's output directory, starts the job master
    (``dlrover-kfp run --no-record``) as a process of its own session and defers to
    :class:`~airflow_plugin.triggers.ElasticTrainTrigger`. When the master ends the task
    resumes: it reads the profile, pushes its XComs, writes ``report.html`` and fails when the
    run failed. The master reads the history (the plan's similar jobs) and records a run that
    failed; a run that succeeded is the record operator's to record.

    With the local backend the master, its PS and its workers are processes of the worker's
    machine, so the triggerer must run there too (``airflow standalone``, LocalExecutor). A
    retried task uses the same output directory: a run whose master was killed resumes from
    its last checkpoint.

    :param job_spec: a path to the job spec, or the YAML document (templated).
    :param plan: the plan to start from: the plan operator's output (``plan_task.output``), a
        dict or its JSON text; None lets the master plan the start itself (templated).
    :param output_dir: the run's directory (templated); default
        ``$DLROVER_KFP_RUNS_DIR/<dag_id>/<logical date>/<task_id>``.
    :param backend: ``local`` or ``kubernetes`` (templated). With ``kubernetes`` the job master
        is a pod of the cluster (:mod:`airflow_plugin.kube`) that creates the PS and workers as
        pods; the trigger watches it through the API and streams its log into the task log.
    :param history_conn_id: the connection of the history store, used when it is configured.
    :param history_url: a SQLAlchemy URL or SQLite path that overrides it (templated).
    :param poll_interval: seconds between the trigger's looks at the master.
    :param timeout: seconds after which the wait fails and the job is stopped (None: none).
    :param deferrable: wait in the triggerer; False waits in the worker. Default: Airflow's
        ``[operators] default_deferrable`` (False unless configured), as Airflow's providers do.
    :param checkpoint_interval: seconds between the run's flash checkpoints.
    :param sample_interval: seconds between its runtime samples.
    :param data_path: where the run reads its data, replacing the job spec's ``data.path``
        (templated: ``s3://clicks/{{ ds }}/`` for each day's partition): a path or glob, a
        directory of files, or an object-storage URL; ``s3://CONN_ID@bucket/...`` names the
        Airflow connection of its credentials, as ``ObjectStoragePath`` does
        (:mod:`airflow_plugin.data`). The spec's data format must read files (not synthetic).
    :param data_conn_id: an ``aws`` connection whose credentials read the data (templated);
        they become the job master's ``AWS_*`` environment (local backend only), never part of
        the spec or a log line.
    :param kubernetes: with ``backend="kubernetes"``: ``namespace``, ``image`` (the project's,
        fully qualified) and ``claim`` (a ReadWriteMany PersistentVolumeClaim the master and its
        pods mount at ``mount_path``, default /var/lib/dlrover-kfp) are required;
        ``service_account`` (with deploy/rbac.yaml's Role), ``master_cpu`` / ``master_memory``
        (default 1 / 1Gi), ``kubeconfig`` / ``context`` (the operator's own API access).
    """

    template_fields: Sequence[str] = (
        "job_spec",
        "plan",
        "output_dir",
        "backend",
        "history_url",
        "data_path",
        "data_conn_id",
    )
    operator_extra_links = (RunReportLink(),)
    ui_color = "#fef7e0"

    def __init__(
        self,
        *,
        job_spec: str,
        plan: dict[str, Any] | str | None = None,
        output_dir: str | None = None,
        backend: str = "local",
        history_conn_id: str | None = DEFAULT_CONN_ID,
        history_url: str | None = None,
        poll_interval: float = 5.0,
        timeout: float | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        checkpoint_interval: float = 60.0,
        sample_interval: float = 2.0,
        kubernetes: Mapping[str, str] | None = None,
        data_path: str | None = None,
        data_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        unknown = sorted(set(kubernetes or {}) - set(KUBE_OPTIONS))
        if unknown:
            raise ValueError(
                f"kubernetes: unknown option(s) {', '.join(unknown)}; expected some of "
                f"{', '.join(KUBE_OPTIONS)}"
            )
        if poll_interval <= 0:
            raise ValueError(f"poll_interval: {poll_interval}; must be positive")
        self.job_spec = job_spec
        self.plan = plan
        self.output_dir = output_dir
        self.backend = backend
        self.history_conn_id = history_conn_id
        self.history_url = history_url
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.deferrable = deferrable
        self.checkpoint_interval = checkpoint_interval
        self.sample_interval = sample_interval
        self.kubernetes = dict(kubernetes or {})
        self.data_path = data_path
        self.data_conn_id = data_conn_id
        #: the run report's path, once written (RunReportLink reads it)
        self.report_path: str | None = None
        self._trigger: ElasticTrainTrigger | KubernetesTrainTrigger | None = None

    # ---- before the run ----------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        with task_errors():
            loaded, plan = self._validated()
            loaded, data = self._data_location(loaded)
            if data is not None and data.environment and self.backend == "kubernetes":
                raise UserInputError(
                    f"data_conn_id: {data.conn_id!r}: a connection's credentials reach the job "
                    "master's processes only with backend local; give a Kubernetes run's pods "
                    "theirs through their service account (an IAM role) or its environment"
                )
            url = self._history(self.log)
        if self.backend == "kubernetes":
            with task_errors():
                pod_trigger = self._master_pod(context, loaded, plan, url)
            return self._wait(context, pod_trigger)
        run_dir = Path(self.output_dir) if self.output_dir else default_output_dir(context)
        self.log.info("run directory: %s", run_dir)
        trigger = self._running_master(run_dir)
        if trigger is None:
            spec_path, plan_path = self._write_inputs(run_dir, loaded, plan)
            run_id = task_run_id(context, loaded.spec.name)
            self.log.info("run id: %s (the same for every attempt of this task)", run_id)
            env = data.environment if data is not None else {}
            trigger = self._submit(run_dir, spec_path, plan_path, url, run_id, env)
        return self._wait(context, trigger)

    def _wait(
        self, context: Context, trigger: ElasticTrainTrigger | KubernetesTrainTrigger
    ) -> dict[str, Any]:
        if self.deferrable:
            self.defer(trigger=trigger, method_name="execute_complete")
        self._trigger = trigger
        event = asyncio.run(_first_event(trigger))
        self._trigger = None
        return self.execute_complete(context, event)

    def _master_pod(
        self, context: Context, loaded: LoadedSpec, plan: ResourcePlan | None, url: str
    ) -> KubernetesTrainTrigger:
        """The master pod of this task's run: the one still running from an earlier attempt
        (a cleared or retried task waits for it again), else a new one, which resumes the run
        from its last checkpoint on the claim when an earlier attempt's master was killed."""
        from airflow_plugin.kube import MasterPods, MasterPodSpec, load_api  # noqa: PLC0415

        opts = self.kubernetes
        run_id = task_run_id(context, loaded.spec.name)
        name = f"{run_id}-master"
        mount = opts.get("mount_path") or _MOUNT_PATH
        pods = MasterPods(load_api(opts.get("kubeconfig"), opts.get("context")), opts["namespace"])
        found = pods.read(name)
        if found is not None:
            uid = str(found["metadata"]["uid"])
            if not pods.state(name, uid).ended:
                self.log.warning(
                    "the job master pod %s of an earlier attempt is still running: waiting for "
                    "it instead of starting another (this attempt's job spec and plan are not "
                    "used)",
                    name,
                )
                return self._pod_trigger(name, uid)
            self.log.info("deleting the ended master pod %s of an earlier attempt", name)
            pods.delete(name, uid, grace_s=0)
            if not pods.wait_gone(name, uid, timeout_s=60):
                raise TransientError(f"the earlier master pod {name} is still being deleted")
        spec = MasterPodSpec(
            name=name,
            namespace=opts["namespace"],
            image=opts["image"],
            run_id=run_id,
            output_dir=f"{mount}/runs/{task_dir(context)}",
            claim=opts["claim"],
            mount_path=mount,
            job_yaml=standalone_spec_yaml(loaded),
            plan_json=to_json(plan) if plan is not None else None,
            secret=f"{run_id}-history",
            dlrover_args=(
                "--checkpoint-interval",
                f"{self.checkpoint_interval:g}",
                "--sample-interval",
                f"{self.sample_interval:g}",
            ),
            service_account=opts.get("service_account") or None,
            cpu=str(opts.get("master_cpu") or "1"),
            memory=str(opts.get("master_memory") or "1Gi"),
            labels={"run": run_id},
        )
        name, uid = pods.submit(spec, url)
        self.log.info(
            "job master pod %s/%s submitted (run %s, on claim %s at %s)",
            spec.namespace,
            name,
            run_id,
            spec.claim,
            spec.output_dir,
        )
        return self._pod_trigger(name, uid)

    def _pod_trigger(self, name: str, uid: str) -> KubernetesTrainTrigger:
        opts = self.kubernetes
        return KubernetesTrainTrigger(
            namespace=opts["namespace"],
            pod=name,
            uid=uid,
            kubeconfig=opts.get("kubeconfig") or None,
            context=opts.get("context") or None,
            poll_interval=self.poll_interval,
            deadline=time.time() + self.timeout if self.timeout else None,
        )

    def _validated(self) -> tuple[LoadedSpec, ResourcePlan | None]:
        """The job spec and the plan, validated (SpecError names the key and the value)."""
        from dlrover_kfp.steps.spec import check_backend, load_job_spec  # noqa: PLC0415 - as above

        check_backend(self.backend)
        if self.backend == "kubernetes":
            for required in ("namespace", "image", "claim"):
                if not self.kubernetes.get(required):
                    raise UserInputError(
                        f"backend kubernetes: kubernetes[{required!r}] is required"
                    )
            # the master pod and the pods it starts run it: a name a node resolves the same way
            check_image(self.kubernetes["image"], "kubernetes['image']")
        loaded = load_job_spec(self.job_spec)
        return loaded, plan_from_document(self.plan)

    @staticmethod
    def _write_inputs(
        run_dir: Path, loaded: LoadedSpec, plan: ResourcePlan | None
    ) -> tuple[Path, Path | None]:
        """``job.yaml`` (relative data paths made absolute: the master runs in ``run_dir``) and
        ``plan.json``; what an earlier attempt's master left that would mislead the trigger
        (its profile, its exit status) goes."""
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in (PROFILE_FILE, MASTER_EXIT, REPORT_FILE, CANCEL_FILE):
            (run_dir / stale).unlink(missing_ok=True)
        spec_path = run_dir / JOB_FILE
        write_atomic(spec_path, standalone_spec_yaml(loaded))
        plan_path = None
        if plan is not None:
            plan_path = run_dir / PLAN_FILE
            write_atomic(plan_path, to_json(plan) + "\n")
        else:
            (run_dir / PLAN_FILE).unlink(missing_ok=True)
        return spec_path, plan_path

    def master_command(
        self, run_dir: Path, spec_path: Path, plan_path: Path | None, run_id: str | None = None
    ) -> list[str]:
        """The job master's command line. The history URL is not on it (it may carry a
        password): :mod:`airflow_plugin.master` takes it from its environment."""
        command = [
            sys.executable,
            "-m",
            "airflow_plugin.master",
            str(run_dir / MASTER_EXIT),
            "--",
            "run",
            "--job",
            str(spec_path),
            "--output-dir",
            str(run_dir),
            "--no-record",
            "--backend",
            self.backend,
            "--checkpoint-interval",
            f"{self.checkpoint_interval:g}",
            "--sample-interval",
            f"{self.sample_interval:g}",
        ]
        if plan_path is not None:
            command += ["--plan", str(plan_path)]
        if run_id is not None:
            command += ["--run-id", run_id]
        return command

    def _submit(
        self,
        run_dir: Path,
        spec_path: Path,
        plan_path: Path | None,
        url: str,
        run_id: str,
        data_env: Mapping[str, str] | None = None,
    ) -> ElasticTrainTrigger:
        """Start the job master. Its environment carries the secrets, never its command line:
        the history URL, and the data's credentials (``data_env``), which its pods inherit."""
        command = self.master_command(run_dir, spec_path, plan_path, run_id)
        env = dict(os.environ)
        env.update(data_env or {})
        env[ENV_VAR] = url
        log_path = run_dir / MASTER_LOG
        with log_path.open("ab") as log_file:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=run_dir,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        # A zombie still has its creation time: the pid cannot be recycled before it is reaped.
        create_time = process_create_time(proc.pid)
        # The trigger waits for the master, not this Popen (whose process may be gone by then,
        # the master then being init's child); marked done, it neither warns that its child
        # still runs when collected nor queues it for reaping.
        proc.returncode = 0
        host = socket.gethostname()
        master = {"pid": proc.pid, "create_time": create_time, "host": host}
        write_atomic(run_dir / MASTER_FILE, json.dumps(master) + "\n")
        self.log.info("job master started: pid %d, log %s", proc.pid, log_path)
        return self._trigger_for(proc.pid, create_time, run_dir, host)

    def _trigger_for(
        self, pid: int, create_time: float, run_dir: Path, host: str
    ) -> ElasticTrainTrigger:
        return ElasticTrainTrigger(
            pid=pid,
            create_time=create_time,
            output_dir=str(run_dir),
            host=host,
            poll_interval=self.poll_interval,
            deadline=time.time() + self.timeout if self.timeout else None,
        )

    def _running_master(self, run_dir: Path) -> ElasticTrainTrigger | None:
        """A trigger for the master an earlier attempt started in ``run_dir``, if it still runs.

        A task cleared or retried while its run goes on (the trigger was cancelled, which
        leaves the job running) waits for that run again instead of starting a second master
        on the same directory.
        """
        try:
            known = json.loads((run_dir / MASTER_FILE).read_text(encoding="utf-8"))
            pid, create_time, host = int(known["pid"]), float(known["create_time"]), known["host"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if host != socket.gethostname() or not master_alive(pid, create_time):
            return None
        self.log.warning(
            "the job master of an earlier attempt (pid %d) is still running in %s: waiting for "
            "it instead of starting another (this attempt's job spec and plan are not used)",
            pid,
            run_dir,
        )
        return self._trigger_for(pid, create_time, run_dir, host)

    # ---- after the run -----------------------------------------------------------------------

    def execute_complete(
        self, context: Context, event: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Resume after the trigger's event: XComs, report, and the run's outcome."""
        if not event:
            raise AirflowException("the trigger fired no event")
        if event.get("status") != "success":
            tail = event.get("log_tail") or ""
            if tail:
                self.log.error("the job master's log ends with:\n%s", tail)
            message = str(event.get("message") or "the job master failed")
            code = event.get("exit_code")
            if code == EXIT_USER_ERROR:
                raise AirflowFailException(f"{message}: a user error (see the log above)")
            if code == EXIT_TRANSIENT:
                raise AirflowException(f"{message}: a temporary failure, a retry may succeed")
            raise AirflowException(message)
        from dlrover_kfp.steps.record import read_profile  # noqa: PLC0415 - as above

        with task_errors():
            if event.get("backend") == "kubernetes":
                profile_path = self._profile_from_pod(context, event)
            else:
                profile_path = Path(str(event["profile"]))
            profile = read_profile(profile_path)
        ti = context["ti"]
        ti.xcom_push(key="run_id", value=profile.run_id)
        # The document, not only its path: the record task may run on another worker.
        ti.xcom_push(key="profile", value=to_dict(profile))
        ti.xcom_push(key="profile_path", value=str(profile_path))
        model_dir = profile_path.parent / "model"
        if event.get("backend") != "kubernetes" and model_dir.is_dir():
            # the trained model on this worker's disk, for PublishModelOperator (a Kubernetes
            # run's model is on the run's volume, which the worker does not mount)
            ti.xcom_push(key="model", value=str(model_dir))
        report = self._write_report(profile, profile_path.parent / REPORT_FILE)
        if report is not None:
            ti.xcom_push(key=REPORT_XCOM_KEY, value=str(report))
            self.report_path = str(report)  # for RunReportLink, when the task ends
        outcome = profile.outcome
        self.log.info(
            "run %s %s: JCT %.1f s, %d samples",
            profile.run_id,
            outcome.status,
            outcome.jct_seconds,
            outcome.samples_processed,
        )
        if outcome.status != "succeeded":
            raise AirflowFailException(
                f"run {profile.run_id} failed: {outcome.reason or 'see the profile events'} "
                f"(its profile is in the history and in {profile_path})"
            )
        return _summary(profile, profile_path, report)

    def _profile_from_pod(self, context: Context, event: Mapping[str, Any]) -> Path:
        """The profile the master pod printed last, written to this task's directory on the
        worker (for the report); then the ended pod is deleted (its history Secret with it)."""
        from airflow_plugin.kube import MasterPods, load_api, profile_from_log  # noqa: PLC0415

        opts = self.kubernetes
        pods = MasterPods(load_api(opts.get("kubeconfig"), opts.get("context")), event["namespace"])
        pod, uid = str(event["pod"]), str(event["uid"])
        document = profile_from_log(pods.log(pod, tail=5))
        if document is None:
            raise TransientError(f"the job master pod {pod} left no profile in its log")
        run_dir = Path(self.output_dir) if self.output_dir else default_output_dir(context)
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / PROFILE_FILE
        write_atomic(path, json.dumps(document) + "\n")
        pods.delete(pod, uid)
        return path

    def _write_report(self, profile: JobProfile, path: Path) -> Path | None:
        """``report.html`` beside the profile. The report is an extra: a run that trained must
        still be recorded (the next task) when its report cannot be drawn or written, so any
        error here is logged with its traceback and the task goes on without a report (the
        KFP component does the same)."""
        from dlrover_kfp.steps.report import run_report_html  # noqa: PLC0415 - as above

        try:
            write_atomic(path, run_report_html(profile))
        except Exception:  # deliberately broad, and logged: see the docstring
            self.log.exception("could not write the run report %s", path)
            return None
        self.log.info("run report: %s", path)
        return path

    def on_kill(self) -> None:
        """A task that waits in the worker (``deferrable=False``) was killed (marked failed or
        success, or timed out): stop the job, and say so first, so that its master records the
        run as cancelled. (A deferred task is not running: its trigger's ``on_kill`` does this.)"""
        trigger = self._trigger
        reason = f"task {self.task_id} was killed while it waited for the job"
        if isinstance(trigger, KubernetesTrainTrigger):
            from airflow_plugin.kube import MasterPods, load_api  # noqa: PLC0415

            opts = self.kubernetes
            api = load_api(opts.get("kubeconfig"), opts.get("context"))
            MasterPods(api, trigger.namespace).cancel(trigger.pod, trigger.uid, reason)
            self.log.info("deleted job master pod %s", trigger.pod)
        elif trigger is not None:
            request_cancel(trigger.output_dir, reason)
            if terminate_master(trigger.pid, trigger.create_time):
                self.log.info("sent SIGTERM to job master %d", trigger.pid)


class PublishModelOperator(BaseOperator):
    """The publish gate: copy a trained model to where it is served, only when its held-out
    AUC is at least the served model's less ``max_auc_drop``
    (:func:`dlrover_kfp.steps.publish.publish_step`: ``published/versions/<name>/``, then
    ``published/CURRENT`` names it; a reader never sees half a model). The first model with an
    AUC is published; a model without one (no held-out rows) is not.

    A refused model skips the task (``AirflowSkipException`` with the reason: the task shows
    "skipped" and the served model stays); bad input (no ``model.json``, a location that is not
    a directory) fails it without retries.

    :param model: the trained model's directory: the train task's XCom ``model``
        (``train.output["model"]``), or a path on this worker (templated).
    :param published: the directory models are published to (templated; a path, a mounted
        volume or a ``file://`` URL); default ``published/<dag_id>`` in the runs directory.
    :param max_auc_drop: how far below the served model's AUC a new model may be (default
        0.005; templated: a number or its text).
    :param evaluation: the evaluate task's ``metrics.json`` (its XCom ``metrics``; templated):
        judge the AUC the exported model gave there (refused unless it is this model's);
        without it, the AUC the train step measured (``model.json``).

    XComs: ``decision`` (published, reason, both AUCs, the served version), also when refused;
    ``return_value``: the version published.
    """

    template_fields: Sequence[str] = ("model", "published", "max_auc_drop", "evaluation")
    ui_color = "#f3e8fd"

    def __init__(
        self,
        *,
        model: str,
        published: str | None = None,
        max_auc_drop: float | str = 0.005,
        evaluation: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.published = published
        self.max_auc_drop = max_auc_drop
        self.evaluation = evaluation

    def execute(self, context: Context) -> str | None:
        from dlrover_kfp.steps.publish import publish_step  # noqa: PLC0415 - as above

        published = self.published or str(runs_dir() / "published" / self.dag_id)
        with task_errors():
            if not self.model:
                raise UserInputError(
                    f"model: {self.model!r}; give the trained model's directory (the train "
                    "task's XCom 'model', which a local-backend run pushes)"
                )
            try:
                drop = float(self.max_auc_drop)
            except (TypeError, ValueError):
                raise UserInputError(
                    f"max_auc_drop: {self.max_auc_drop!r}; expected a number"
                ) from None
            decision = publish_step(
                self.model,
                published,
                max_auc_drop=drop,
                evaluation=(self.evaluation or "").strip() or None,
            )
        context["ti"].xcom_push(key="decision", value=dataclasses.asdict(decision))
        self.log.info("publish gate (%s): %s", decision.location, decision.reason)
        if not decision.published:
            raise AirflowSkipException(decision.reason)
        return decision.version


class ScoreModelOperator(BaseOperator):
    """Score rows with a trained model (its ``model.onnx``, by onnxruntime: no torch) into a
    Parquet file of predictions (:func:`dlrover_kfp.steps.score.score_step`: one row per
    scored input row: source, row, label, probability).

    :param model: the trained model's directory: the train task's XCom ``model`` (templated).
    :param data_path: the rows to score: a file, directory, glob or URL (templated; as the
        train operator's, ``s3://CONN_ID@bucket/...`` reads with that ``aws`` connection).
    :param predictions: the Parquet file to write (templated; a path or an ``s3://`` URL,
        written whole or not at all).
    :param data_conn_id: an ``aws`` connection whose credentials read the data and write the
        output (templated); or name it in ``data_path``.
    :param data_format: parquet, csv, tsv or criteo (default: as ``dlrover-kfp score``).

    XCom ``return_value``: the summary (rows, bad rows, AUC and log-loss against the labels).
    """

    template_fields: Sequence[str] = ("model", "data_path", "predictions", "data_conn_id")
    ui_color = "#e6f4ea"

    def __init__(
        self,
        *,
        model: str,
        data_path: str,
        predictions: str,
        data_conn_id: str | None = None,
        data_format: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.data_path = data_path
        self.predictions = predictions
        self.data_conn_id = data_conn_id
        self.data_format = data_format

    def _data(self) -> DataLocation:
        path = (self.data_path or "").strip()
        if not path:
            return DataLocation("")
        data = resolve_data_location(path, self.data_conn_id)
        self.log.info("data: %s", data.describe())
        return data

    def execute(self, context: Context) -> dict[str, Any]:
        from dlrover_kfp.steps.score import score_step  # noqa: PLC0415 - pyarrow, onnxruntime

        with task_errors():
            data = self._data()
            with _environment(data.environment):
                result = score_step(
                    self.model, data.url, self.predictions, data_format=self.data_format or None
                )
        summary = result.to_dict()
        self.log.info("scored: %s", json.dumps(summary))
        return summary


class EvaluateModelOperator(ScoreModelOperator):
    """The exported model must reproduce the train step's held-out evaluation: score the rows
    the train task held out (of ``data_path``, the data it trained on; nothing for a model
    trained on generated rows) with ``model.onnx`` (onnxruntime) and fail the task, without
    retries, when their AUC differs from the train step's by more than 1e-4
    (:func:`dlrover_kfp.steps.evaluate.evaluate_step`): a broken export is never published.

    Parameters as :class:`ScoreModelOperator`'s, but ``output_dir`` (templated) for
    ``predictions``: a directory (default: ``evaluation/`` beside the model directory) that
    gets ``held_out.parquet`` (the predictions) and ``metrics.json`` (auc, loss, rows, the
    train step's auc: the document :class:`PublishModelOperator`'s ``evaluation`` reads).

    XCom ``return_value``: the metrics; ``metrics``: the path of ``metrics.json``.
    """

    template_fields: Sequence[str] = ("model", "data_path", "output_dir", "data_conn_id")

    def __init__(
        self, *, model: str, data_path: str = "", output_dir: str = "", **kwargs: Any
    ) -> None:
        super().__init__(model=model, data_path=data_path, predictions="", **kwargs)
        self.output_dir = output_dir

    def execute(self, context: Context) -> dict[str, Any]:
        from dlrover_kfp.steps.evaluate import evaluate_step  # noqa: PLC0415 - as above

        directory = Path(self.output_dir or Path(self.model).parent / "evaluation")
        with task_errors():
            data = self._data()
            with _environment(data.environment):
                result = evaluate_step(
                    self.model,
                    data.url,
                    str(directory / "held_out.parquet"),
                    directory / "metrics.json",
                    data_format=self.data_format or None,
                )
        metrics = result.to_dict()
        context["ti"].xcom_push(key="metrics", value=str(directory / "metrics.json"))
        self.log.info(
            "evaluated: held-out AUC %s (onnxruntime) vs %s (train step), %d rows",
            result.auc,
            result.train_auc,
            result.rows,
        )
        return metrics


def task_run_id(context: Context, job_name: str) -> str:
    """The run id of this task's logical run (:func:`dlrover_kfp.steps.run_ids.stable_run_id`):
    the DAG id, the logical date (a run without one: its DAG run id), the task id and its map
    index name it. Every attempt, retry, clear or re-run of the task for that date gets the
    same id (also a second DAG run of the same logical date, as ``airflow dags test`` makes),
    so that the history holds one run for it, its latest attempt."""
    ti = context["ti"]
    logical = context.get("logical_date")
    when = logical.isoformat() if logical is not None else f"run:{context['run_id']}"
    keys = (str(ti.dag_id), when, str(ti.task_id), str(ti.map_index))
    return stable_run_id(job_name, keys, label=str(context.get("ds_nodash") or ""))


async def _first_event(trigger: ElasticTrainTrigger | KubernetesTrainTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        payload: dict[str, Any] = event.payload
        return payload
    raise AirflowException("the trigger ended without an event")


def _summary(profile: JobProfile, profile_path: Path, report: Path | None) -> dict[str, Any]:
    final = profile.plans[-1] if profile.plans else None
    return {
        "run_id": profile.run_id,
        "outcome": to_dict(profile.outcome),
        "metrics": to_dict(profile.metrics),
        "final_plan": to_dict(final) if final is not None else None,
        "profile": str(profile_path),
        "report": str(report) if report is not None else None,
    }


__all__ = [
    "ElasticTrainOperator",
    "EvaluateModelOperator",
    "PlanResourcesOperator",
    "PublishModelOperator",
    "RecordProfileOperator",
    "ScoreModelOperator",
    "task_errors",
    "task_run_id",
]
