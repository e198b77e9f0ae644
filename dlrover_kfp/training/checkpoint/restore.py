"""Choosing the checkpoint to restore, and restoring one PS from it, re-partitioned.

* :func:`load_checkpoint` restores one PS. Candidates are the complete shared-memory sets (every
  old part present at the same step) and the committed directories, newest step first, shared
  memory first on a tie. Each part is streamed through crc32 while it is copied, and a part that
  fails (size, header, crc32: one flipped byte is enough) is logged with its file name and the
  next older candidate is tried. Rows are re-partitioned on the fly when the number of PS
  changed (see :class:`_RowSink`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dlrover_kfp.core.partition import Partition
from dlrover_kfp.errors import UserInputError
from dlrover_kfp.training.checkpoint.format import (
    CHUNK,
    DENSE_ARRAYS,
    MANIFEST,
    ROW_ARRAYS,
    AnyArray,
    CheckpointCorruptError,
    CheckpointError,
    PartMeta,
    PathLike,
    Source,
    _as_numpy,
    parse_manifest,
)
from dlrover_kfp.training.checkpoint.persist import _committed
from dlrover_kfp.training.checkpoint.reader import PartRef, _fresh_array, _PartFile, _RowSink
from dlrover_kfp.training.checkpoint.shm import list_shm

if TYPE_CHECKING:
    from dlrover_kfp.training.checkpoint.format import ArrayLike

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CheckpointChoice:
    """A restore candidate: a committed directory or a complete set of shm snapshots.

    :func:`select_checkpoint` returns the one to use; ``to_dict`` is what a coordinator sends to
    the PS so that they all restore the same step.
    """

    source: Source
    step: int
    location: str  # the committed directory, or the shm directory
    job_id: str
    num_ps: int  # PS that wrote it
    total_rows: int
    dim: int
    table_sizes: tuple[int, ...]
    parts: tuple[PartRef, ...]  # index = old PS index
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "step": self.step,
            "location": self.location,
            "job_id": self.job_id,
            "num_ps": self.num_ps,
            "total_rows": self.total_rows,
            "dim": self.dim,
            "table_sizes": list(self.table_sizes),
            "parts": [p.to_dict() for p in self.parts],
            "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CheckpointChoice:
        source = str(raw["source"])
        if source not in ("shm", "disk"):
            raise UserInputError(f"checkpoint choice: unknown source {source!r}")
        return cls(
            "shm" if source == "shm" else "disk",
            int(raw["step"]),
            str(raw["location"]),
            str(raw["job_id"]),
            int(raw["num_ps"]),
            int(raw["total_rows"]),
            int(raw["dim"]),
            tuple(int(n) for n in raw["table_sizes"]),
            tuple(PartRef.from_dict(p) for p in raw["parts"]),
            dict(raw.get("extra", {})),
        )


def _disk_choice(path: Path) -> CheckpointChoice:
    """The candidate a committed directory holds, from its manifest.

    The manifest is untrusted (a disk, a hand edit, a half-written copy): it is checked field
    by field (:func:`~.format.parse_manifest`), then for a geometry the restore can use (PS
    0 .. P-1 each once, rows and dim >= 1, table sizes summing to the rows). Anything else is a
    :class:`CheckpointCorruptError` naming the manifest, which the caller logs and skips.
    """
    manifest_path = path / MANIFEST
    try:
        raw_bytes = manifest_path.read_bytes()
    except OSError as exc:
        raise CheckpointCorruptError(
            f"{manifest_path}: unreadable manifest: {exc.strerror or exc}"
        ) from None
    raw = parse_manifest(raw_bytes, manifest_path)
    parts = sorted(raw["parts"], key=lambda p: int(p["meta"]["ps_index"]))
    indexes = [int(p["meta"]["ps_index"]) for p in parts]
    if indexes != list(range(raw["num_ps"])):
        raise CheckpointCorruptError(
            f"{manifest_path}: unreadable manifest: parts' ps_index {indexes[:8]} do not cover "
            f"PS 0..{raw['num_ps'] - 1} exactly once"
        )
    table_sizes = tuple(int(n) for n in raw.get("table_sizes", ()))
    try:
        # The same geometry checks as a part's own meta (a snapshot's are checked by the reader).
        PartMeta(raw["job_id"], raw["num_ps"], 0, raw["total_rows"], raw["dim"], table_sizes)
    except UserInputError as exc:
        raise CheckpointCorruptError(f"{manifest_path}: unreadable manifest: {exc}") from None
    refs = tuple(
        PartRef(str(path / p["file"]), int(p["bytes"]), int(p["crc32"]), int(p["seq"]))
        for p in parts
    )
    return CheckpointChoice(
        "disk",
        int(raw["step"]),
        str(path),
        str(raw["job_id"]),
        int(raw["num_ps"]),
        int(raw["total_rows"]),
        int(raw["dim"]),
        table_sizes,
        refs,
        dict(raw.get("extra") or {}),
    )


def _shm_choices(job_id: str, shm_dir: PathLike | None) -> list[CheckpointChoice]:
    """Complete sets of snapshots: every part 0..P-1 of one generation at one step."""
    groups: dict[tuple[int, int, int], dict[int, tuple[_PartFile, PartRef]]] = {}
    for path in list_shm(job_id, shm_dir):
        try:
            with _PartFile(path, shm=True) as part:
                h = part.header
                ref = PartRef(str(path), h.total_len, h.verified_crc, h.seq)
                key = (part.generation, h.step, part.meta.num_ps)
                groups.setdefault(key, {})[part.meta.ps_index] = (part, ref)
        except CheckpointCorruptError as exc:
            logger.debug("skipping shm snapshot: %s", exc)
    choices = []
    # Newest generation first: at the same step, the sort in _candidates keeps this order.
    for (_, step, num_ps), members in sorted(groups.items(), reverse=True):
        if sorted(members) != list(range(num_ps)):
            continue
        metas = [members[k][0].meta for k in range(num_ps)]
        geometry = {(m.job_id, m.total_rows, m.dim, m.table_sizes) for m in metas}
        if len(geometry) != 1:
            continue
        m0 = metas[0]
        location = str(Path(members[0][1].path).parent)
        choices.append(
            CheckpointChoice(
                "shm",
                step,
                location,
                m0.job_id,
                num_ps,
                m0.total_rows,
                m0.dim,
                m0.table_sizes,
                tuple(members[k][1] for k in range(num_ps)),
                members[0][0].extra,
            )
        )
    return choices


def own_snapshot(
    choice: CheckpointChoice, ps_index: int, shm_dir: PathLike | None = None
) -> CheckpointChoice | None:
    """``choice`` (a committed checkpoint) with PS ``ps_index``'s part read from this pod's
    own shm snapshot instead of the volume, when that snapshot is exactly the committed part.

    A PS restarted inside its pod (training/supervisor.py) finds the snapshot its previous
    process took; in a pod's private ``/dev/shm`` no other PS's part is there, so this is not a
    complete set for :func:`_shm_choices`. It is the committed part when it is the same
    snapshot (step, snapshot sequence, size: the persister writes the snapshot's bytes as they
    are); its crc32 is then checked against the manifest's while it streams, so a changed byte
    fails the restore and the caller falls back to the volume. None when the job's PS count
    changed (every part would be needed) or the newest snapshot is another step (a later
    checkpoint had begun, and was never committed).
    """
    if choice.source != "disk" or not 0 <= ps_index < choice.num_ps:
        return None
    committed = choice.parts[ps_index]
    if committed.crc32 is None:
        return None
    newest: tuple[int, int, PartRef] | None = None  # (generation, step, ref)
    for path in list_shm(choice.job_id, shm_dir):
        try:
            with _PartFile(path, shm=True) as part:
                m, h = part.meta, part.header
                mine = (m.ps_index, m.num_ps) == (ps_index, choice.num_ps)
                if mine and (newest is None or part.generation > newest[0]):
                    ref = PartRef(str(path), h.total_len, committed.crc32, h.seq)
                    newest = (part.generation, h.step, ref)
        except CheckpointCorruptError as exc:
            logger.debug("skipping shm snapshot: %s", exc)
    if newest is None:
        return None
    _, step, ref = newest
    if (step, ref.nbytes, ref.seq) != (choice.step, committed.nbytes, committed.seq):
        return None
    parts = tuple(ref if k == ps_index else p for k, p in enumerate(choice.parts))
    location = str(Path(ref.path).parent)
    return replace(choice, source="shm", location=location, parts=parts)


def _candidates(
    root: PathLike | None, job_id: str | None, shm_dir: PathLike | None
) -> tuple[list[CheckpointChoice], int]:
    """Every candidate, best first (newest step; shm before disk at the same step).

    Also returns how many committed checkpoints had an unreadable manifest.
    """
    choices: list[CheckpointChoice] = []
    broken = 0
    if root is not None:
        for _, path in _committed(Path(root)):
            try:
                choices.append(_disk_choice(path))
            except CheckpointCorruptError as exc:
                logger.warning("%s; ignoring this checkpoint", exc)
                broken += 1
    if job_id is not None:
        choices += _shm_choices(job_id, shm_dir)
    choices.sort(key=lambda c: (c.step, c.source == "shm"), reverse=True)
    return choices, broken


def _verify(choice: CheckpointChoice, skip: frozenset[int] = frozenset()) -> None:
    """crc32 over every part of ``choice`` except ``skip``; raises on the first bad one."""
    scratch = bytearray(CHUNK)
    for k, ref in enumerate(choice.parts):
        if k in skip:
            continue
        with _PartFile(Path(ref.path), shm=choice.source == "shm", ref=ref) as part:
            part.stream({}, scratch)


def select_checkpoint(
    root: PathLike | None,
    *,
    job_id: str | None = None,
    shm_dir: PathLike | None = None,
    accept: Callable[[CheckpointChoice], None] | None = None,
) -> CheckpointChoice | None:
    """The newest candidate whose every part verifies (shm preferred on a tie), and that
    ``accept`` takes: it raises :class:`CheckpointCorruptError` for one whose ``extra`` its
    caller cannot trust (a shard ledger that is not the run's split), which is then passed
    over like one whose part does not verify.

    Run it once in the coordinator and pass the result to every PS's :func:`load_checkpoint`:
    then each PS reads only the parts it needs. None when there is no checkpoint at all (a
    fresh start); :class:`CheckpointError` when there are some and none verifies.
    """
    choices, broken = _candidates(root, job_id, shm_dir)
    for choice in choices:
        try:
            if accept is not None:
                accept(choice)
            _verify(choice)
            return choice
        except CheckpointCorruptError as exc:
            logger.warning("%s; trying an older checkpoint", exc)
    if choices or broken:
        raise CheckpointError(f"{root}: no checkpoint verifies ({len(choices) + broken} tried)")
    return None


@dataclass(frozen=True, slots=True, eq=False)
class RestoredPart:
    """One PS's restored state, re-partitioned for ``num_ps`` PS if that changed."""

    step: int
    source: Source
    location: str
    job_id: str
    num_ps: int
    ps_index: int
    from_num_ps: int
    total_rows: int
    dim: int
    table_sizes: tuple[int, ...]
    weights: AnyArray  # [rows_on(ps_index), dim]
    accum: AnyArray
    dense: AnyArray | None  # PS 0 only
    dense_accum: AnyArray | None
    extra: dict[str, Any]
    verified: bool  # False only for a shm snapshot whose persist had not finished


def _repartition_sink(
    dest: AnyArray, k: int, p_old: int, j: int, p_new: int, rows_k: int
) -> _RowSink | None:
    """Rows of old part ``k`` (of ``p_old``) that new PS ``j`` (of ``p_new``) owns.

    Old slot s of part k holds gid = s·P + k; PS j of P' wants gid ≡ j (mod P'). With
    d = gcd(P, P'), s·P + k ≡ j (mod P') has a solution iff d | (j - k), and then the solutions
    are s ≡ s0 (mod P'/d). Consecutive selected gids differ by lcm(P, P') = P·P'/d, so their new
    slots gid div P' differ by P/d (lcm is a multiple of P'). None if part k gives j nothing.
    """
    d = math.gcd(p_old, p_new)
    stride, dest_stride = p_new // d, p_old // d
    s0 = next((s for s in range(stride) if (s * p_old + k - j) % p_new == 0), None)
    if s0 is None or s0 >= rows_k:
        return None
    count = (rows_k - s0 + stride - 1) // stride
    return _RowSink(
        dest,
        first=s0,
        stride=stride,
        dest_first=(s0 * p_old + k) // p_new,
        dest_stride=dest_stride,
        count=count,
    )


def _destination(
    name: str, shape: tuple[int, ...], dtype: str, out: Mapping[str, ArrayLike] | None
) -> AnyArray:
    if out is None or name not in out:
        return _fresh_array(shape, dtype)
    arr = _as_numpy(name, out[name])
    if tuple(arr.shape) != shape or np.dtype(arr.dtype) != np.dtype(dtype):
        raise UserInputError(
            f"out[{name!r}] is {arr.dtype}{list(arr.shape)}, the checkpoint "
            f"restores {np.dtype(dtype)}{list(shape)}"
        )
    if not arr.flags.writeable:
        raise UserInputError(f"out[{name!r}] is read-only")
    return arr


def _restore(
    choice: CheckpointChoice,
    num_ps: int,
    ps_index: int,
    out: Mapping[str, ArrayLike] | None,
    *,
    verify_all: bool,
) -> RestoredPart:
    p_old = choice.num_ps
    old = Partition(choice.total_rows, p_old)
    rows_j = Partition(choice.total_rows, num_ps).rows_on(ps_index)
    is_shm = choice.source == "shm"
    scratch = bytearray(CHUNK)
    dest: dict[str, AnyArray] = {}
    sinks_by_part: list[dict[str, _RowSink]] = []
    verified = True
    files: list[_PartFile] = []
    try:
        for ref in choice.parts:
            files.append(_PartFile(Path(ref.path), shm=is_shm, ref=ref))
        for k, part in enumerate(files):
            m = part.meta
            if (m.ps_index, m.num_ps, part.header.step) != (k, p_old, choice.step):
                raise CheckpointCorruptError(
                    f"{part.path}: holds {m.part} of {m.num_ps} at "
                    f"step {part.header.step}, expected ps-{k} of "
                    f"{p_old} at step {choice.step}"
                )
            sinks: dict[str, _RowSink] = {}
            for name in ROW_ARRAYS:
                desc = part.arrays.get(name)
                if desc is None or desc.shape != (old.rows_on(k), choice.dim):
                    raise CheckpointCorruptError(
                        f"{part.path}: {name} is missing or not [{old.rows_on(k)}, {choice.dim}]"
                    )
                if name not in dest:
                    dest[name] = _destination(name, (rows_j, choice.dim), desc.dtype, out)
                elif np.dtype(desc.dtype) != dest[name].dtype:
                    raise CheckpointCorruptError(
                        f"{part.path}: {name} is {desc.dtype}, ps-0 has {dest[name].dtype}"
                    )
                sink = _repartition_sink(dest[name], k, p_old, ps_index, num_ps, desc.shape[0])
                if sink is not None:
                    sinks[name] = sink
            if k == 0 and ps_index == 0:
                for name in DENSE_ARRAYS:
                    if name in part.arrays:
                        desc = part.arrays[name]
                        dest[name] = _destination(name, desc.shape, desc.dtype, out)
                        sinks[name] = _RowSink.identity(dest[name])
            sinks_by_part.append(sinks)
        for part, sinks in zip(files, sinks_by_part, strict=True):
            if sinks or verify_all:
                part.stream(sinks, scratch)
                verified = verified and (
                    part.ref is None
                    or part.ref.crc32 is not None
                    or part.header.verified_crc is not None
                )
    finally:
        for part in files:
            part.close()
    for name in ROW_ARRAYS:
        filled = sum(s[name].filled for s in sinks_by_part if name in s)
        if filled != rows_j:
            raise CheckpointCorruptError(
                f"{choice.location}: restored {filled} of {rows_j} {name} rows for ps-{ps_index}"
            )
    if not verified:
        logger.info(
            "restored step %d from shm snapshots whose persist never finished "
            "(no crc32 to verify against)",
            choice.step,
        )
    return RestoredPart(
        choice.step,
        choice.source,
        choice.location,
        choice.job_id,
        num_ps,
        ps_index,
        p_old,
        choice.total_rows,
        choice.dim,
        choice.table_sizes,
        dest["weights"],
        dest["accum"],
        dest.get("dense"),
        dest.get("dense_accum"),
        dict(choice.extra),
        verified,
    )


def load_checkpoint(
    root: PathLike | None,
    *,
    num_ps: int,
    ps_index: int,
    job_id: str | None = None,
    shm_dir: PathLike | None = None,
    choice: CheckpointChoice | None = None,
    out: Mapping[str, ArrayLike] | None = None,
) -> RestoredPart | None:
    """Restore PS ``ps_index`` of ``num_ps`` from the best checkpoint.

    Without ``choice``: candidates are the committed checkpoints under ``root`` and, if
    ``job_id`` is given, the complete shm snapshot sets in ``shm_dir``; newest step first, shm
    first on a tie. Every part of a candidate is verified, not just the ones this PS reads, so
    that every PS independently settles on the same step; a candidate that fails is logged
    (naming the file) and the next older one tried. With ``choice`` (from
    :func:`select_checkpoint`): only the parts this PS needs are read, verified as they stream.

    ``out`` maps array names to preallocated destinations (the PS's freshly built tables): the
    restore writes into them instead of allocating. Returns None when there is no checkpoint at
    all; raises :class:`CheckpointError` when there are checkpoints and none is usable.
    """
    if num_ps < 1 or not 0 <= ps_index < num_ps:
        raise UserInputError(f"cannot restore PS {ps_index} of {num_ps}")
    if choice is not None:
        return _restore(choice, num_ps, ps_index, out, verify_all=False)
    choices, broken = _candidates(root, job_id, shm_dir)
    for candidate in choices:
        try:
            return _restore(candidate, num_ps, ps_index, out, verify_all=True)
        except CheckpointCorruptError as exc:
            logger.warning("%s; trying an older checkpoint", exc)
    if choices or broken:
        raise CheckpointError(f"{root}: no checkpoint verifies ({len(choices) + broken} tried)")
    return None
