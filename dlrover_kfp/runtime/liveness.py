"""Telling a frozen PS from a busy or an idle one.

A PS that is SIGSTOPped, hung, or on a node that stopped scheduling it neither fails nor exits:
its pod still reads *running*, its connections stay open, and every worker waits on it. The
job master finds it by two signs, both needed:

* **silence**: the pod reports its usage every ``USAGE_INTERVAL_S`` from a thread of its own
  (:func:`dlrover_kfp.training.node.report_usage`), whatever its main threads do, so a busy PS
  (serving, persisting a checkpoint) and an idle one (workers paused) both keep reporting;
* **no answer**: a probe (a new connection and a ``stats`` request) gets no answer within
  ``PROBE_TIMEOUT_S``. A PS whose reporting thread alone has stopped (its connection to the
  master broke) still answers, and is left alone.

A frozen PS is found within ``DETECT_S`` of its freezing: its last report came at most then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dlrover_kfp.core.node_id import NodeId
from dlrover_kfp.errors import DlroverKfpError
from dlrover_kfp.runtime.master import MasterState
from dlrover_kfp.training.master_protocol import USAGE_INTERVAL_S
from dlrover_kfp.training.wire import connect

log = logging.getLogger("dlrover_kfp.liveness")

#: Seconds without a usage report after which a PS is probed: two reports missed and a third
#: late (the worker rule's 2.5 intervals, runtime/elastic.py, plus half an interval, since
#: what follows for a PS is a rollback of the whole job, not a stopped worker).
SILENT_S = 3 * USAGE_INTERVAL_S
#: Seconds a probe waits for the PS's answer. A PS answers ``stats`` in milliseconds, after at
#: most the snapshot copy that holds its requests (~0.1 s per GiB); two report intervals leave
#: a busy node more than ten times that.
PROBE_TIMEOUT_S = 2 * USAGE_INTERVAL_S
#: Seconds from a PS's freezing to its detection, at most (its last report came before it).
DETECT_S = SILENT_S + PROBE_TIMEOUT_S


# -- a PS that has started but does not serve yet -----------------------------------------------

#: Seconds a starting PS (a new PS of a change, or one of the job's start) may run (its pod
#: started, by the backend) without a first word before it is frozen. Its supervisor says it
#: is loading before it loads the PS's code (training/node.py ``announce``): an interpreter
#: and the node module, ~0.3 s of CPU, 1.2 s in a quarter-core pod; five report intervals leave
#: a contended node eight times that. A pod still scheduled or pulling its image is not
#: running yet: the startup timeout
#: (startup_timeout_s, 180 s) covers that.
FIRST_REPORT_S = 5 * USAGE_INTERVAL_S
#: A loading PS (it said so, and nothing since) is frozen after :func:`load_budget_s`: the
#: CPU seconds its code takes to load (torch and the PS: 1.4 s measured on this project's
#: 2-vCPU VM, the supervisor's own log line says each pod's) times LOAD_MARGIN for a slower
#: CPU, a cold page cache and a node whose quota is not all delivered, over the pod's cores;
#: never under LOAD_MIN_S. A quarter-core PS gets 32 s, a half-core one 30 s, against the
#: 10 s of silence that used to abandon the change (three runs here: quickstart, an Airflow
#: day, the fake cluster).
LOAD_CPU_S = 1.4
LOAD_MARGIN = 6.0
LOAD_MIN_S = 30.0


def load_budget_s(cpu: float) -> float:
    """Seconds a PS pod of ``cpu`` cores may take to load its code:
    ``max(LOAD_MIN_S, LOAD_CPU_S · LOAD_MARGIN / cpu)``."""
    return max(LOAD_MIN_S, LOAD_CPU_S * LOAD_MARGIN / max(cpu, 1e-3))


#: Seconds a starting PS that has loaded its code (its own reports run) may stay silent
#: before it is frozen: two and a half report intervals, one late report of a busy process.
START_SILENT_S = 2.5 * USAGE_INTERVAL_S


def starting_ps_frozen(
    *,
    now: float,
    running_since: float,
    heard: float | None,
    loading: float | None,
    cpu: float,
    silent_s: float,
) -> str | None:
    """Why a PS pod that runs but does not serve yet (a new PS of a change, a PS of the job's
    start) is frozen, or None: no word for FIRST_REPORT_S since it ran; loading its code (it
    said so) for more than :func:`load_budget_s` of ``cpu``; or, its code loaded, no usage
    report for ``silent_s``. Times are the master's clock. The one rule for both waits
    (runtime/ps_change.py, runtime/job.py ``wait_for_ps``)."""
    if heard is None:
        if now - running_since > FIRST_REPORT_S:
            return f"no usage report within {now - running_since:.1f}s of its start"
        return None
    if loading is not None:
        budget = load_budget_s(cpu)
        if now - loading > budget:
            return (
                f"still loading its code {now - loading:.1f}s after it said so (budget "
                f"{budget:.0f}s at {cpu:g} cpu)"
            )
        return None
    if now - heard > silent_s:
        return f"no usage report for {now - heard:.1f}s"
    return None


@dataclass(frozen=True, slots=True)
class WatchedPs:
    """A PS of the job as the watch sees it: its index, its generation (the key of its usage
    reports) and its pod's name."""

    index: int
    generation: int
    pod: str


