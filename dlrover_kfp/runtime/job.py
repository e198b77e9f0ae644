"""Running a job to the end: launch the pods, observe them, checkpoint, evaluate, profile.

A *static* run keeps the spec's own resources (``resources.workers``/``resources.ps``) for the
whole job, like a plain TFJob: a pod that fails fails the job. The loop is the runtime's
observe -> decide -> apply shape with the "decide" fixed; the elastic runtime plugs the
planner's stages into the same loop.

What the caller gets: ``DIR/profile.json`` (profile schema v1, with the per-pod CPU and memory
samples the backend measured and the samples/s the workers reported), the trained model
(``DIR/model/``), held-out log-loss and AUC, and the checkpoints under ``DIR/checkpoints``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import secrets
import shutil
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from dlrover_kfp.core.applied import AppliedTally, by_cause
from dlrover_kfp.core.documents import parse, to_dict, to_json
from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.core.plan import NodeGroup, Stage
from dlrover_kfp.core.profile import (
    AppliedPlan,
    JobEvent,
    JobProfile,
    LimitEnforcement,
    Metrics,
    NodeSample,
    Outcome,
    RuntimeSample,
    profile_job,
)
from dlrover_kfp.core.shards import ShardLedger
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.errors import TransientError, UserInputError
from dlrover_kfp.files import write_atomic
from dlrover_kfp.ports import (
    Clock,
    ClusterBackend,
    PodPhase,
    PodSpec,
    PodStatus,
    PodUsage,
    SystemClock,
)
from dlrover_kfp.runtime import signals
from dlrover_kfp.runtime.cancel import cancel_reason, first_reason
from dlrover_kfp.runtime.checkpoints import CheckpointCoordinator
from dlrover_kfp.runtime.export import (
    evaluate_and_export,
    held_out_record,
    preload_in_background,
)
from dlrover_kfp.runtime.liveness import (
    START_SILENT_S,
    FrozenPs,
    PsWatch,
    WatchedPs,
    starting_ps_frozen,
)
from dlrover_kfp.runtime.master import MasterService, MasterState
from dlrover_kfp.runtime.metrics import serve_metrics
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.runtime.pod_events import EventForwarder
from dlrover_kfp.runtime.reserve import ProfileReserve
from dlrover_kfp.runtime.rundir import (
    RunInputsChangedError,
    data_files,
    refuse_changed,
    run_inputs,
)
from dlrover_kfp.runtime.runfile import FINISHED, RUN_FILE, unfinished_run
from dlrover_kfp.training import checkpoint as ckpt
from dlrover_kfp.training.data import split_ranges
from dlrover_kfp.training.datasets import data_fingerprint, open_dataset
from dlrover_kfp.training.node import THREADS_ENV
from dlrover_kfp.training.wire import SECRET_ENV_VAR, Server, new_secret, secret_to_env

log = logging.getLogger("dlrover_kfp.job")


#: Tries of the final checkpoint before a run fails (1 s, 2 s, 4 s apart).
FINAL_CHECKPOINT_ATTEMPTS = 4


@dataclass(frozen=True, slots=True)
class RunResult:
    profile: JobProfile
    output_dir: Path
    model_dir: Path | None

    @property
    def succeeded(self) -> bool:
        return self.profile.outcome.status == "succeeded"


class JobFailedError(TransientError):
    """A pod of a static run failed (OOM, crash, eviction): the run may succeed if retried."""


Progress = Callable[[str], None]


@runtime_checkable
class Meter(Protocol):
    """A progress display that also shows how far a run is (a bar on a terminal). A run whose
    ``progress`` is one calls :meth:`advance` at every sample, besides the line it prints."""

    def __call__(self, line: str) -> None: ...

    def advance(self, done: int, total: int) -> None: ...


def static_groups(spec: JobSpec) -> tuple[NodeGroup, NodeGroup]:
    res = spec.resources
    if res.workers is None or res.ps is None:
        missing = "resources.workers" if res.workers is None else "resources.ps"
        raise UserInputError(f"{missing}: a --static run needs the spec's own resources")
    return res.workers.to_group(), res.ps.to_group()


def _eta(done: int, total: int, rate: float) -> str:
    if rate <= 0 or done >= total:
        return "-"
    seconds = (total - done) / rate
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.1f}min"


def trainer_pod(
    job: str,
    run_id: str,
    secret: bytes,
    settings: RunSettings,
    node: NodeId,
    group: NodeGroup,
    master: tuple[str, int],
) -> PodSpec:
    """The pod of one PS or worker of a run: the trainer's command (role, index, the master's
    address), the job secret in its env, the group's resources, the run's labels.

    A PS runs under its pod's supervisor (:mod:`~dlrover_kfp.training.supervisor`, the pod's
    first process), which restarts a crashed PS inside the pod, where its shared-memory
    snapshot still is; a worker has no state to keep and its pod fails with it. The
    supervisor loads the PS's code (torch, numpy) once and forks each PS process from itself,
    so that a restart serves again without starting an interpreter and torch anew."""
    host, port = master
    args = (node.role, str(node.index), "--master", f"{host}:{port}") + (
        ("--generation", str(node.generation)) if node.generation else ()
    )
    trainer = (settings.python, "-m", "dlrover_kfp.training.node", *args)
    supervised = (
        settings.python,
        "-m",
        "dlrover_kfp.training.supervisor",
        "--fork",
        "dlrover_kfp.training.node",
        "--preload",
        "dlrover_kfp.training.ps_server",
        "--",
        *args,
    )
    return PodSpec(
        name=node.pod_name(job),
        role=node.role,
        index=node.index,
        command=supervised if node.role == "ps" else trainer,
        env={
            SECRET_ENV_VAR: secret_to_env(secret),
            # Under a CFS quota an idle OpenMP thread must sleep, not spin: spinning burns
            # the pod's quota and throttles the threads that have work.
            "OMP_WAIT_POLICY": "PASSIVE",
        }
        | (
            {THREADS_ENV: str(settings.torch_threads)} if settings.torch_threads is not None else {}
        ),
        cpu=group.cpu,
        memory_mb=group.memory_mb,
        labels={"job": job, "run": run_id, "role": node.role, "index": str(node.index)}
        | ({"generation": str(node.generation)} if node.generation else {}),
    )


class RunPolicy(Protocol):
    """What a run does at the loop's decision points: a static run keeps its pods and fails on
    the first failure (:class:`StaticPolicy`); an elastic one plans, resizes and relaunches
    (:class:`~dlrover_kfp.runtime.elastic.ElasticPolicy`). The loop, the pods, the master's
    state and the run's record are the :class:`JobRun`'s, which a policy is given."""

    def handle_failures(self, statuses: list[PodStatus], t: float) -> None:
        """React to failed (or frozen) pods at time ``t`` of the run; raise
        :class:`JobFailedError` to end the run."""
        ...

    def start_failed(self, pod: PodStatus) -> None:
        """A pod failed before every PS registered."""
        ...

    def decide(self, t: float) -> None:
        """After each runtime sample."""
        ...

    def finish(self) -> None:
        """Training is over (every shard done): settle what the policy left running."""
        ...

    def checkpoint_extra(self) -> dict[str, Any]:
        """What the policy keeps with a checkpoint, beside the master's ledger and counts."""
        ...

    def applied_plans(self) -> tuple[AppliedPlan, ...]:
        """The plans the run applied, for its profile."""
        ...


