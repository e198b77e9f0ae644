"""Seeded fault schedules and the checks every chaos run must pass.

A schedule is drawn from a seed alone (``random.Random(seed)``), so a failing run is replayed
exactly by its seed: which faults, on which pod, how long after training started. The injector
applies them from outside the job, as the world would: signals to the pods' processes, a
process exec'd into a pod that eats memory, the CFS quota of a PS's cgroup cut to a tenth, the
checkpoint disk filled. It never calls into the job master.

After the run the checks are the ones a user relies on, derived from the data and the fault-free
run, not from the code under test:

* samples processed = rows x epochs minus the held-out rows, exactly (counted from the dataset);
* no shard DONE twice: the ledger's rows done equal its total rows (once every shard of every
  epoch is done, a shard done twice would add its rows again);
* the held-out loss within ``LOSS_TOLERANCE`` of a fault-free run's;
* every fault injected is an event of the profile, naming the pod it hit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

import pytest

from dlrover_kfp.backends import LocalBackend
from dlrover_kfp.core.documents import load_text, parse
from dlrover_kfp.core.plan import ResourcePlan, Stage
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.core.planner.settings import NodeLimits
from dlrover_kfp.core.profile import JobEvent, JobProfile, RuntimeSample
from dlrover_kfp.core.spec import JobSpec
from dlrover_kfp.ports import PodPhase, PodStatus
from dlrover_kfp.runtime.elastic import ElasticPolicy, elastic_run
from dlrover_kfp.runtime.job import JobRun, RunResult
from dlrover_kfp.runtime.options import RunOptions, RunSettings
from dlrover_kfp.training.data import split_ranges
from dlrover_kfp.training.datasets import open_dataset

#: Held-out log-loss a faulty run may differ by from the fault-free run's. Asynchronous PS
#: training is not deterministic even without faults (workers interleave their pushes
#: differently every run); a rollback retrains the shards done after the checkpoint, whose
#: pushes the restored PS had not kept, and a killed worker's unreported shard is retrained.
LOSS_TOLERANCE = 0.02


class Fault(StrEnum):
    """What the injector can do to a running job."""

    WORKER_KILL = "worker-sigkill"
    PS_KILL = "ps-sigkill"
    WORKER_STOP = "worker-sigstop"
    WORKER_MEMORY = "worker-memory"
    PS_THROTTLE = "ps-throttle"
    DISK_FULL = "disk-full"
    #: Kubernetes only: the kubelet evicts a pod (node pressure) or a scheduler preempts it.
    WORKER_EVICT = "worker-evicted"
    PS_PREEMPT = "ps-preempted"
    #: The job master SIGKILLed, then the same run started again on its output directory
    #: (:func:`run_chaos_with_master_kills`: the master runs in a process of its own).
    MASTER_KILL = "master-sigkill"


#: What the profile must say about each fault: (event kinds, accepted), the event naming the
#: pod that was hit (the disk has no pod: any checkpoint failure event).
EXPECTED_EVENTS: dict[Fault, tuple[str, ...]] = {
    Fault.WORKER_KILL: ("failure",),
    Fault.PS_KILL: ("failure",),
    Fault.WORKER_STOP: ("straggler",),
    Fault.WORKER_MEMORY: ("oom",),
    Fault.PS_THROTTLE: ("migration",),
    Fault.DISK_FULL: ("failure",),
    Fault.WORKER_EVICT: ("failure", "relaunch"),
    Fault.PS_PREEMPT: ("failure", "relaunch"),
    Fault.MASTER_KILL: ("relaunch",),
}

#: The faults that hit a PS (the others hit a worker, or the disk).
PS_FAULTS = (Fault.PS_KILL, Fault.PS_THROTTLE, Fault.PS_PREEMPT)


@dataclass(frozen=True, slots=True)
class Injection:
    """One fault of a schedule: once ``at`` of the job's rows are done, on pod ``index``.

    Progress, not seconds: the same schedule hits the same phase of the job on a fast machine
    and on a loaded one (a rollback sets progress back, so a later fault waits for it again).
    """

    at: float
    fault: Fault
    index: int


@dataclass
class Injected:
    """A fault as applied: the pod it hit (None for the disk) and when (run clock)."""

    fault: Fault
    pod: str | None
    at_s: float


def draw_schedule(
    seed: int,
    kinds: Sequence[Fault],
    count: int,
    *,
    workers: int,
    ps: int,
    span: tuple[float, float] = (0.05, 0.8),
) -> list[Injection]:
    """``count`` faults drawn from ``kinds`` with seed ``seed``, at progress points spread
    evenly over ``span`` with a random jitter (so each is mostly detected before the next;
    some still overlap a recovery)."""
    rng = random.Random(seed)
    lo, hi = span
    step = (hi - lo) / count
    out = []
    for k in range(count):
        fault = rng.choice(list(kinds))
        index = rng.randrange(ps if fault in PS_FAULTS else workers)
        at = round(lo + step * (k + rng.uniform(0.0, 0.5)), 3)
        out.append(Injection(min(at, LATEST.get(fault, at)), fault, index))
    return out


#: The latest point of progress at which a fault is injected, where a later one could outlast
#: the job before it is seen: a starved PS is judged over ``starved_ps_samples`` (2) settled
#: samples of a busy PS, which a relaunch elsewhere in the job restarts.
LATEST = {Fault.PS_THROTTLE: 0.5}


# -------------------------------------------------------------------------------- the job

MODEL = (
    "{embedding_dim: 8, table_sizes: [1000, 50, 7, 3000, 20000, 500], dense_features: 13, "
    "bottom_mlp: [32, 16, 8], top_mlp: [32, 1]}"
)

#: Quarter-core pods and second-long sampling, so a run is seconds; Stage 2 off (a resize would
#: make runs differ by more than their faults), Stage 3 and the relaunch policy on, a worker
#: hung after 5 s (its shards take ~0.5 s here; the default floor is a minute), a PS starved
#: after 2 telling samples of a second (default 3: a run this short has few between faults).
PLANNER = PlannerSettings(
    node=NodeLimits(min_cpu=0.25, cpu_step=0.25, min_memory_mb=512),
    auto_scale=dataclasses.replace(
        PlannerSettings().auto_scale,
        min_interval_s=8.0,
        min_samples=10_000,
        leave_start_z=math.inf,  # no early exit from the start plan either (issue 30)
    ),
    post_scale=dataclasses.replace(
        PlannerSettings().post_scale, hung_lease_min_s=5.0, starved_ps_samples=2
    ),
)


def chaos_spec(rows: int) -> JobSpec:
    """The chaos job: 2 workers and 2 PS of half a core, in a quota with a core to spare, so
    that a PS move starts its new pods beside the old ones (a live switch), as a job with room
    in its quota would; the reference run has the same quota."""
    text = f"""
