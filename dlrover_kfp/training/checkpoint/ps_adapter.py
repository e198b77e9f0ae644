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

from dlrover_kfp.core.applied import AppliedTally
from dlrover_kfp.training.checkpoint.format import (
    AnyArray,
    CheckpointError,
    PartMeta,
    PathLike,
    StateSpec,
)
from dlrover_kfp.training.checkpoint.persist import FlashCheckpointer, PartRecord
from dlrover_kfp.training.checkpoint.restore import (
    CheckpointChoice,
    RestoredPart,
    load_checkpoint,
    own_snapshot,
)
from dlrover_kfp.training.checkpoint.shm import discard_part

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

    def restore(self, state: PsState, choice: CheckpointChoice) -> bool:
        """Roll ``state`` back to its part of the committed checkpoint ``choice``, in place
        (its tensors are overwritten, none allocated); True when it came from this PS's own
        snapshot buffer, False from the volume (:func:`_own_or_volume`).

        A running PS that the master rolls back (another PS crashed) needs no new process: its
        buffer still holds its last snapshot, which is the committed part unless a later
        checkpoint had begun. The buffer stays this PS's (no new one to reserve and pre-touch),
        and the pod's memory holds one state and one snapshot throughout. Call it with no
        request in flight and no snapshot being taken (the server's gate, held exclusively).
        """
        state.untrack()  # a PS change's tracking (if any) marked rows of the state replaced
        _, from_memory = _own_or_volume(
            choice, state.config, self.flash.shm.shm_dir, state.arrays()
        )
        state.applied = committed_tally(choice.extra, state.config)
        return from_memory

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
    return _ps_state(restored, config)


def restore_own_part(
    root: PathLike,
    config: PsConfig,
    job_id: str,
    choice: CheckpointChoice,
    *,
    shm_dir: PathLike | None = None,
) -> tuple[PsState, bool]:
    """PS ``config.ps_index``'s part of the committed checkpoint ``choice``, and whether it
    came from this pod's own shared memory (True) or from the volume (False).

    A PS restarted inside its pod (training/supervisor.py) reads its part from the snapshot
    its previous process left in the pod's ``/dev/shm`` when that is exactly the committed
    part (:func:`_own_or_volume`). Either way the step is ``choice``'s: the one whose shard
    ledger the master restored. The previous process's snapshot is then removed
    (:func:`~.shm.discard_part`): the new process allocates its own, and the pod's memory
    limit holds the state and one snapshot, not two.
    """
    restored, from_memory = _own_or_volume(choice, config, shm_dir, None)
    discard_part(job_id, config.ps_index, shm_dir)
    state = _ps_state(restored, config)
    state.applied = committed_tally(choice.extra, config)  # the manifest's, whatever the source
    return state, from_memory


def _own_or_volume(
    choice: CheckpointChoice,
    config: PsConfig,
    shm_dir: PathLike | None,
    out: Mapping[str, torch.Tensor] | None,
) -> tuple[RestoredPart, bool]:
    """PS ``config.ps_index``'s part of ``choice`` (into ``out`` when given), and whether it
    came from the pod's own snapshot: that snapshot when it is exactly the committed part
    (:func:`~.restore.own_snapshot`), checked against the manifest's crc32 as it streams;
    otherwise, or when that read fails, the volume (which then overwrites every row of
    ``out``, so a read that failed half-way leaves nothing of itself)."""
    own = own_snapshot(choice, config.ps_index, shm_dir)
    restored = None
    if own is not None:
        try:
            restored = _load(own, config, out)
        except CheckpointError as exc:
            logger.warning(
                "PS %d: its own snapshot of step %d does not verify (%s); restoring from the "
                "volume",
                config.ps_index,
                choice.step,
                exc,
            )
    else:
        logger.info(
            "PS %d: no snapshot of step %d in this pod's memory; restoring from the volume",
            config.ps_index,
            choice.step,
        )
    if restored is not None:
        return restored, True
    return _load(choice, config, out), False


def _load(
    choice: CheckpointChoice, config: PsConfig, out: Mapping[str, torch.Tensor] | None
) -> RestoredPart:
    """``choice``'s part for ``config``'s PS, checked against its model."""
    restored = load_checkpoint(
        None, num_ps=config.num_ps, ps_index=config.ps_index, choice=choice, out=out
    )
    if restored is None:  # a choice always restores a part or raises
        raise CheckpointError(f"{choice.location}: nothing restored for PS {config.ps_index}")
    _check(restored, config)
    return restored


def _check(restored: RestoredPart, config: PsConfig) -> None:
    """A restored part fits the model it is for (shape; PS 0's dense parameters)."""
    rows, dim = sum(config.model.table_sizes), config.model.embedding_dim
    if (restored.total_rows, restored.dim) != (rows, dim):
        raise CheckpointError(
            f"{restored.location}: checkpoint of {restored.total_rows} rows x "
            f"{restored.dim}, the model has {rows} x {dim}"
        )
    if config.ps_index == 0 and (restored.dense is None or restored.dense_accum is None):
        raise CheckpointError(f"{restored.location}: no dense parameters for PS 0")


def _ps_state(restored: RestoredPart, config: PsConfig) -> PsState:
    """The :class:`PsState` of a restored part, checked against the model it is for."""
    # The PS process has torch loaded; importing the checkpoint package must not load it
    # (the master and `dlrover-kfp cleanup` use it without ever holding a tensor).
    import torch  # noqa: PLC0415

    from dlrover_kfp.training.ps_state import PsState  # noqa: PLC0415 (ps_state imports torch models)

    _check(restored, config)
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

    state = PsState(
        config,
        weights=torch.from_numpy(restored.weights),
        accum=torch.from_numpy(restored.accum),
        dense=tensor(restored.dense),
        dense_accum=tensor(restored.dense_accum),
    )
    state.applied = committed_tally(restored.extra, config)
    return state


def committed_tally(extra: Mapping[str, Any], config: PsConfig) -> AppliedTally:
    """PS 0's applied-rows tally as a checkpoint committed it with the state (its manifest's
    ``applied``, see core/applied.py); empty on another PS and in a checkpoint without one."""
    if config.ps_index != 0:
        return AppliedTally()
    try:
        return AppliedTally.from_dict(extra.get("applied"))
    except ValueError as exc:  # the manifest's checksum held: a writer's bug, not a bit flip
        raise CheckpointError(f"checkpoint manifest: {exc}") from exc