P = TypeVar("P", bound=RunPolicy)


class StaticPolicy:
    """A static run: the spec's own resources for the whole run; a pod that fails (or a PS that
    freezes) fails the job, as in a plain TFJob."""

    def __init__(self, run: JobRun[Any]) -> None:
        self.run = run

    def handle_failures(self, statuses: list[PodStatus], t: float) -> None:
        run = self.run
        failed = run.failed(statuses)
        if failed is not None:
            run.events.append(
                JobEvent(
                    time=round(t, 3),
                    kind="oom" if failed.reason == "OOMKilled" else "failure",
                    node=failed.name,
                    detail=run.describe_failure(failed),
                )
            )
            raise JobFailedError(run.describe_failure(failed))
        # A frozen PS (runtime/liveness.py) fails the job as a failed one does; killed at once,
        # since a frozen process cannot act on SIGTERM and the cleanup must not wait on it.
        frozen = run.ps_watch.frozen(
            {k: WatchedPs(k, 0, run.pod_name(NodeId("ps", k))) for k in range(run.ps.count)}
        )
        if frozen is not None:
            raise JobFailedError(f"pod {frozen.pod} {run.kill_frozen(frozen)}")

    def start_failed(self, pod: PodStatus) -> None:
        raise JobFailedError(self.run.describe_failure(pod))

    def decide(self, t: float) -> None:
        """Nothing to decide: the resources are the spec's."""

    def finish(self) -> None:
        """Nothing left running."""

    def checkpoint_extra(self) -> dict[str, Any]:
        return {}

    def applied_plans(self) -> tuple[AppliedPlan, ...]:
        run = self.run
        return (
            AppliedPlan(
                time=0.0,
                stage=Stage.MANUAL,
                reason="the spec's own resources (--static)",
                workers=run.workers,
                ps=run.ps,
            ),
        )


def new_run_id(name: str, started_wall: float) -> str:
    """A run's default id: ``NAME-<UTC start, %Y%m%dT%H%M%S>-<8 hex digits>``, its start (for
    people) and 32 random bits. The time alone has one-second resolution: runs of one job
    started together (a backfill, a retried schedule) got one id, and the history, which keeps
    one profile per id, kept one of them while each printed ``recorded``. The random part
    makes ids unique across processes and hosts: a collision among n runs started in the same
    second has probability n(n-1)/2 / 2^32 (1,000 runs: 1.2e-4)."""
    stamp = datetime.fromtimestamp(started_wall, UTC).strftime("%Y%m%dT%H%M%S")
    return f"{name}-{stamp}-{secrets.token_hex(4)}"


