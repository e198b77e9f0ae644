"""A real Airflow 3 deployment for tests: the four components as processes, driven by REST.

``dag.test()`` runs a DAG in one process: the task, its trigger and the "scheduler" share it,
so it cannot show what happens between Airflow's components (a trigger handed from the worker
to the triggerer, a user marking a deferred task failed, a triggerer restarted mid-run). This
harness starts what a platform team runs::

    airflow scheduler        (LocalExecutor: tasks run as its worker processes)
    airflow dag-processor    (parses the DAGs folder)
    airflow triggerer        (runs the deferred tasks' triggers)
    airflow api-server       (REST API v2 and the execution API the tasks talk to)

each in a session of its own with its own log file, on a SQLite metadata database after
``airflow db migrate``, all under one temporary directory. Users log in the real way: the
simple auth manager's user ``admin`` with a password written to its passwords file, and
``POST /auth/token`` for a JWT, sent as a bearer token with every request.

The scheduler creates no scheduled runs (``[scheduler] use_job_schedule = False``): a test
triggers each run with its logical date, as a backfill or a user would, and the DAG's own
``@daily`` schedule cannot add a run the test did not ask for.

Use it as a context manager; on exit every component's process group is stopped, and so is
every process still running in a directory under the deployment's root (a job master that a
failing test left behind).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import httpx
import psutil  # type: ignore[import-untyped, unused-ignore]

COMPONENTS: Final = ("scheduler", "dag-processor", "triggerer", "api-server")
USER: Final = "admin"
#: Seconds a component gets to stop after SIGTERM before its process group is killed.
STOP_GRACE_S: Final = 30.0
#: Lines of each component's log shown in a failure message.
LOG_TAIL_LINES: Final = 25

T = TypeVar("T")


def free_port() -> int:
    """A TCP port nobody listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a text file ("" when it does not exist)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def processes_under(directory: Path) -> list[psutil.Process]:
    """Every live process whose working directory or command line is in ``directory``.

    This is how a test finds a job's processes without trusting the job's own bookkeeping:
    the master runs in its run directory, and its PS and worker processes inherit that
    directory and name their checkpoint paths on their command lines.
    """
    root = str(directory.resolve())
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cwd = info["cwd"] or ""
        cmdline = " ".join(info["cmdline"] or ())
        if cwd == root or cwd.startswith(root + os.sep) or root in cmdline:
            found.append(proc)
    return found