name: chaos
model: {MODEL}
data: {{format: synthetic, rows: {rows}, seed: 11}}
training: {{batch_size: 512, learning_rate: 0.05}}
resources:
  limits: {{cpu: 3, memory: 16Gi}}
  workers: {{count: 2, cpu: 0.5, memory: 1Gi}}
  ps: {{count: 2, cpu: 0.5, memory: 1536Mi}}
"""
    return parse(JobSpec, load_text(text, "chaos"), "chaos")


def trained_rows(spec: JobSpec, settings: RunSettings) -> int:
    """rows x epochs minus the held-out rows, from the data itself (not from the run)."""
    dataset = open_dataset(spec.data, spec.model)
    train, _ = split_ranges(dataset.source_rows, settings.shard_rows, settings.eval_fraction)
    return sum(r.end - r.start for r in train) * spec.training.epochs


#: A worker still running 5 s after the last shard is done is stopped (default 30 s).
#: Rows of the chaos job: ~10-20 s of training on two busy cores.
ROWS = 600_000

#: A checkpoint a second: the faults wait for the first one to be committed, which then comes
#: early in the run (a run trains its rows in 5-10 s).
SETTINGS = RunSettings(sample_interval_s=1.0, checkpoint_interval_s=1.0, finish_grace_s=5.0)

#: How long a fault waits for its pod to run again when an earlier fault is still being
#: recovered from (a relaunch: a pod's start is 3-6 s on two busy cores).
RELAUNCH_WAIT_S = 30.0


# --------------------------------------------------------------------------- the injector

#: Memory written as fast as the kernel gives it, every page touched: the pod's cgroup hits its
#: limit within seconds, as a leaking data loader would.
EAT_MEMORY = (
    "import time\n"
    "chunks = []\n"
    "while True:\n"
    "    chunks.append(b'x' * (64 << 20))\n"
    "    time.sleep(0.02)\n"
)


def _cgroup_cpu_dir(pid: int) -> Path | None:
    """The cgroup directory that holds the CPU quota of process ``pid`` (v2 or v1)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            candidate = Path("/sys/fs/cgroup") / path.lstrip("/")
            if (candidate / "cpu.max").exists():
                return candidate
        elif "cpu" in controllers.split(","):
            for mount in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
                candidate = Path("/sys/fs/cgroup") / mount / path.lstrip("/")
                if (candidate / "cpu.cfs_quota_us").exists():
                    return candidate
    return None


