"""What a master killed without a chance to clean up leaves on the machine, and removing it.

A master stopped by a signal releases its run itself (:mod:`dlrover_kfp.runtime.signals`). A
master killed by SIGKILL (the OOM killer, ``kill -9``, a node agent) cannot: on the local
backend its pods keep running in their own sessions (a frozen one forever), their cgroups stay
in every hierarchy, and their shared-memory directories (each pod's own, under ``/dev/shm``:
the PS's snapshots) hold memory until unlinked. :func:`reap_leftovers` removes all of it for
one output directory; ``dlrover-kfp cleanup`` calls it, and so does the next run in that
directory, right after it has locked it (:class:`~dlrover_kfp.runtime.rundir.OutputDirLock`:
no live master holds it then).

What makes the run resumable stays: the run file and the committed checkpoints are never
touched, so the same ``dlrover-kfp run`` command resumes the run with its exact count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dlrover_kfp.backends.local import reap_pods
from dlrover_kfp.runtime.runfile import unfinished_run_id
from dlrover_kfp.training import checkpoint as ckpt


@dataclass(frozen=True, slots=True)
class Leftovers:
    """What :func:`reap_leftovers` removed (and, in ``left``, what it could not)."""

    run_id: str | None = None
    processes: dict[int, str] = field(default_factory=dict)  # pid -> pod name
    cgroups: tuple[Path, ...] = ()
    shm: tuple[Path, ...] = ()  # pods' shared-memory directories and snapshot files
    left: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.processes or self.cgroups or self.shm or self.left)

    def lines(self) -> list[str]:
        """One line per thing removed, for a user: ``process 123 (pod job-worker-0)`` ..."""
        out = [f"process {pid} (pod {pod})" for pid, pod in sorted(self.processes.items())]
        out += [f"cgroup {path}" for path in self.cgroups]
        out += [f"shm {path}" for path in self.shm]
        return out

    def summary(self) -> str:
        """One line: how much was removed, by kind."""
        parts = [
            f"{len(self.processes)} pod process(es)",
            f"{len(self.cgroups)} cgroup(s)",
            f"{len(self.shm)} shared-memory director(ies) or file(s)",
        ]
        return "removed what an earlier master left: " + ", ".join(parts)


def reap_leftovers(output_dir: Path, run_id: str | None = None) -> Leftovers:
    """Remove what earlier masters of ``output_dir`` left on this machine: their local pods'
    processes, cgroups and shared-memory directories
    (:func:`~dlrover_kfp.backends.local.reap_pods`, by the marks each backend leaves in
    ``output_dir/logs``; a live master's pods are never touched) and any shared-memory
    snapshot of ``run_id`` in this machine's own ``/dev/shm`` (default: the unfinished run's,
    from its run file; written there by a trainer started outside a local backend's pod).

    Call it while holding the directory's lock. Returns what was removed; idempotent."""
    pods = reap_pods(output_dir / "logs")
    run_id = run_id or unfinished_run_id(output_dir)
    shm = pods.shm + (tuple(ckpt.cleanup_shm(run_id)) if run_id else ())
    return Leftovers(
        run_id=run_id, processes=pods.processes, cgroups=pods.cgroups, shm=shm, left=pods.left
    )


__all__ = ["Leftovers", "reap_leftovers"]