@dataclass(frozen=True, slots=True)
class FrozenPs:
    pod: str
    index: int
    #: seconds since its last sign of life (a usage report, an answered probe, its start)
    silent_s: float

    @property
    def detail(self) -> str:
        return (
            f"frozen: no usage report for {self.silent_s:.1f}s and no answer to a probe "
            f"within {PROBE_TIMEOUT_S:g}s"
        )


def probe(address: tuple[str, int], secret: bytes, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the PS at ``address`` answers a ``stats`` request within ``timeout_s``."""
    try:
        with connect(address, secret, timeout=timeout_s) as conn:
            conn.request("stats")
    except (DlroverKfpError, OSError):
        return False
    return True


class PsWatch:
    """Which of the job's PS are frozen; call :meth:`frozen` from the master's loop."""

    def __init__(
        self,
        state: MasterState,
        secret: bytes,
        clock: Callable[[], float],
        answers: Callable[[tuple[str, int], bytes], bool] = probe,
    ) -> None:
        self.state = state
        self.secret = secret
        self.clock = clock
        self.answers = answers
        #: per pod, when the watch first saw it (its baseline before any report)
        self._since: dict[str, float] = {}
        #: per pod, when it last answered a probe
        self._answered: dict[str, float] = {}

    def frozen(self, ps: Mapping[int, WatchedPs]) -> FrozenPs | None:
        """The first PS of ``ps`` that is silent for SILENT_S and does not answer a probe.

        Only registered PS are probed (one that has no address yet is starting: the startup
        timeout covers it). A PS that answers is not probed again until it has been silent for
        SILENT_S since that answer."""
        now = self.clock()
        for k, watched in sorted(ps.items()):
            heard = self.state.last_heard(NodeId("ps", k, watched.generation))
            since = self._since.setdefault(watched.pod, now)
            last = max(since, self._answered.get(watched.pod, since))
            if heard is not None:
                last = max(last, heard)
            if now - last <= SILENT_S:
                continue
            with self.state.lock:
                address = self.state.ps_addresses.get(k)
            if address is None:
                continue
            if self.answers(address, self.secret):
                if watched.pod not in self._answered:
                    log.warning(
                        "%s: no usage report for %.0fs but it answers; its reports are lost",
                        watched.pod,
                        now - last,
                    )
                self._answered[watched.pod] = self.clock()
                continue
            return FrozenPs(pod=watched.pod, index=k, silent_s=self.clock() - last)
        return None


__all__ = [
    "DETECT_S",
    "FIRST_REPORT_S",
    "LOAD_CPU_S",
    "LOAD_MARGIN",
    "LOAD_MIN_S",
    "PROBE_TIMEOUT_S",
    "SILENT_S",
    "START_SILENT_S",
    "FrozenPs",
    "PsWatch",
    "WatchedPs",
    "load_budget_s",
    "probe",
    "starting_ps_frozen",
]