def wait_until(what: str, probe: Callable[[], T | None], timeout: float, every: float = 1.0) -> T:
    """Call ``probe`` every ``every`` seconds until it returns something other than None."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


class ApiClient:
    """The REST API v2 calls a test makes, with the JWT of a logged-in user."""

    def __init__(self, base_url: str, token: str) -> None:
        self._http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30.0
        )

    def close(self) -> None:
        self._http.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request; a status other than 2xx raises with the server's answer."""
        response = self._http.request(method, "/api/v2" + path, **kwargs)
        if response.status_code >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {response.status_code}: {response.text}")
        return response.json() if response.content else None

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        """The DAG as the API knows it; None until the dag-processor has parsed it."""
        response = self._http.get(f"/api/v2/dags/{dag_id}")
        return response.json() if response.status_code == 200 else None

    def unpause(self, dag_id: str) -> None:
        self.call("PATCH", f"/dags/{dag_id}", json={"is_paused": False})

    def trigger(self, dag_id: str, logical_date: str, conf: Mapping[str, Any]) -> str:
        """Start a DAG run for ``logical_date`` (ISO 8601, with its zone); its run id."""
        body = {"logical_date": logical_date, "conf": dict(conf)}
        run = self.call("POST", f"/dags/{dag_id}/dagRuns", json=body)
        return str(run["dag_run_id"])

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])

    def task_state(self, dag_id: str, run_id: str, task_id: str) -> str | None:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        state = self.call("GET", path)["state"]
        return None if state is None else str(state)

    def mark_task(self, dag_id: str, run_id: str, task_id: str, state: str) -> None:
        """What a user does with "Mark as failed/success" in the UI."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        self.call("PATCH", path, json={"new_state": state})

    def clear(self, dag_id: str, run_id: str, task_ids: list[str]) -> None:
        """What a user does with "Clear" on tasks of a DAG run (the run goes back to queued)."""
        body = {
            "dry_run": False,
            "dag_run_id": run_id,
            "task_ids": task_ids,
            "only_failed": False,
            "reset_dag_runs": True,
        }
        self.call("POST", f"/dags/{dag_id}/clearTaskInstances", json=body)

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}"
        return self.call("GET", path, params={"deserialize": "true"})["value"]


@dataclass(frozen=True)
class Layout:
    """Where a deployment keeps its files: all of them under ``root``."""

    root: Path

    @property
    def home(self) -> Path:
        return self.root / "airflow"

    @property
    def dags(self) -> Path:
        return self.root / "dags"

    @property
    def logs(self) -> Path:
        return self.root / "component-logs"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"


class AirflowDeployment:
    """Airflow's four components as processes under ``root`` (see the module docstring).

    :param root: an empty directory that holds everything (AIRFLOW_HOME, the DAGs folder, the
        metadata database, the component logs).
    :param dag_files: files copied into the DAGs folder, as a user deploys a DAG.
    :param env: more environment for every component (and so for the tasks and triggers).
    """

    def __init__(
        self, root: Path, dag_files: Iterable[Path], env: Mapping[str, str] | None = None
    ) -> None:
        self.layout = Layout(root)
        self.port = free_port()
        self._password = secrets.token_urlsafe(16)
        self._dag_files = list(dag_files)
        self._extra_env = dict(env or {})
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._env: dict[str, str] = {}
        self._api: ApiClient | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> AirflowDeployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def api(self) -> ApiClient:
        if self._api is None:
            raise RuntimeError("the deployment is not started")
        return self._api

    def environment(self) -> dict[str, str]:
        """The environment of every component: Airflow's configuration as variables."""
        layout = self.layout
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(
            AIRFLOW_HOME=str(layout.home),
            AIRFLOW__CORE__DAGS_FOLDER=str(layout.dags),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            # two task processes at a time: a plan or record task beside a deferring train
            AIRFLOW__CORE__PARALLELISM="2",
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{layout.root / 'airflow.db'}",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{self.port}/execution/",
            # shared by every component: the scheduler signs the tasks' tokens, the API checks
            AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_hex(32),
            AIRFLOW__API__SECRET_KEY=secrets.token_hex(16),
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=f"{USER}:admin",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(layout.root / "passwords.json"),
            AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE="False",
        )
        env.update(self._extra_env)
        return env

    def start(self) -> None:
        """Configure, migrate, start the four components, log in, wait until all are healthy."""
        layout = self.layout
        for folder in (layout.home, layout.dags, layout.logs):
            folder.mkdir(parents=True, exist_ok=True)
        for file in self._dag_files:
            shutil.copy(file, layout.dags / file.name)
        (layout.root / "passwords.json").write_text(json.dumps({USER: self._password}))
        self._env = self.environment()
        migrate = subprocess.run(
            [self._airflow(), "db", "migrate"],
            env=self._env, cwd=layout.root, capture_output=True, text=True, timeout=300,
            check=False,
        )  # fmt: skip
        if migrate.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed:\n{migrate.stdout}\n{migrate.stderr}")
        for component in COMPONENTS:
            self.start_component(component)
        base_url = f"http://127.0.0.1:{self.port}"
        token = self._wait(
            "the API server to issue a token", lambda: self._login(base_url), timeout=180
        )
        self._api = ApiClient(base_url, token)
        self._wait("every component to report healthy", self._healthy, timeout=180)

    def stop(self) -> None:
        """Stop every component (SIGTERM, then SIGKILL to its group), then every process left
        in a directory under the root."""
        for component in reversed(list(self._procs)):
            self.stop_component(component)
        for proc in processes_under(self.layout.root):
            if proc.pid == os.getpid():
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if self._api is not None:
            self._api.close()
            self._api = None

    # -- components ---------------------------------------------------------------------

    def _airflow(self) -> str:
        return str(Path(sys.executable).parent / "airflow")

    def _command(self, component: str) -> list[str]:
        if component == "api-server":
            return [self._airflow(), "api-server", "--host", "127.0.0.1", "--port",
                    str(self.port), "--workers", "1"]  # fmt: skip
        return [self._airflow(), component]

    def start_component(self, component: str) -> int:
        """Start one component in a session of its own, appending to its log; its pid."""
        log = self.layout.log(component).open("ab")
        log.write(f"\n===== harness: starting {component} at {time.ctime()}\n".encode())
        log.flush()
        with log:
            proc = subprocess.Popen(
                self._command(component),
                env=self._env,
                cwd=self.layout.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._procs[component] = proc
        return proc.pid

    def stop_component(self, component: str, grace: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the component's main process, as Kubernetes or systemd stop a service, and
        wait for it; what is left of its group after ``grace`` seconds is killed. Its exit
        status (None if it had to be killed)."""
        proc = self._procs.pop(component, None)
        if proc is None:
            return None
        code: int | None = proc.poll()
        if code is None:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                code = None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its children, and itself if it hung
        proc.wait()
        return code

    def restart_component(self, component: str) -> int | None:
        """Stop a component (as :meth:`stop_component`) and start it again; the old one's
        exit status."""
        code = self.stop_component(component)
        self.start_component(component)
        return code

    def running(self, component: str) -> bool:
        proc = self._procs.get(component)
        return proc is not None and proc.poll() is None

    # -- waiting ------------------------------------------------------------------------

    def _login(self, base_url: str) -> str | None:
        """A JWT for the user, as the UI's login form gets one; None while the server starts."""
        try:
            response = httpx.post(
                f"{base_url}/auth/token",
                json={"username": USER, "password": self._password},
                timeout=10.0,
            )
        except httpx.TransportError:
            return None
        if response.status_code != 201:
            return None
        return str(response.json()["access_token"])

    def _healthy(self) -> bool | None:
        health = self.api.call("GET", "/monitor/health")
        parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        ok = all(health.get(part, {}).get("status") == "healthy" for part in parts)
        return True if ok else None

    def _wait(self, what: str, probe: Callable[[], T | None], timeout: float) -> T:
        """:func:`wait_until`, failing early with the logs when a component has died."""

        def checked() -> T | None:
            dead = [name for name, proc in self._procs.items() if proc.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}\n"
                                   + self.logs())  # fmt: skip
            return probe()

        try:
            return wait_until(what, checked, timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.logs()}") from None

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> None:
        """Wait until the dag-processor has parsed ``dag_id``; then unpause it, as a user does."""
        self._wait(f"DAG {dag_id} to be parsed", lambda: self.api.dag(dag_id), timeout)
        self.api.unpause(dag_id)

    def wait_task(
        self, dag_id: str, run_id: str, task_id: str, states: Iterable[str], timeout: float
    ) -> str:
        """Wait until the task instance is in one of ``states``; fails at once when it ends in
        another state (the task's log is in the message)."""
        wanted = set(states)
        ended = {"success", "failed", "upstream_failed", "skipped", "removed"}

        def probe() -> str | None:
            state = self.api.task_state(dag_id, run_id, task_id)
            if state in wanted:
                return state
            if state in ended:
                raise AssertionError(
                    f"{task_id} of {run_id} is {state}, waiting for {sorted(wanted)}\n"
                    + self.task_log(dag_id, run_id, task_id)
                )
            return None

        return self._wait(f"{task_id} of {run_id} to be {sorted(wanted)}", probe, timeout)

    def wait_run(self, dag_id: str, run_id: str, states: Iterable[str], timeout: float) -> str:
        """Wait until the DAG run is in one of ``states``; fails at once when it ends in
        another."""
        wanted = set(states)

        def probe() -> str | None:
            state = self.api.run_state(dag_id, run_id)
            if state in wanted:
                return state
            if state in {"success", "failed"}:
                raise AssertionError(f"{run_id} is {state}, waiting for {sorted(wanted)}\n"
                                     + self.task_logs(dag_id, run_id))  # fmt: skip
            return None

        return self._wait(f"{run_id} to be {sorted(wanted)}", probe, timeout)

    # -- what a failure message shows -------------------------------------------------------

    def logs(self) -> str:
        """The tail of every component's log."""
        parts = []
        for component in COMPONENTS:
            parts.append(f"----- {component} log (tail)\n{tail(self.layout.log(component))}")
        return "\n".join(parts)

    def task_log(self, dag_id: str, run_id: str, task_id: str) -> str:
        """The tail of every attempt's log of one task instance, from the logs folder."""
        folder = self.layout.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        parts = []
        for path in sorted(folder.glob(f"task_id={task_id}/**/*.log")):
            parts.append(f"----- {path.relative_to(self.layout.home)}\n{tail(path, 60)}")
        return "\n".join(parts) or f"(no task log under {folder})"

    def trigger_logs(self, dag_id: str, run_id: str, task_id: str) -> list[Path]:
        """The logs of the task's triggers, one per triggerer that ran one (Airflow names them
        ``attempt=N.log.trigger.<triggerer job id>.log``), oldest triggerer first."""
        folder = self.layout.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        found = folder.glob(f"task_id={task_id}/attempt=*.log.trigger.*.log")
        return sorted(found, key=lambda path: int(path.name.split(".")[-2]))

    def task_logs(self, dag_id: str, run_id: str) -> str:
        folder = self.layout.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        tasks = sorted(p.name.removeprefix("task_id=") for p in folder.glob("task_id=*"))
        return "\n".join(self.task_log(dag_id, run_id, task) for task in tasks)


__all__ = [
    "COMPONENTS",
    "AirflowDeployment",
    "ApiClient",
    "Layout",
    "free_port",
    "processes_under",
    "tail",
    "wait_until",
]