def throttle(pid: int, fraction: float) -> bool:
    """Cut the CFS quota of ``pid``'s cgroup to ``fraction`` of what it is (a noisy neighbour
    or an admin's mistake, from outside the job). False where the quota cannot be written."""
    directory = _cgroup_cpu_dir(pid)
    if directory is None:
        return False
    try:
        if (directory / "cpu.max").exists():
            quota, period = (directory / "cpu.max").read_text().split()
            if quota == "max":
                return False
            new = max(1000, int(int(quota) * fraction))
            (directory / "cpu.max").write_text(f"{new} {period}\n")
        else:
            quota = int((directory / "cpu.cfs_quota_us").read_text())
            if quota <= 0:
                return False
            (directory / "cpu.cfs_quota_us").write_text(f"{max(1000, int(quota * fraction))}\n")
    except OSError:
        return False
    return True


class Pods(Protocol):
    """What the injector needs of where the pods run: the local backend, or the fake kubelet
    of a Kubernetes run (which also evicts and preempts)."""

    def pid_of(self, name: str) -> int | None: ...

    def exec_in(self, name: str, argv: Sequence[str]) -> object: ...

    def evict(self, name: str) -> None: ...

    def preempt(self, name: str) -> None: ...


@dataclass
class Injector:
    """Applies a schedule to a running elastic :class:`JobRun` on a :class:`LocalBackend`."""

    schedule: Sequence[Injection]
    #: fills the checkpoint disk for :attr:`Fault.DISK_FULL` (and frees it after a while)
    fill_disk: Callable[[], Callable[[], None]] | None = None
    injected: list[Injected] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    error: BaseException | None = None
    #: pods' main processes given the memory eater
    _eating: set[int] = field(default_factory=set)
    #: each memory fault, with the start time of the pod it was exec'd into
    _eaters: list[tuple[Injected, float | None]] = field(default_factory=list)

    def settle(self, statuses: Sequence[PodStatus]) -> None:
        """After the run: a memory fault whose pod then finished its work (exit 0, the same
        pod: its start time) had no effect. The eater shares the pod's CPU quota and takes
        seconds to reach the limit on a loaded machine; near the job's end the pod can finish
        first. It is a skipped fault, with that reason, not an injected one."""
        final = {st.name: st for st in statuses}
        for fault, started in self._eaters:
            st = final.get(fault.pod or "")
            if st is not None and st.started_at == started and st.phase is PodPhase.SUCCEEDED:
                self.injected.remove(fault)
                self.skipped.append(
                    f"{fault.fault} on {fault.pod}: no effect, the pod finished its work "
                    "(exit 0) before the eater reached its limit"
                )

    def __call__(self, run: JobRun[ElasticPolicy], backend: Pods) -> None:
        try:
            self._inject(run, backend)
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.error = exc

    def _inject(self, run: JobRun[ElasticPolicy], backend: Pods) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            committed = (
                [p for p in run.checkpoint_dir.glob("step-*") if not p.name.endswith(".tmp")]
                if hasattr(run, "checkpoint_dir")
                else []
            )
            if committed and run.samples and run.samples[-1].throughput > 0:
                break
            time.sleep(0.05)
        job = run.spec.name
        for injection in self.schedule:
            while True:
                with run.state.lock:
                    ledger = run.state.ledger
                    finished, done = ledger.finished, ledger.rows_done / ledger.total_rows
                if finished or done >= injection.at:
                    break
                time.sleep(0.02)
            if finished:
                self.skipped.append(f"{injection.fault} at {injection.at:.0%}: job finished")
                break
            self._apply(run, backend, job, injection)

    def _live_pod(self, run: JobRun[ElasticPolicy], role: str, index: int) -> PodStatus | None:
        """The running pod of that role and index (a PS moved or restored has a new name)."""
        return next(
            (
                st
                for st in run.backend.statuses()
                if st.role == role and st.index == index and not st.phase.terminal
            ),
            None,
        )

    def _await_pod(self, run: JobRun[ElasticPolicy], backend: Pods, role: str, index: int) -> None:
        """Until that pod runs (and is not stopped), for up to RELAUNCH_WAIT_S: a fault that
        comes while an earlier one's pod is relaunched hits the new pod, as it would in a
        cluster, instead of being skipped."""
        deadline = time.monotonic() + RELAUNCH_WAIT_S
        while time.monotonic() < deadline:
            live = self._live_pod(run, role, index)
            if live is not None and _live_pid(backend, live.name) is not None:
                return
            with run.state.lock:
                if run.state.ledger.finished:
                    return
            time.sleep(0.05)

    def _apply(self, run: JobRun[ElasticPolicy], backend: Pods, job: str, inj: Injection) -> None:
        role = "ps" if inj.fault in PS_FAULTS else "worker"
        if inj.fault is not Fault.DISK_FULL:
            self._await_pod(run, backend, role, inj.index)
        t = time.monotonic() - run.start
        live = self._live_pod(run, role, inj.index)
        pod = live.name if live is not None else f"{job}-{role}-{inj.index}"
        if inj.fault is Fault.DISK_FULL:
            assert self.fill_disk is not None
            free = self.fill_disk()
            self.injected.append(Injected(inj.fault, None, t))
            # Full until a checkpoint has failed on it, and 2 s more (the next fault of the
            # schedule comes while it is still full), then freed.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(
                e.kind == "failure" and "checkpoint failed" in e.detail for e in list(run.events)
            ):
                time.sleep(0.05)
            threading.Timer(2.0, free).start()
            return
        if inj.fault is Fault.PS_THROTTLE and any(
            i.fault is Fault.PS_THROTTLE and i.pod == pod for i in self.injected
        ):
            self.skipped.append(f"{inj.fault} on {pod}: throttled already")
            return
        if any(e.kind == "migration" and e.node == pod for e in list(run.events)):
            # Stage 3 moves this PS to a new pod already; the old one only waits to be retired.
            self.skipped.append(f"{inj.fault} on {pod}: being moved to a new pod")
            return
        pid = _live_pid(backend, pod)
        if pid is None:
            self.skipped.append(f"{inj.fault} on {pod}: not running")
            return
        if pid in self._eating:
            # The memory eater takes a second or two to reach the limit: a second fault in
            # that time ends the same pod, which dies once, with one reason (OOMKilled or
            # Error, whichever came first) and one event.
            self.skipped.append(f"{inj.fault} on {pod}: already running out of memory")
            return
        if inj.fault in (Fault.WORKER_KILL, Fault.PS_KILL):
            os.kill(pid, signal.SIGKILL)
        elif inj.fault is Fault.WORKER_STOP:
            os.kill(pid, signal.SIGSTOP)
        elif inj.fault is Fault.WORKER_MEMORY:
            backend.exec_in(pod, (sys.executable, "-c", EAT_MEMORY))
            self._eating.add(pid)
            self._eaters.append((Injected(inj.fault, pod, t), live.started_at if live else None))
        elif inj.fault in (Fault.WORKER_EVICT, Fault.PS_PREEMPT):
            if inj.fault is Fault.WORKER_EVICT:
                backend.evict(pod)
            else:
                backend.preempt(pod)
        elif inj.fault is Fault.PS_THROTTLE and not throttle(pid, 0.1):
            self.skipped.append(f"{inj.fault} on {pod}: the CPU quota cannot be written")
            return
        self.injected.append(Injected(inj.fault, pod, t))


