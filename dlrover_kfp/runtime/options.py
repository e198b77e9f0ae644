"""What one run is asked to do besides its spec: one object, built at the edge, passed whole.

The CLI, a pipeline step, the quickstart and the tests each build a :class:`RunOptions` from
their own inputs (flags, component parameters, fixtures) and hand it down unchanged through
:func:`~dlrover_kfp.runtime.launch.run_job` (and ``run_local``/``run_kubernetes``) to the run.
A new option is then a field here and a read where it is used, not a keyword argument added to
six signatures.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.planner import PlannerSettings
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.runtime.cancel import CancelProbe

#: How a PS change is applied: live (paused only for the switch) or stop-and-restart.
Migration = Literal["live", "restart"]


@dataclass(frozen=True, slots=True)
class RunSettings:
    """How a run is carried out (not what it trains: that is the job spec)."""

    #: rows per data shard; a multiple of the synthetic generator's block keeps reads cheap
    shard_rows: int = 8192
    #: the tail of every data source held out for the final log-loss and AUC
    eval_fraction: float = 0.1
    #: every push waits for its acknowledgement (for the step-by-step correctness test)
    synchronous: bool = False
    #: seconds between runtime samples (per-pod CPU and memory, samples/s)
    sample_interval_s: float = 2.0
    #: seconds between flash checkpoints; 0 means only the final one
    checkpoint_interval_s: float = 60.0
    #: committed checkpoints kept on disk
    keep_checkpoints: int = 3
    #: torch intra-op threads per process; None sizes them from each pod's CPU
    #: (:func:`dlrover_kfp.training.node.torch_threads`)
    torch_threads: int | None = None
    #: seed of the model's initial values
    seed: int = 0
    #: seconds allowed for the PS to start and register
    startup_timeout_s: float = 180.0
    #: host the master listens on; pods must reach it
    master_host: str = "127.0.0.1"
    #: interpreter of the pods' processes
    python: str = field(default_factory=lambda: sys.executable)
    #: seconds a worker may still run once every shard is done (it exits when it asks for the
    #: next one); then it is stopped: a frozen process would otherwise hold the job forever
    finish_grace_s: float = 30.0
    #: the port of the master's Prometheus endpoint (runtime/metrics.py); 0: none; None: the
    #: default (8080 for a Kubernetes backend's master in a pod, alone there; none elsewhere,
    #: where runs on one machine would fight over a port)
    metrics_port: int | None = None
    #: the address it listens on; None: every interface in a pod, loopback elsewhere
    metrics_host: str | None = None

    def __post_init__(self) -> None:
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise UserInputError(
                f"--metrics-port {self.metrics_port}: must be 0 (no metrics) or a port 1-65535"
            )


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Where a run writes, what it starts from and how it is carried out.

    ``output_dir`` gets ``profile.json``, the model and the checkpoints; relative data paths
    of the spec resolve against ``base_dir`` (the spec file's directory). A run is elastic
    unless ``static`` (the spec's own resources for the whole run); an elastic run starts from
    ``plan`` when given (a pipeline's plan step made it), else from Stage 1's, planned with
    ``planner`` (None: the backend's default). With ``history_url`` the start is planned from
    that history and, with ``record``, the profile recorded in it. ``resume`` goes on from the
    last committed checkpoint of a run an earlier master left unfinished in ``output_dir``;
    ``fresh`` archives an earlier run's files first. ``migration`` says how an elastic run
    applies a PS change. A stop signal ends the run resumable and unrecorded, unless a user
    cancelled it (``cancel_probe``, the marker file): then it ends ``cancelled``.
    """

    output_dir: Path
    base_dir: Path
    settings: RunSettings = field(default_factory=RunSettings)
    history_url: str | None = None
    static: bool = False
    run_id: str | None = None
    resume: bool = False
    fresh: bool = False
    record: bool = True
    plan: ResourcePlan | None = None
    planner: PlannerSettings | None = None
    migration: Migration = "live"
    #: where a user's cancel is told apart from other stops beside the output dir's marker
    #: (:mod:`~dlrover_kfp.runtime.cancel`): a master in the cluster reads its pod's annotation
    cancel_probe: CancelProbe | None = None


__all__ = ["Migration", "RunOptions", "RunSettings"]