class JobRun(Generic[P]):
    """One run of a job: build it, then call :meth:`run` once.

    Everything the run holds is built here, before it starts: the dataset and its split, the
    shard ledger, the master's state, the PS watch, the record (samples, events), and the
    policy (:class:`RunPolicy`) that decides at the loop's hooks. Only what exists while the
    run's pods do is made by :meth:`run`, and it is declared here: the master's server (its
    :attr:`address`) and the :attr:`coordinator` of the current PS set.

    With ``options.resume``, a run that an earlier master left unfinished in ``output_dir``
    (its ``run.json`` is still there: the master was killed) goes on from its last committed
    checkpoint: the same run id, the shard ledger and the counts committed with the
    parameters, every PS restored from that checkpoint; the shards done after it are trained
    again and counted once.
    """

    def __init__(
        self,
        spec: JobSpec,
        backend: ClusterBackend,
        options: RunOptions,
        *,
        groups: tuple[NodeGroup, NodeGroup],
        policy: Callable[[JobRun[Any]], P],
        progress: Progress | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.spec = spec
        self.backend = backend
        self.options = options
        # Absolute: paths in it go to pods, whose working directory is not this one's.
        output_dir = options.output_dir.absolute()
        self.output_dir = output_dir
        base_dir = self.base_dir = options.base_dir
        self.settings = options.settings
        self.clock: Clock = clock or SystemClock()
        #: the shape the pods have now: the one it starts with, which an elastic run changes
        self.workers, self.ps = groups
        self.started_wall = self.clock.now()
        #: a user's cancel since this master started (an older marker is an earlier attempt's)
        since = self.started_wall
        self.cancel_reason = first_reason(
            lambda: cancel_reason(output_dir, since), options.cancel_probe
        )
        #: the committed checkpoint an interrupted run of this output directory resumes from
        self.resume_from: ckpt.CheckpointChoice | None = None
        #: seconds the run had been going before this master started (a resumed run)
        self._earlier_s = 0.0
        dataset = open_dataset(spec.data, spec.model, base_dir)  # bad data fails before pods
        self.dataset = dataset
        #: what decides the rows trained and held out and what is trained (the run file's)
        self.inputs = run_inputs(
            spec,
            dataset,
            shard_rows=self.settings.shard_rows,
            eval_fraction=self.settings.eval_fraction,
        )
        previous = unfinished_run(output_dir) if options.resume else None
        #: the events the earlier master journalled in its run file (a resumed run)
        self.journalled: list[JobEvent] = []
        self._journal_failed = False
        if previous is not None:
            # Its ledger and counts are of its own rows: resuming onto other inputs would train
            # a mix of both (or rows that are not there) and report success.
            recorded = previous.get("inputs")
            refuse_changed(
                output_dir / RUN_FILE,
                recorded if isinstance(recorded, dict) else {"name": previous["job"]},
                self.inputs if isinstance(recorded, dict) else {"name": spec.name},
            )
            if not isinstance(recorded, dict):
                raise RunInputsChangedError(
                    f"{output_dir / RUN_FILE}: written by an earlier version, without the inputs "
                    "it trained on; to start afresh run again with --fresh, or choose another "
                    "--output-dir"
                )
            self.journalled = [
                parse(JobEvent, e, str(output_dir / RUN_FILE), prefix=f"events[{i}].")
                for i, e in enumerate(previous.get("events") or [])
            ]
            run_id: str | None = str(previous["run_id"])
            self._earlier_s = max(0.0, self.started_wall - float(previous["started_wall"]))
            self.started_wall = float(previous["started_wall"])
            resume_id = run_id
        else:
            run_id = resume_id = options.run_id
        self.run_id = run_id or new_run_id(spec.name, self.started_wall)
        self.resumed = previous is not None
        self.progress = progress or (lambda line: log.info("%s", line))
        self.samples: list[RuntimeSample] = []
        self.events: list[JobEvent] = []
        #: per worker index: (time, samples reported) at its previous runtime sample
        self._worker_last: dict[int, tuple[float, int]] = {}
        #: the newest step a checkpoint was started as (each step's directory is written once)
        self._checkpoint_step = -1
        #: the job's global step when that checkpoint was started
        self._checkpoint_trained = -1
        #: pods this master stops on purpose (an elastic run's resizes): not failures
        self.stopping: set[str] = set()
        #: the last spec built for each pod name (what its self-reported usage is against)
        self.launched: dict[str, PodSpec] = {}
        #: pod names the backend has measured since their last launch: their usage comes from
        #: the backend only, so that a pod's samples are one measure (its own report counts the
        #: shared libraries' pages, ~100 MiB of torch, that a cgroup's reading leaves out)
        self._backend_measured: set[str] = set()
        #: when (monotonic) each pod name was last launched: how long a Pending one has waited
        self.launched_at: dict[str, float] = {}

        self.dataset_rows = sum(dataset.source_rows)
        source_rows = dataset.source_rows
        train, self.eval_ranges = split_ranges(
            source_rows,
            self.settings.shard_rows,
            self.settings.eval_fraction,
            units=[dataset.units(s) for s in range(len(source_rows))],
        )
        if not train:
            raise UserInputError(f"data: no training rows in {dataset.description}")
        self.ledger = ShardLedger(
            tuple((r.source, r.start, r.end) for r in train), epochs=spec.training.epochs
        )
        self.secret = new_secret()
        self.checkpoint_dir = output_dir / "checkpoints"
        if previous is not None:
            # Chosen once the run's own split is known: a checkpoint whose ledger is not it
            # is passed over for an older one (check_committed).
            choice = ckpt.select_checkpoint(self.checkpoint_dir, accept=self.check_committed)
            if choice is not None and choice.job_id == resume_id:
                self.resume_from = choice
        #: the master's server while the run's pods live (:meth:`run` starts and closes it)
        self.server: Server | None = None
        self._coordinator: CheckpointCoordinator | None = None
        #: the monotonic time the run's timeline counts from (a resumed run's goes on)
        self.start = self.clock.monotonic() - self._earlier_s
        self.policy: P = policy(self)
        # After the policy: a resumed elastic run goes on at the shape it had (its policy sets
        # it from the checkpoint), and the master serves that many PS.
        self.state = MasterState(
            ledger=self.ledger,
            num_ps=self.ps.count,
            job_config={
                "spec": to_dict(spec),
                "base_dir": str(base_dir.resolve()),
                "num_ps": self.ps.count,
                "synchronous": self.settings.synchronous,
                "seed": self.settings.seed,
                "checkpoint_dir": str(self.checkpoint_dir.resolve()),
                "job_id": self.run_id,
                # the files this master listed: a worker that lists others refuses to train
                "data_files": data_fingerprint(dataset),
            },
            locate=dataset.locate,
        )
        self.ps_watch = PsWatch(self.state, self.secret, self.clock.monotonic)
        output_dir.mkdir(parents=True, exist_ok=True)
        self.reserve = ProfileReserve(output_dir)  # a full disk still takes the profile
        # The cluster hears of the events this master records (a resumed run's earlier ones
        # were told by the master that recorded them): runtime/pod_events.py.
        self._told = EventForwarder(backend, already=len(self.events))

    @property
    def address(self) -> tuple[str, int]:
        """Where the pods reach the master."""
        if self.server is None:
            raise RuntimeError("the master is not serving: JobRun.run() starts it")
        return self.server.address

    @property
    def coordinator(self) -> CheckpointCoordinator:
        """The checkpoint coordinator of the current PS set (once every PS serves)."""
        if self._coordinator is None:
            raise RuntimeError("no checkpoint coordinator before every PS serves")
        return self._coordinator

    @coordinator.setter
    def coordinator(self, coordinator: CheckpointCoordinator) -> None:
        self._coordinator = coordinator

    def t(self) -> float:
        """Seconds on the run's timeline."""
        return self.clock.monotonic() - self.start

    # -- pods ----------------------------------------------------------------------------------

    def pod_name(self, node: NodeId) -> str:
        return node.pod_name(self.spec.name)

    def worker_name(self, index: int) -> str:
        return self.pod_name(NodeId.worker(index))

    def pod(self, node: NodeId, group: NodeGroup) -> PodSpec:
        """The pod of ``node`` at ``group``'s size, remembered as what ``node`` now runs as."""
        pod = trainer_pod(
            self.spec.name, self.run_id, self.secret, self.settings, node, group, self.address
        )
        self.launched[pod.name] = pod
        self._backend_measured.discard(pod.name)
        return pod

    def launch(self, node: NodeId, group: NodeGroup) -> None:
        """Start ``node``'s pod. A pod stopped on purpose under that name before (an abandoned
        PS change's, whose generation and names come again) is gone: this one's end, should it
        fail, is a failure."""
        pod = self.pod(node, group)
        self.stopping.discard(pod.name)
        self.launched_at[pod.name] = self.clock.monotonic()
        self.backend.launch(pod)

    def stop(self, name: str, cause: str = "stopped") -> None:
        """Stop a pod on purpose: its end is no failure. ``cause`` (the event kind it is
        stopped for) is what a worker's part-trained shard is put down to (core/applied.py)."""
        self.stopping.add(name)
        node = NodeId.from_pod_name(self.spec.name, name)
        if node is not None and node.role == "worker":
            with self.state.lock:
                self.state.stop_causes[node.key] = cause
        self.backend.delete(name)

    def _self_reported(self, state: MasterState, measured: set[str]) -> dict[str, PodUsage]:
        """Usage of the pods the backend does not measure (a cluster without a metrics API, a
        pod the metrics API has not scraped yet), from what each pod reports about itself
        (:func:`~dlrover_kfp.training.node.report_usage`); only fresh reports (two sample
        intervals and a bit), from pods launched by this run. ``measured``: the pods the backend
        has measured since their launch; not filled in for when their reading stops (a pod
        exiting at the end of the run read 309 MiB of its own RSS against 207 MiB the backend
        read throughout, which the history's peak then kept)."""
        max_age = 2 * self.settings.sample_interval_s + 3.0
        out = {}
        for node, (cores, rss) in state.self_reported_usage(
            self.clock.monotonic(), max_age
        ).items():
            name = self.pod_name(node)
            pod = self.launched.get(name)
            if name in measured or pod is None:
                continue
            out[name] = PodUsage(
                name=name,
                role=pod.role,
                index=pod.index,
                cpu_cores=cores,
                memory_mb=rss,
                cpu_requested=pod.cpu,
                memory_requested_mb=pod.memory_mb,
            )
        return out

    def failed(self, statuses: list[PodStatus]) -> PodStatus | None:
        """The first failed pod, leaving out the ones this master stopped on purpose."""
        return next(
            (s for s in statuses if s.phase is PodPhase.FAILED and s.name not in self.stopping),
            None,
        )

    def kill_frozen(self, frozen: FrozenPs) -> str:
        """Kill a frozen PS at once (a stopped process cannot act on SIGTERM, and no cleanup
        may wait on it), record the failure event, and return its detail."""
        self.stopping.add(frozen.pod)
        self.backend.delete(frozen.pod, grace_s=0.0)
        detail = f"{frozen.detail}: killed"
        t = self.t()  # after the probe
        self.events.append(
            JobEvent(time=round(t, 3), kind="failure", node=frozen.pod, detail=detail)
        )
        return detail

    # -- observation ---------------------------------------------------------------------------

    def _sample(
        self, state: MasterState, t: float, last: tuple[float, int, float]
    ) -> tuple[float, int, float]:
        samples, steps, loss_sum, _ = state.totals()
        t0, s0, l0 = last
        rate = (samples - s0) / (t - t0) if t > t0 else 0.0
        loss = round((loss_sum - l0) / (samples - s0), 6) if samples > s0 else None
        usage = {u.name: u for u in self.backend.usage()}
        self._backend_measured |= set(usage)
        usage |= self._self_reported(state, self._backend_measured)
        with state.lock:
            per_worker = {name: st.samples for name, st in state.workers.items()}
        nodes = []
        for u in usage.values():
            nodes.append(
                NodeSample(
                    name=u.name,
                    role=u.role,
                    cpu_used=round(max(0.0, u.cpu_cores), 3),
                    cpu_requested=u.cpu_requested,
                    memory_used_mb=math.ceil(u.memory_mb),
                    memory_requested_mb=u.memory_requested_mb,
                    throughput=(
                        round(self._worker_rate(u.index, per_worker, t), 1)
                        if u.role == "worker"
                        else None
                    ),
                    cpu_throttled=u.cpu_throttled,
                )
            )
        self.samples.append(
            RuntimeSample(
                time=round(t, 3),
                global_step=steps,
                throughput=round(max(0.0, rate), 1),
                workers=self.workers.count,
                ps=self.ps.count,
                worker_cpu=self.workers.cpu,
                ps_cpu=self.ps.cpu,
                nodes=tuple(nodes),
                loss=loss,
            )
        )
        self.reserve.add(self.samples[-1])
        try:
            self._journal()
        except UserInputError as exc:  # a full disk, say: the run goes on without its journal
            if not self._journal_failed:
                log.warning("%s; a master started again will miss the events since", exc)
            self._journal_failed = True
        return t, samples, loss_sum

    def _journal(self, *, finished: bool = False) -> None:
        """The run file: which run this directory holds, and its events so far. A master killed
        between two checkpoints loses its timeline since the last one with it; a master started
        again takes the events from here (see :attr:`journalled`). ``finished``: the run has
        ended and its ``profile.json`` is written (:data:`~dlrover_kfp.runtime.runfile.
        FINISHED`)."""
        document: dict[str, Any] = {
            "run_id": self.run_id,
            "job": self.spec.name,
            "started_wall": self.started_wall,
            "inputs": self.inputs,
            "events": [to_dict(e) for e in self.events],
        }
        if finished:
            document[FINISHED] = True
        write_atomic(self.output_dir / RUN_FILE, json.dumps(document) + "\n")

    def rebase_rates(self, state: MasterState, t: float) -> None:
        """Each worker's rate counts from what it has reported by ``t``: counts restored from
        a checkpoint (a resumed run, a rollback) were not trained in the next interval."""
        with state.lock:
            reported = {NodeId.from_key(key): stats.samples for key, stats in state.workers.items()}
        self._worker_last = {
            node.index: (t, samples)
            for node, samples in reported.items()
            if node is not None and node.role == "worker"
        }

    def next_checkpoint_step(self, state: MasterState) -> int:
        """The step a new checkpoint is written as: the job's global step, but above every
        step a checkpoint was started as before. Two checkpoints of one step would share one
        ``step-N.tmp`` directory (a PS switch's old PS and the new ones, say), and after a
        rollback the global step is below steps already written."""
        trained = state.totals()[1]
        self._checkpoint_step = max(trained, self._checkpoint_step + 1)
        self._checkpoint_trained = trained
        return self._checkpoint_step

    def restored_at(self, state: MasterState, step: int) -> None:
        """The job was restored from the checkpoint of ``step`` (a resume, a rollback): what
        is trained from here is new since it, and later checkpoints go above it."""
        self._checkpoint_step = max(self._checkpoint_step, step)
        self._checkpoint_trained = state.totals()[1]

    def _worker_rate(self, index: int, per_worker: dict[str, int], t: float) -> float:
        done = per_worker.get(NodeId.worker(index).key, 0)
        t0, s0 = self._worker_last.get(index, (0.0, 0))
        self._worker_last[index] = (t, done)
        return (done - s0) / (t - t0) if t > t0 else 0.0

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> RunResult:
        if self.server is not None:
            raise RuntimeError("a JobRun runs once")
        # The Prometheus endpoint lives exactly as long as the run (runtime/metrics.py): a
        # port in use fails here, before anything is written or launched.
        with serve_metrics(self, self.settings):
            return self._run()

    def _run(self) -> RunResult:
        checkpoint_dir = self.checkpoint_dir
        if not self.resumed and checkpoint_dir.exists():
            # A new run owns its directory: an earlier run's checkpoints would be restored by
            # nothing, and one at the same step would stand in for this run's final one.
            shutil.rmtree(checkpoint_dir)
        self._journal()
        state = self.state
        if self.resume_from is not None:
            choice = self.resume_from
            with state.lock:
                self.restore_master(state, choice, cause="resume")
                done = sum(w.samples for w in state.workers.values())
            self.restored_at(state, choice.step)
            self.events.append(
                JobEvent(
                    time=round(self._earlier_s, 3),
                    kind="relaunch",
                    detail=f"master restarted: resumed from the checkpoint of step "
                    f"{choice.step:,} ({done:,} samples done)",
                )
            )
            self.progress(
                f"{self.run_id}: resuming from the checkpoint of step {choice.step:,} "
                f"({done:,} of {self.ledger.total_rows:,} samples done)"
            )
        elif self.resumed:
            self.progress(f"{self.run_id}: resuming from the start (no committed checkpoint)")
        service = MasterService(state, clock=self.clock.monotonic)
        server = self.server = Server(
            (self.settings.master_host, 0),
            self.secret,
            service.handle,
            on_disconnect=service.on_disconnect,
        )
        server.serve_in_thread(name="master")
        # A resumed run's clock goes on from where the earlier master's left off, so that its
        # samples, events and plans continue one timeline (t_resumed = t_now - start + earlier).
        self.start = self.clock.monotonic() - self._earlier_s
        status, reason = "failed", ""
        metrics = Metrics()
        model_dir: Path | None = None
        try:
            self.progress(f"{self.run_id}: pod limits: {self.backend.enforcement}")
            for k in range(self.ps.count):
                self.launch(NodeId("ps", k), self.ps)
            self.progress(
                f"{self.run_id}: starting {self.ps.count} PS "
                f"({self.ps.cpu:g} cpu, {self.ps.memory_mb} MiB each)"
            )

            def launch_workers() -> None:
                for k in range(self.workers.count):
                    self.launch(NodeId.worker(k), self.workers)
                self.progress(
                    f"{self.run_id}: {self.workers.count} workers ({self.workers.cpu:g} cpu, "
                    f"{self.workers.memory_mb} MiB each), {len(self.ledger.ranges)} shards x "
                    f"{self.ledger.epochs} epoch(s), {self.ledger.total_rows:,} rows to train"
                )

            preload_in_background()
            self.wait_for_ps(state, self.clock.monotonic(), launch_workers)
            self.coordinator = self.new_coordinator(state)
            self._train(state)
            self.policy.finish()
            self._final_checkpoint(state, self.next_checkpoint_step(state))
            try:
                self.coordinator.shutdown_ps()
            except (TimeoutError, ConnectionError) as exc:
                # The model is committed; a PS that does not take its stop is stopped by the
                # backend in the release below.
                log.warning("a PS did not take its shutdown (%s); it is stopped instead", exc)
            self._wait_for_exit(timeout_s=30.0)
            model_dir, metrics = evaluate_and_export(
                self.spec,
                checkpoint_dir,
                self.output_dir / "model",
                self.base_dir,
                self.eval_ranges,
                held_out_record(self.dataset, self.settings.eval_fraction, self.spec.data),
            )
            self._check_data()  # the held-out rows were read from the files it trained on
            samples, _, loss_sum, bad = state.totals()
            metrics = Metrics(
                loss=metrics.loss,
                auc=metrics.auc,
                eval_rows=metrics.eval_rows,
                train_loss=round(loss_sum / samples, 6) if samples else None,
                bad_rows=bad,
                applied_twice=self._applied_twice(state),
            )
            status = "succeeded"
        except JobFailedError as exc:
            reason = str(exc)
            self.progress(f"{self.run_id}: FAILED: {reason}")
        except UserInputError:
            # Refused before anything was saved (a pod the backend will not create, say): there
            # is nothing to resume, and the run file would refuse the corrected command as "an
            # unfinished run of other inputs" until --fresh.
            if not ckpt.list_checkpoints(self.checkpoint_dir):
                (self.output_dir / RUN_FILE).unlink(missing_ok=True)
            raise
        except KeyboardInterrupt:
            # A stop signal. A user's cancel ends the run here, with a profile that says so
            # (the run file is kept: running it again resumes); any other stop propagates and
            # leaves the run resumable and unrecorded (runtime/cancel.py).
            cancelled = self.cancel_reason()
            if cancelled is None:
                raise
            status, reason = "cancelled", f"cancelled: {cancelled}"
            self.progress(f"{self.run_id}: CANCELLED: {cancelled}")
        finally:
            self._release(server)
        jct = self.t()
        samples, _, _, _ = state.totals()
        profile = self._profile(status, reason, jct, samples, metrics)
        written = self._write_profile(profile)
        # The run file stays, marked finished, until the profile is handed over (recorded or
        # kept pending: runtime/launch.py): a master killed before that is not a run to train
        # again; the same command records it. Without its profile on disk there is nothing to
        # hand over from there: the run file goes as before. A cancelled run keeps it as it is
        # (running it again resumes).
        if status != "cancelled" and not (written and self._mark_finished()):
            (self.output_dir / RUN_FILE).unlink(missing_ok=True)
        return RunResult(profile=profile, output_dir=self.output_dir, model_dir=model_dir)

    @property
    def earlier_s(self) -> float:
        """Seconds the run had been going before this master started (0 unless resumed): the
        time a resumed run's timeline goes on from."""
        return self._earlier_s

    def _mark_finished(self) -> bool:
        try:
            self._journal(finished=True)
        except UserInputError as exc:  # a full disk
            log.warning("%s: the run file cannot say the run finished", exc)
            return False
        return True

    def _write_profile(self, profile: JobProfile) -> bool:
        """``profile.json``, also on a full disk: no pod writes a checkpoint any more, so an
        unfinished ``step-N.tmp`` is a failed one and goes first; then the profile is written,
        from the run's reserve if the disk is full. The reserve is kept then (the history is
        often on the same disk; :func:`~dlrover_kfp.runtime.launch.record_run` releases it)."""
        ckpt.prune_checkpoints(
            self.output_dir / "checkpoints", self.settings.keep_checkpoints, all_tmp=True
        )
        path = self.output_dir / "profile.json"
        written = True
        try:
            write_atomic(path, to_json(profile) + "\n", reserve=self.reserve.path)
        except UserInputError as exc:
            self.progress(f"{self.run_id}: {exc}: the profile is not on disk")
            written = False
        if self.reserve.untouched():
            self.reserve.release()
        return written

    @signals.uninterruptible
    def _release(self, server: Server) -> None:
        """Stop the pods (their shared memory goes with them) and the master's server: the same
        on every way out (success, failure, Ctrl-C, SIGTERM, SIGHUP). Stop signals never
        interrupt it, and a step that fails does not skip the next (a second signal only cuts
        the pods' grace period short: :mod:`~dlrover_kfp.runtime.signals`)."""
        with contextlib.ExitStack() as steps:  # run last to first
            steps.callback(server.close)
            steps.callback(self.backend.close)
            if self._coordinator is not None:
                # The current one: an elastic run replaces it when it restarts the PS.
                steps.callback(self._coordinator.close)
            steps.callback(self.forward_events)  # the last events, while the backend is open

    def new_coordinator(
        self, state: MasterState, *, prune_tmp: bool = True
    ) -> CheckpointCoordinator:
        return CheckpointCoordinator(
            self.checkpoint_dir,
            [state.ps_addresses[k] for k in range(self.ps.count)],
            self.secret,
            keep=self.settings.keep_checkpoints,
            prune_tmp=prune_tmp,
        )

    def checkpoint_extra(self, state: MasterState) -> dict[str, Any]:
        """What goes with a checkpoint: the master's own state (:meth:`MasterState.committed`:
        the ledger and counts) and the policy's (an elastic run's shape and timeline)."""
        with state.lock:
            extra = state.committed()
        return {**extra, **self.policy.checkpoint_extra()}

    def check_committed(self, choice: ckpt.CheckpointChoice) -> None:
        """Raise :class:`~dlrover_kfp.training.checkpoint.CheckpointCorruptError` when the
        master state a checkpoint carries is not this run's (its shard ledger against the
        run's split: :meth:`ShardLedger.restored`); :func:`select_checkpoint` then takes an
        older one. A checkpoint without master state (none was written with it) passes."""
        if "shards" not in choice.extra:
            return
        try:
            ShardLedger.restored(choice.extra["shards"], self.ledger.ranges, self.ledger.epochs)
        except ValueError as exc:
            raise ckpt.CheckpointCorruptError(
                f"{choice.location}: the checkpoint's shard ledger is not this run's: {exc}"
            ) from None

    def restore_master(
        self,
        state: MasterState,
        choice: ckpt.CheckpointChoice | None,
        cause: str = "rollback",
    ) -> None:
        """Go back to ``choice`` (None: the job's start): the master's ledger and counts from
        it, and the PS started next told to restore exactly it; the shards PS 0 had part-applied
        then are put down to ``cause`` (core/applied.py). Call with ``state.lock`` held."""
        state.restore_committed(None if choice is None else choice.extra, self.ledger, cause)
        state.job_config["restore"] = choice is not None
        state.job_config["restore_choice"] = None if choice is None else choice.to_dict()

    def wait_for_ps(
        self, state: MasterState, start: float, launch_workers: Callable[[], None]
    ) -> None:
        """Until every PS serves (it registered its address), launching the workers as soon as
        every PS pod runs: a worker's start (the interpreter, torch) then overlaps the PS's
        instead of following it (about 3 s a run on two cores), and it waits for the PS set
        in its first request to the master. Waiting for the PS pods to run, not only to be
        created, keeps their place ahead of the workers on a cluster short of room.

        A PS that fails here goes to :meth:`_start_failed`, and so does one that froze before
        it serves (liveness.starting_ps_frozen, the rule a PS change judges its new PS by:
        silent, or loading past its budget): it is killed and relaunched as a failed one is,
        instead of the job waiting out its start-up timeout and failing. A worker that fails
        here is left to the training loop's failure handling, as one failing later would be."""
        launched = False
        running_since: dict[str, float] = {}
        while True:
            self.forward_events()
            statuses = self.backend.statuses()
            ps = [s for s in statuses if s.role == "ps"]
            with state.lock:
                registered = state.all_ps_registered
            running = sum(1 for s in ps if s.phase is PodPhase.RUNNING)
            if not launched and (registered or running >= self.ps.count):
                launch_workers()
                launched = True
            if registered:
                return
            failed = self.failed(ps) or self._frozen_at_start(state, ps, running_since)
            if failed is not None:
                self.policy.start_failed(failed)
                start = self.clock.monotonic()  # a relaunched PS gets the whole start-up time again
            if self.clock.monotonic() - start > self.settings.startup_timeout_s:
                # A PS no node has room for says why (the scheduler's message).
                unplaced = "".join(
                    f"; {s.name} pending: {s.message}"
                    for s in ps
                    if s.phase is PodPhase.PENDING and s.message
                )
                raise JobFailedError(
                    f"the PS did not start within {self.settings.startup_timeout_s:.0f}s{unplaced}"
                )
            self.clock.sleep(0.05)

    def _frozen_at_start(
        self, state: MasterState, ps: Sequence[PodStatus], running_since: dict[str, float]
    ) -> PodStatus | None:
        """A PS pod that runs, has not registered, and is frozen by
        :func:`~dlrover_kfp.runtime.liveness.starting_ps_frozen`: killed (a frozen process
        ignores SIGTERM), and returned as a failed pod whose message says why."""
        now = self.clock.monotonic()
        with state.lock:
            serving = set(state.ps_addresses)
            generation = state.generation
        for pod in ps:
            if pod.phase is not PodPhase.RUNNING or pod.index in serving:
                continue
            key = f"{pod.name}@{pod.started_at}"
            since = running_since.setdefault(key, now)
            node = NodeId("ps", pod.index, generation)
            why = starting_ps_frozen(
                now=now,
                running_since=since,
                heard=state.last_heard(node),
                loading=state.loading_since(node),
                cpu=self.ps.cpu,
                silent_s=START_SILENT_S,
            )
            if why is None:
                continue
            self.backend.delete(pod.name, grace_s=0.0)
            state.forget_reports(node)  # its relaunch is judged on its own words
            why = f"frozen before it served: {why}"
            return replace(pod, phase=PodPhase.FAILED, reason="Error", message=why)
        return None

    def _wait_for_exit(self, timeout_s: float) -> None:
        """Let the pods finish on their own (the PS exit after ``shutdown``) before cleanup."""
        self._until_ended(None, timeout_s)

    def wait_for_terminal(self, names: Collection[str], timeout_s: float = 30.0) -> None:
        """Until the pods ``names`` have ended; those still running after ``timeout_s`` are
        stopped."""
        if not self._until_ended(set(names), timeout_s):
            for name in names:
                self.stop(name)

    def _until_ended(self, names: Collection[str] | None, timeout_s: float) -> bool:
        """Whether the pods ``names`` (None: every pod) ended within ``timeout_s``."""
        deadline = self.clock.monotonic() + timeout_s
        while self.clock.monotonic() < deadline:
            statuses = self.backend.statuses()
            if all(s.phase.terminal for s in statuses if names is None or s.name in names):
                return True
            self.clock.sleep(0.05)
        return False

    def _show_progress(self, state: MasterState) -> None:
        """The progress line of the newest sample."""
        total = self.ledger.total_rows
        trained, steps, loss_sum, _ = state.totals()
        recent = self.samples[-1].throughput
        loss = f"{loss_sum / trained:.4f}" if trained else "-"
        if isinstance(self.progress, Meter):
            self.progress.advance(trained, total)
        self.progress(
            f"[{100 * trained / total:5.1f}%] {trained:,}/{total:,} samples  "
            f"{recent:,.0f} samples/s  step {steps:,}  loss {loss}  "
            f"eta {_eta(trained, total, recent)}"
        )

    def forward_events(self) -> None:
        """Tell the cluster the events recorded since the last call (as Kubernetes Events on
        their pods); called at every turn of the master's loops and once at the end."""
        self._told.forward(self.events)

    def describe_failure(self, pod: PodStatus) -> str:
        """The pod, how it ended and, when its output says, why (its last error line)."""
        why = f": {pod.message}" if pod.message else ""
        return f"pod {pod.name} {pod.reason or 'failed'} (exit code {pod.exit_code}){why}"

    def _train(self, state: MasterState) -> None:
        s = self.settings
        t0 = self.t()
        # Rates are over what this master saw: a resumed run's restored counts are not new.
        trained, _, loss_sum, _ = state.totals()
        last_sample = (t0, trained, loss_sum)
        self.rebase_rates(state, t0)
        next_sample = t0 + s.sample_interval_s
        next_checkpoint = t0 + s.checkpoint_interval_s if s.checkpoint_interval_s > 0 else math.inf
        finished_at: float | None = None  # when the last shard was done
        while True:
            self.clock.sleep(0.1)
            self.forward_events()  # those of the previous turn
            t = self.t()
            statuses = self.backend.statuses()
            self.policy.handle_failures(statuses, t)
            # Done when every shard is done and no worker is still running (each exits once
            # it gets no more shards; a failed one was handled above).
            running = [s_ for s_ in statuses if s_.role == "worker" and not s_.phase.terminal]
            with state.lock:
                done = state.ledger.finished
                stuck = not done and not state.ledger.todo and not state.ledger.doing
            if stuck:
                # Nothing to lease and nothing leased, yet the epoch is not done: no worker
                # could ever finish it (a ledger no check caught). Fail, never wait forever.
                raise JobFailedError(
                    f"shard ledger: nothing left to train but epoch {state.ledger.epoch + 1} of "
                    f"{state.ledger.epochs} is not done ({len(state.ledger.done)} of "
                    f"{len(state.ledger.ranges)} shards); the run cannot finish"
                )
            if done and running:
                finished_at = t if finished_at is None else finished_at
                if t - finished_at > s.finish_grace_s:
                    self._stop_lingering(running, t - finished_at, t)
            if done and not running:
                # The last sample carries the run's final counts (the workers' last reports
                # can all come after the newest sample): taken unless that one is recent and
                # has them already.
                if (
                    not self.samples
                    or t - self.samples[-1].time > 0.5
                    or self.samples[-1].global_step != state.totals()[1]
                ):
                    self._sample(state, t, last_sample)
                    self._show_progress(state)  # a job shorter than one interval shows one
                return
            if t >= next_sample:
                self._check_data()
                last_sample = self._sample(state, t, last_sample)
                next_sample = t + s.sample_interval_s
                self._show_progress(state)
                self.policy.decide(t)
                # Applying a plan takes time: the next sample starts a fresh window.
                t = self.t()
                if self.samples and t - self.samples[-1].time > s.sample_interval_s:
                    trained, _, loss_sum, _ = state.totals()
                    last_sample = (t, trained, loss_sum)
                    next_sample = t + s.sample_interval_s
            failure = self.coordinator.take_failure()
            if failure is not None:
                self._checkpoint_failed(failure, t)
            if t >= next_checkpoint:
                # Nothing trained since the last one (workers paused, say): nothing to save.
                fresh = state.totals()[1] != self._checkpoint_trained
                if fresh and not self.coordinator.busy:
                    steps = self.next_checkpoint_step(state)
                    self.coordinator.checkpoint(
                        steps, extra=self.checkpoint_extra(state), wait=False
                    )
                    self.progress(f"flash checkpoint of step {steps:,} started")
                next_checkpoint = t + s.checkpoint_interval_s

    def _check_data(self) -> None:
        """Fail the run when a data file changed under it (rewritten, appended to, removed):
        its shards are row ranges of the files as they were, so the rows trained since would
        be others than the ledger counts; a stat per file per sample is cheap."""
        now = data_files(self.dataset, now=True)
        changed = [
            f"{key[len('data.file[') : -1]} ({self.inputs.get(key)} -> {value})"
            for key, value in now.items()
            if self.inputs.get(key) != value
        ]
        if changed:
            raise JobFailedError(
                f"data: {'; '.join(changed)} changed during the run; the rows trained are no "
                "longer the rows counted: run again with --fresh to train the new data"
            )

    def _stop_lingering(self, running: list[PodStatus], idle_s: float, t: float) -> None:
        """Workers still running ``idle_s`` after the last shard was done: nothing is left for
        them, so each is frozen or stuck; stop it, and say so in the profile."""
        for pod in running:
            self.stopping.add(pod.name)
            self.backend.delete(pod.name)
            detail = (
                f"still running {idle_s:.0f}s after every shard was done (frozen or stuck): stopped"
            )
            self.events.append(
                JobEvent(time=round(t, 3), kind="straggler", node=pod.name, detail=detail)
            )
            self.progress(f"{self.run_id}: {pod.name}: {detail}")

    def _applied_twice(self, state: MasterState) -> dict[str, int] | None:
        """Samples whose gradients PS 0 applied more than once, by why their shard was trained
        again (core/applied.py), from the tally committed with the final checkpoint; None when
        that checkpoint carries none (no PS 0 counted)."""
        extra = self.coordinator.committed_extra
        if extra is None or "applied" not in extra:
            return None
        twice = AppliedTally.from_dict(extra["applied"]).applied_twice(finished=True)
        with state.lock:
            return by_cause(twice, state.requeued)

    def _final_checkpoint(self, state: MasterState, step: int) -> None:
        """The checkpoint the model is exported from. A write error (a full disk) is retried
        a few times, since space may come back; then the run fails with the reason, its
        profile written and the last committed checkpoint kept for a resumed run."""
        delay = 1.0
        for attempt in range(1, FINAL_CHECKPOINT_ATTEMPTS + 1):
            try:
                self.coordinator.checkpoint(step, extra=self.checkpoint_extra(state))
                return
            except ckpt.CheckpointWriteError as exc:
                self._checkpoint_failed(exc, self.t())
                if attempt == FINAL_CHECKPOINT_ATTEMPTS:
                    raise JobFailedError(
                        f"the final checkpoint of step {step:,} failed {attempt} times ({exc}); "
                        f"the committed ones stay in {self.checkpoint_dir}"
                    ) from None
                self.clock.sleep(delay)
                delay *= 2
            except (TimeoutError, ConnectionError) as exc:
                # A PS that froze or went away after the last shard: no answer within the
                # master's bounded RPC time (runtime/checkpoints.py), so no model to export.
                self._checkpoint_failed(exc, self.t())
                raise JobFailedError(
                    f"the final checkpoint of step {step:,}: a PS did not answer ({exc})"
                ) from None

    def _checkpoint_failed(self, failure: BaseException, t: float) -> None:
        """A periodic checkpoint failed (a full disk, a PS gone mid-write): training goes on,
        and a restore uses the last committed checkpoint; the profile says so."""
        committed = ckpt.list_checkpoints(self.checkpoint_dir)
        kept = (
            f"the checkpoint of step {committed[0]:,} stays the one to restore"
            if committed
            else "no checkpoint is committed yet"
        )
        detail = f"checkpoint failed: {failure}; {kept}"
        self.events.append(JobEvent(time=round(t, 3), kind="failure", detail=detail))
        self.progress(f"{self.run_id}: {detail}")

    def _profile(
        self, status: str, reason: str, jct: float, samples: int, metrics: Metrics
    ) -> JobProfile:
        started = datetime.fromtimestamp(self.started_wall, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return JobProfile(
            run_id=self.run_id,
            started_at=started,
            job=profile_job(self.spec, rows=self.dataset_rows),
            plans=self.policy.applied_plans(),
            samples=tuple(self.samples),
            events=tuple(self.events),
            outcome=Outcome(
                status=(
                    "succeeded"
                    if status == "succeeded"
                    else "cancelled"
                    if status == "cancelled"
                    else "failed"
                ),
                jct_seconds=round(jct, 3),
                samples_processed=samples,
                reason=reason,
            ),
            metrics=metrics,
            limits=LimitEnforcement(cpu=self.backend.cpu_enforced, detail=self.backend.enforcement),
        )


def static_run(
    spec: JobSpec,
    backend: ClusterBackend,
    options: RunOptions,
    *,
    progress: Progress | None = None,
    clock: Clock | None = None,
) -> JobRun[StaticPolicy]:
    """A run of ``spec`` at its own resources (``resources.workers``/``resources.ps``)."""
    return JobRun(
        spec,
        backend,
        options,
        groups=static_groups(spec),
        policy=StaticPolicy,
        progress=progress,
        clock=clock,
    )


__all__ = [
    "JobFailedError",
    "JobRun",
    "Meter",
    "Progress",
    "RunPolicy",
    "RunResult",
    "StaticPolicy",
    "static_groups",
    "static_run",
    "trainer_pod",
]