def _live_pid(backend: Pods, pod: str) -> int | None:
    """The pod's process if it is running and not stopped (a stopped one is a fault already)."""
    pid = backend.pid_of(pod)
    if pid is None:
        return None
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return None if state in ("T", "t", "Z", "X") else pid


# ----------------------------------------------------------------------------- the checks


@dataclass
class ChaosOutcome:
    """What one chaos run measured, for the assertions and the suite's summary line."""

    seed: int
    injected: list[Injected]
    skipped: list[str]
    expected_samples: int
    samples: int
    rows_done: int
    total_rows: int
    loss: float | None
    events: tuple[JobEvent, ...]
    unexplained: list[Injected]
    #: the profile's samples
    timeline: tuple[RuntimeSample, ...] = ()

    @property
    def samples_lost(self) -> int:
        return self.expected_samples - self.samples

    @property
    def shards_done_twice_rows(self) -> int:
        return self.rows_done - self.total_rows

    def line(self, reference_loss: float | None) -> str:
        kinds = Counter(str(i.fault) for i in self.injected)
        diff = (
            f"{abs(self.loss - reference_loss):.4f}"
            if self.loss is not None and reference_loss is not None
            else "-"
        )
        return (
            f"chaos seed {self.seed}: faults {dict(sorted(kinds.items()))}; samples "
            f"{self.samples:,} of {self.expected_samples:,} (lost {self.samples_lost}); rows "
            f"done twice {self.shards_done_twice_rows}; loss {self.loss} (diff {diff})"
        )


