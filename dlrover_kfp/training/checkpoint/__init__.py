"""Flash checkpoints for the parameter servers: snapshot to shared memory, persist in background.

A PS serves training requests on many threads, and a checkpoint request waits for the ones in
flight and holds new ones back while it copies (the PS's gate), so training on that PS stops
for exactly as long as the checkpoint blocks. ``torch.save``
of a GiB of embeddings plus ``fsync`` takes 0.7-2 s on the machines we measured (0.5-1.4 GB/s);
a copy into memory that is already mapped and touched runs at 13-17 GB/s. So the blocking part of
a checkpoint is only that copy, into a shared-memory file, and everything slow happens after:

    blocked  = state_bytes / memcpy_rate          (~0.07 s per GiB)
    durable  = blocked + state_bytes / min(crc32_rate, write_rate) + fsync + commit

The modules, in the order a checkpoint goes through them (each imports only those above it):

* :mod:`.format`: the bytes of a part (the same in shared memory and on disk), its array
  layout, meta and header, and the error types.
* :mod:`.reader`: opening a part and streaming it through crc32 into the restored arrays.
* :mod:`.shm`: :class:`ShmSnapshot`, the pre-touched shared-memory buffer a snapshot is
  copied into, and the naming and cleanup of those files.
* :mod:`.persist`: :class:`Persister` writes a snapshot to disk in the background;
  :func:`commit` makes a step's parts a checkpoint.
* :mod:`.restore`: :func:`select_checkpoint` and :func:`load_checkpoint` restore a PS from the
  newest part set that verifies, re-partitioning rows when the number of PS changed.
* :mod:`.ps_adapter`: :class:`PsCheckpointer` and :func:`restore_ps_state`, the PS server's view.

Who calls what:

* PS process, at start: ``load_checkpoint`` (or :func:`restore_ps_state`) *before* creating
  its own buffer, then ``FlashCheckpointer(root, meta, StateSpec...)`` (or
  :class:`PsCheckpointer`). Every incarnation gets a new ``generation`` (by default a
  timestamp), so a new PS never replaces an old snapshot that another PS may still be reading;
  after its first snapshot a PS removes the older generations' files of its own part
  (:meth:`ShmSnapshot.discard_older`).
* PS serving thread, on a checkpoint request, with every training request held: ``save(step,
  arrays)``; reply with the blocked seconds; report the future's :class:`PartRecord` (a dict
  via ``to_dict``) when it resolves.
* Master/coordinator: when all P records of a step are in, :func:`commit`; at job start
  ``prune_checkpoints(root, all_tmp=True)``; at job end :func:`cleanup_shm` (tmpfs memory
  stays allocated until the files are unlinked). To restore consistently and cheaply, run
  :func:`select_checkpoint` once and pass the choice to every PS's ``load_checkpoint``.
* PS process restarted inside its pod (training/supervisor.py), on a rollback to the committed
  ``choice``: :func:`restore_own_part`, which reads its own part from the pod's shm snapshot
  when that is exactly the committed part (:func:`own_snapshot`; crc32 against the manifest),
  else from the volume.
"""

from dlrover_kfp.training.checkpoint.format import (
    ArrayDesc,
    ArraySpec,
    CheckpointBusyError,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointWriteError,
    PartMeta,
    StateSpec,
)
from dlrover_kfp.training.checkpoint.persist import (
    FlashCheckpointer,
    PartRecord,
    Persister,
    commit,
    discard_unfinished,
    list_checkpoints,
    prune_checkpoints,
)
from dlrover_kfp.training.checkpoint.ps_adapter import (
    PsCheckpointer,
    restore_own_part,
    restore_ps_state,
)
from dlrover_kfp.training.checkpoint.reader import PartRef, SnapshotInfo, read_snapshot
from dlrover_kfp.training.checkpoint.restore import (
    CheckpointChoice,
    RestoredPart,
    load_checkpoint,
    own_snapshot,
    select_checkpoint,
)
from dlrover_kfp.training.checkpoint.shm import (
    ShmSnapshot,
    SnapshotStats,
    cleanup_shm,
    default_shm_dir,
    list_shm,
    shm_path,
)

__all__ = [
    "ArrayDesc",
    "ArraySpec",
    "CheckpointBusyError",
    "CheckpointChoice",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointWriteError",
    "FlashCheckpointer",
    "PartMeta",
    "PartRecord",
    "PartRef",
    "Persister",
    "PsCheckpointer",
    "RestoredPart",
    "ShmSnapshot",
    "SnapshotInfo",
    "SnapshotStats",
    "StateSpec",
    "cleanup_shm",
    "commit",
    "default_shm_dir",
    "discard_unfinished",
    "list_checkpoints",
    "list_shm",
    "load_checkpoint",
    "own_snapshot",
    "prune_checkpoints",
    "read_snapshot",
    "restore_own_part",
    "restore_ps_state",
    "select_checkpoint",
    "shm_path",
]
