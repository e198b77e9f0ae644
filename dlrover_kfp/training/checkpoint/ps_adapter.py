"""The PS server's view of flash checkpoints: a :class:`PsState` in, a :class:`PsState` out.

:class:`PsCheckpointer` snapshots and persists a PS's state on the serving thread's behalf;
:func:`restore_ps_state` builds the state a (re)started PS begins with. Both only translate
between :class:`PsState` and the named arrays that the rest of the package handles.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from dlrover_kfp.training.checkpoint.format import (
    AnyArray,
    CheckpointError,
    PartMeta,
    PathLike,
    StateSpec,
)
from dlrover_kfp.training.checkpoint.persist import FlashCheckpointer, PartRecord
from dlrover_kfp.training.checkpoint.restore import CheckpointChoice, load_checkpoint

if TYPE_CHECKING:
    import torch

    from dlrover_kfp.training.ps_state import PsConfig, PsState

logger = logging.getLogger(__name__)


class PsCheckpointer:
    """A PS server's flash checkpointing of its :class:`PsState`, one snapshot at a time.

    ``snapshot`` runs on the serving thread between two requests and returns the seconds it
    blocked; the persist runs in the background and ``status`` reports it, with the
    :class:`PartRecord` (as a dict) that the master passes to :func:`commit`.
    """

    def __init__(
        self,
        root: PathLike,
        job_id: str,
        ps_index: int,
        state: PsState,
        *,
        shm_dir: PathLike | None = None,
        generation: int | None = None,
        copy_threads: int = 1,
    ) -> None:
        cfg = state.config
        self.meta = PartMeta(
            job_id,
            cfg.num_ps,
            ps_index,
            sum(cfg.model.table_sizes),
            cfg.model.embedding_dim,
            tuple(cfg.model.table_sizes),
        )
        self.flash = FlashCheckpointer(
            root,
            self.meta,
            StateSpec.of(state.arrays()),
            shm_dir=shm_dir,
            generation=generation,
            copy_threads=copy_threads,
        )
        self._future: Future[PartRecord] | None = None
        self._step: int | None = None
        self._discarded = False

    @property
    def busy(self) -> bool:
        """The previous snapshot is still being persisted: a snapshot now would wait for it."""
        return self.flash.busy

    def snapshot(self, step: int, state: PsState, extra: Mapping[str, Any] | None = None) -> float:
        """Copy ``state`` into shared memory (blocking), persist it in the background.

        Blocks longer if the previous persist is still running (see ``busy``): the master
        should not ask for a checkpoint before the previous one's ``status`` says done.
        """
        stats, future = self.flash.save(step, state.arrays(), extra=extra)
        self._future, self._step = future, step
        if not self._discarded:
            self.flash.shm.discard_older()
            self._discarded = True
        return stats.blocked_s

    def status(self) -> dict[str, Any]:
        """``{"step", "done", "part", "error"}`` of the latest snapshot's persist."""
        future = self._future
        if future is None or not future.done():
            return {"step": self._step, "done": False, "part": None, "error": None}
        error = future.exception()
        if error is not None:
            return {
                "step": self._step,
                "done": True,
                "part": None,
                "error": f"{type(error).__name__}: {error}",
            }
        return {"step": self._step, "done": True, "part": future.result().to_dict(), "error": None}

    def close(self) -> None:
        """Finish the pending persist and unmap; the shm file stays for a restart."""
        self.flash.close()


def restore_ps_state(
    root: PathLike,
    config: PsConfig,
    job_id: str,
    *,
    shm_dir: PathLike | None = None,
    choice: CheckpointChoice | None = None,
) -> PsState | None:
    """The state PS ``config.ps_index`` of ``config.num_ps`` restores, or None (no checkpoint).

    Shared memory first when it is as new as the newest committed checkpoint; rows are
    re-partitioned when the job had a different number of PS. With ``choice`` (the master's
    :func:`select_checkpoint`), exactly that checkpoint: every PS of a job rolling back must
    restore the same one, the one whose shard ledger the master restored.
    """
    # The PS process has torch loaded; importing the checkpoint package must not load it
    # (the master and `dlrover-kfp cleanup` use it without ever holding a tensor).
    import torch  # noqa: PLC0415

    from dlrover_kfp.training.ps_state import PsState  # noqa: PLC0415 (ps_state imports torch models)

    restored = load_checkpoint(
        root,
        num_ps=config.num_ps,
        ps_index=config.ps_index,
        job_id=job_id,
        shm_dir=shm_dir,
        choice=choice,
    )
    if restored is None:
        return None
    rows, dim = sum(config.model.table_sizes), config.model.embedding_dim
    if (restored.total_rows, restored.dim) != (rows, dim):
        raise CheckpointError(
            f"{restored.location}: checkpoint of {restored.total_rows} rows x "
            f"{restored.dim}, the model has {rows} x {dim}"
        )
    if config.ps_index == 0 and (restored.dense is None or restored.dense_accum is None):
        raise CheckpointError(f"{restored.location}: no dense parameters for PS 0")
    logger.info(
        "PS %d: restored step %d from %s (%s, written by %d PS)",
        config.ps_index,
        restored.step,
        restored.location,
        restored.source,
        restored.from_num_ps,
    )

    def tensor(a: AnyArray | None) -> torch.Tensor | None:
        return None if a is None else torch.from_numpy(a)

    return PsState(
        config,
        weights=torch.from_numpy(restored.weights),
        accum=torch.from_numpy(restored.accum),
        dense=tensor(restored.dense),
        dense_accum=tensor(restored.dense_accum),
    )