#: A rollback this soon after a pod's fault replaced the pod before the fault's own detection
#: (a frozen worker is seen after 5 s here, an OOM or a kill at once).
ROLLBACK_COVERS_S = 5.0
#: ... except a throttled PS, which the starved-PS rule sees only in samples of training (an
#: idle PS is never throttled, and the master takes no samples while it moves a PS): one
#: partial sample after the throttle, ``starved_ps_samples`` telling ones, and one more that a
#: change in between leaves out. A rollback before the master had that many samples of training
#: with the throttled PS in them replaced it before it could be seen.
THROTTLE_SEEN_AFTER = PLANNER.post_scale.starved_ps_samples + 2
#: A master SIGKILLed takes its samples since its last checkpoint with it, so for it the
#: bound is in time: the samples above take 6-10 s when no PS move comes between.
MASTER_KILL_COVERS_THROTTLE_S = 10.0


def _training_samples(
    timeline: Sequence[RuntimeSample], pod: str, after: float, until: float
) -> int:
    """Samples in (after, until] in which the job trained and ``pod`` was among the nodes."""
    return sum(
        1
        for x in timeline
        if after < x.time <= until and x.throughput > 0 and any(n.name == pod for n in x.nodes)
    )


def explained(
    injected: Sequence[Injected],
    events: Sequence[JobEvent],
    timeline: Sequence[RuntimeSample] = (),
) -> list[Injected]:
    """The injected faults that no event of the profile accounts for: an event of an expected
    kind naming the pod, at or after the fault (each event accounts for one fault); or, for a
    fault on a pod, a rollback or a master SIGKILL soon after it (a PS or the master lost:
    every pod of the job was replaced, the faulty one with them, before its own fault could be
    seen): within ``ROLLBACK_COVERS_S``, or for a throttled PS before ``THROTTLE_SEEN_AFTER``
    samples of ``timeline`` trained with it."""
    rollbacks = [e.time for e in events if "every PS restored from" in e.detail]
    # A master SIGKILLed replaces every pod too (they exit without it; the next master starts
    # new ones): a pod's fault it had no time to see is gone with the pod.
    kills = [f.at_s for f in injected if f.fault is Fault.MASTER_KILL]
    used: set[int] = set()
    missing = []
    for fault in injected:
        pod = fault.pod
        if pod is not None and fault.fault is Fault.PS_THROTTLE:
            covered = any(
                t >= fault.at_s - 1.0
                and _training_samples(timeline, pod, fault.at_s, t) < THROTTLE_SEEN_AFTER
                for t in rollbacks
            ) or any(
                fault.at_s - 1.0 <= t <= fault.at_s + MASTER_KILL_COVERS_THROTTLE_S for t in kills
            )
        else:
            covered = pod is not None and any(
                fault.at_s - 1.0 <= t <= fault.at_s + ROLLBACK_COVERS_S
                for t in [*rollbacks, *kills]
            )
        if covered:
            # Replaced with every pod before its fault was seen: no event of its own is due,
            # and none is taken from a later fault of the same pod.
            continue
        kinds = EXPECTED_EVENTS[fault.fault]
        match = next(
            (
                i
                for i, e in enumerate(events)
                if i not in used
                and e.kind in kinds
                and (fault.pod is None or e.node == fault.pod)
                and (fault.pod is not None or "checkpoint" in e.detail)
                and (fault.fault is not Fault.MASTER_KILL or "master restarted" in e.detail)
                and e.time >= fault.at_s - 1.0
            ),
            None,
        )
        if match is None:
            missing.append(fault)
        else:
            used.add(match)
    return missing


def run_chaos(
    seed: int,
    tmp_path: Path,
    schedule: Sequence[Injection],
    *,
    rows: int,
    out: Path | None = None,
    fill_disk: Callable[[], Callable[[], None]] | None = None,
    resume: bool = False,
    progress_file: Path | None = None,
) -> tuple[RunResult, ChaosOutcome]:
    """One elastic run of :func:`chaos_spec` with ``schedule`` applied while it trains, its
    output (checkpoints, model, profile) in ``out`` (default ``tmp_path/out``) and its pods'
    logs beside it, so that a full output disk does not stop the pods from logging."""
    spec = chaos_spec(rows)
    plan = ResourcePlan(
        workers=spec.resources.workers.to_group(),  # type: ignore[union-attr]
        ps=spec.resources.ps.to_group(),  # type: ignore[union-attr]
        stage=Stage.MANUAL,
        reason="the user's guess",
    )
    out = out or tmp_path / "out"
    injector = Injector(schedule, fill_disk=fill_disk)
    runs: list[JobRun[ElasticPolicy]] = []
    with LocalBackend(tmp_path / "logs") as backend:
        options = RunOptions(
            output_dir=out, base_dir=tmp_path, settings=SETTINGS, resume=resume, planner=PLANNER
        )
        run = elastic_run(spec, backend, options, plan=plan, progress=lambda line: None)
        runs.append(run)
        thread = threading.Thread(target=injector, args=(run, backend), daemon=True)
        if schedule:
            thread.start()
        if progress_file is not None:
            threading.Thread(
                target=_report, args=(run, injector, progress_file), daemon=True
            ).start()
        result = run.run()
        thread.join(timeout=10) if schedule else None
        injector.settle(backend.statuses())
    if injector.error is not None:
        raise injector.error
    outcome = measure(seed, injector, run, result)
    return result, outcome


def _report(run: JobRun[ElasticPolicy], injector: Injector, path: Path) -> None:
    """Every 50 ms, what the harness of a master in its own process needs to kill it at a
    point of progress and to account for its faults after: progress, the master's port, whether
    a checkpoint is committed, the run clock, and the faults injected so far."""
    while not hasattr(run, "state"):  # set once the run starts
        time.sleep(0.02)
    while True:
        with run.state.lock:
            ledger = run.state.ledger
            done = ledger.rows_done / ledger.total_rows
        committed = (
            any(not p.name.endswith(".tmp") for p in run.checkpoint_dir.glob("step-*"))
            if hasattr(run, "checkpoint_dir")
            else False
        )
        try:
            address = run.address
        except (AttributeError, RuntimeError):  # not serving yet (JobRun.run() starts it)
            address = None
        state = {
            "done": done,
            "t": time.monotonic() - run.start if hasattr(run, "start") else 0.0,
            "port": address[1] if address else None,
            "committed": committed,
            "injected": [[str(i.fault), i.pod, i.at_s] for i in injector.injected],
            "skipped": injector.skipped,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(path)
        time.sleep(0.05)


def measure(
    seed: int, injector: Injector, run: JobRun[ElasticPolicy], result: RunResult
) -> ChaosOutcome:
    """What a finished chaos run measured: its profile's counts and events, its ledger's rows
    done, against the rows the data itself says should be trained."""
    profile: JobProfile = result.profile
    with run.state.lock:
        ledger = run.state.ledger
        rows_done, total_rows = ledger.rows_done, ledger.total_rows
    return ChaosOutcome(
        seed=seed,
        injected=injector.injected,
        skipped=injector.skipped,
        expected_samples=trained_rows(run.spec, SETTINGS),
        samples=profile.outcome.samples_processed,
        rows_done=rows_done,
        total_rows=total_rows,
        loss=profile.metrics.loss,
        events=profile.events,
        timeline=profile.samples,
        unexplained=explained(injector.injected, profile.events, profile.samples),
    )


# ------------------------------------------------------------------------ master SIGKILL


def trainer_pids(port: int) -> list[int]:
    """Live trainer processes of the master that listened on ``port`` (from /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        text = [a.decode(errors="replace") for a in args if a]
        ours = any(f"127.0.0.1:{port}" in a for a in text)
        if state not in ("Z", "X") and "dlrover_kfp.training.node" in text and ours:
            pids.append(int(entry.name))
    return pids


def _remove_groups(pid: int) -> None:
    """rmdir the cgroups a SIGKILLed master's backend left (named after its pid)."""
    for parent in Path("/sys/fs/cgroup").glob(f"**/dlrover-kfp-{pid}-*"):
        for leaf in sorted(parent.rglob("*"), key=lambda q: -len(q.parts)):
            if leaf.is_dir():
                leaf.rmdir() if not any(leaf.iterdir()) else None
        with contextlib.suppress(OSError):
            parent.rmdir()


@dataclass
class MasterKillOutcome:
    """A run whose master was SIGKILLed and started again: each master's faults, and the last
    master's outcome over the whole run."""

    outcome: ChaosOutcome
    succeeded: bool
    #: seconds the killed master's pods took to notice and exit, per kill
    orphan_exit_s: list[float]


def run_chaos_with_master_kills(
    seed: int, tmp_path: Path, schedule: Sequence[Injection], *, rows: int
) -> MasterKillOutcome:
    """:func:`run_chaos` with the master in a process of its own (``tests.chaos.master_proc``),
    SIGKILLed at each :attr:`Fault.MASTER_KILL` of ``schedule`` (once a checkpoint is committed
    and that much progress is made), then started again with ``resume`` on the same output
    directory, as a user or a pipeline's retry would; the pod faults between two kills are
    the killed master's to inject."""
    out = tmp_path / "out"
    segments: list[tuple[list[Injection], Injection | None]] = []
    pending: list[Injection] = []
    for inj in schedule:
        if inj.fault is Fault.MASTER_KILL:
            segments.append((pending, inj))
            pending = []
        else:
            pending.append(inj)
    segments.append((pending, None))
    injected: list[Injected] = []
    skipped: list[str] = []
    orphans: list[float] = []
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    final: dict[str, object] = {}
    for n, (faults, kill) in enumerate(segments):
        here = tmp_path / f"master-{n}"
        here.mkdir(parents=True)
        progress, result_file = here / "progress.json", here / "outcome.json"
        args = {
            "seed": seed,
            "tmp": str(here),
            "out": str(out),
            "rows": rows,
            "resume": n > 0,
            "progress": str(progress),
            "outcome": str(result_file),
            "schedule": [[i.at, str(i.fault), i.index] for i in faults],
        }
        with open(here / "master.log", "wb") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.master_proc", json.dumps(args)],
                cwd=root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                if kill is None:
                    code = child.wait(timeout=600)
                    assert code == 0, (here / "master.log").read_text()[-4000:]
                    final = json.loads(result_file.read_text())
                    break
                state = _await_progress(child, progress, kill.at, here)
                child.send_signal(signal.SIGKILL)
                child.wait(timeout=30)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
        state = json.loads(progress.read_text())
        injected += [Injected(Fault(k), pod, at) for k, pod, at in state["injected"]]
        skipped += state["skipped"]
        injected.append(Injected(Fault.MASTER_KILL, None, float(state["t"])))
        # Its pods lose it at their next request (workers) or see its connection close (PS).
        killed_at = time.monotonic()
        while trainer_pids(state["port"]) and time.monotonic() < killed_at + 60:
            time.sleep(0.1)
        left = trainer_pids(state["port"])
        assert not left, f"the killed master's pods {left} kept running"
        orphans.append(time.monotonic() - killed_at)
        _remove_groups(child.pid)
    injected += [Injected(Fault(k), pod, at) for k, pod, at in final["injected"]]  # type: ignore[union-attr]
    skipped += final["skipped"]  # type: ignore[operator]
    events = tuple(parse(JobEvent, e, "profile") for e in final["events"])  # type: ignore[union-attr]
    timeline = tuple(parse(RuntimeSample, x, "profile") for x in final["timeline"])  # type: ignore[union-attr]
    outcome = ChaosOutcome(
        seed=seed,
        injected=injected,
        skipped=skipped,
        expected_samples=int(final["expected_samples"]),  # type: ignore[call-overload]
        samples=int(final["samples"]),  # type: ignore[call-overload]
        rows_done=int(final["rows_done"]),  # type: ignore[call-overload]
        total_rows=int(final["total_rows"]),  # type: ignore[call-overload]
        loss=final["loss"],  # type: ignore[arg-type]
        events=events,
        timeline=timeline,
        unexplained=explained(injected, events, timeline),
    )
    return MasterKillOutcome(outcome, bool(final["succeeded"]), orphans)


def _await_progress(
    child: subprocess.Popen[bytes], progress: Path, at: float, here: Path
) -> dict[str, object]:
    """Wait until the master in ``child`` has committed a checkpoint and done ``at`` of its
    rows (a kill before any checkpoint would only start the run over)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert child.poll() is None, (here / "master.log").read_text()[-4000:]
        with contextlib.suppress(OSError, ValueError):
            state: dict[str, object] = json.loads(progress.read_text())
            if state["committed"] and float(state["done"]) >= at:  # type: ignore[arg-type]
                return state
        time.sleep(0.02)
    raise AssertionError(f"the master did not reach {at:.0%} in 300 s")


# ------------------------------------------------------------------------------ full disk


@dataclass
class SmallDisk:
    """A tmpfs of ``size_mb`` mounted at ``path`` (root only): the job's output disk, which
    :meth:`fill` fills to the last byte until the function it returns frees it."""

    path: Path
    size_mb: int = 64

    def __enter__(self) -> SmallDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.path)],
            check=True,
            capture_output=True,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)

    def fill(self) -> Callable[[], None]:
        filler = self.path / "filler"
        with open(filler, "wb", buffering=0) as f:
            chunk = b"\0" * (1 << 20)
            try:
                while True:
                    f.write(chunk)
            except OSError:
                pass
            # The last bytes a 1 MiB write could not take.
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass

        def free() -> None:
            filler.unlink(missing_ok=True)

        return free


def mounted_small_disk(path: Path, size_mb: int) -> Iterator[SmallDisk]:
    """A :class:`SmallDisk` for a fixture to ``yield from``: mounted for the test, unmounted
    after it; the test is skipped, with the reason, where no tmpfs can be mounted (not root)."""
    disk = SmallDisk(path, size_mb=size_mb)
    try:
        disk.__enter__()
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(reason=f"cannot mount a tmpfs as the full disk (needs root): {exc}")
    try:
        yield disk
    finally:
        disk.__exit__()


def check(outcome: ChaosOutcome, reference: float) -> None:
    """The assertions every chaos run must pass (see the module docstring)."""
    print("\n" + outcome.line(reference))
    assert outcome.samples_lost == 0, outcome.line(reference)
    assert outcome.shards_done_twice_rows == 0, outcome.line(reference)
    assert outcome.loss is not None
    assert abs(outcome.loss - reference) <= LOSS_TOLERANCE, outcome.line(reference)
    events = "\n".join(f"  {e.time} {e.kind} {e.node} {e.detail[:120]}" for e in outcome.events)
    assert not outcome.unexplained, f"{outcome.unexplained}\nevents:\n{events}"
