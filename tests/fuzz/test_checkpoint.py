"""Fuzzing checkpoint manifests and part files (``training.checkpoint`` format and reader).

A restarting PS trusts what it finds on disk only after checking it: the manifest, each part's
header (with its own crc), descriptor and payload crc32. A committed checkpoint is mutated
(bytes flipped, files cut, manifest and descriptor fields changed, with the checksums fixed up
so that the change reaches the parser behind them) and then selected and restored: the result
must be exactly the saved state or a :class:`CheckpointError`, never another exception.
"""

from __future__ import annotations

import json
import logging
import shutil
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dlrover_kfp.core.partition import Partition
from dlrover_kfp.training.checkpoint import (
    CheckpointError,
    FlashCheckpointer,
    PartMeta,
    StateSpec,
    commit,
    load_checkpoint,
    select_checkpoint,
)
from dlrover_kfp.training.checkpoint.format import (
    CHECKSUM_KEY,
    HEADER_SIZE,
    MANIFEST,
    _Header,
    manifest_checksum,
    parse_manifest,
)
from dlrover_kfp.training.checkpoint.reader import read_snapshot
from tests.fuzz._support import expect_clean, fuzz_settings, json_values, mutated, time_limit

pytestmark = time_limit(180)

F32 = npt.NDArray[np.float32]
ROWS, DIM, DENSE, NUM_PS = 120, 4, 9, 2
JOB = "job-fuzz"


class Committed:
    """A committed checkpoint of 2 PS, its files' bytes, and the state it holds. (Not a
    dataclass: hypothesis would print 20 KB of bytes with every failure.)"""

    def __init__(self, directory: str, files: dict[str, bytes], state: dict[str, F32]) -> None:
        self.directory = directory  # the step directory's name
        self.files = files  # name -> bytes (manifest.json and the parts)
        self.weights, self.accum, self.dense = state["weights"], state["accum"], state["dense"]

    def __repr__(self) -> str:
        return f"<Committed {self.directory}: {sorted(self.files)}>"


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Committed]:
    base = tmp_path_factory.mktemp("ckpt-source")
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((ROWS, DIM), dtype=np.float32)
    accum = rng.random((ROWS, DIM), dtype=np.float32)
    dense = rng.standard_normal(DENSE, dtype=np.float32)
    partition = Partition(ROWS, NUM_PS)
    checkpointers, futures = [], []
    for k in range(NUM_PS):
        gids = partition.gids_of(k)
        arrays: dict[str, Any] = {"weights": weights[gids], "accum": accum[gids]}
        if k == 0:
            arrays |= {"dense": dense.copy(), "dense_accum": dense.copy()}
        meta = PartMeta(JOB, NUM_PS, k, ROWS, DIM, (70, 50))
        cp = FlashCheckpointer(
            base / "root", meta, StateSpec.of(arrays), shm_dir=base / "shm", generation=0
        )
        checkpointers.append(cp)
        futures.append(cp.save(7, arrays, extra={"shards": [1, 2]})[1])
    records = [f.result(timeout=30) for f in futures]
    step_dir = commit(base / "root", 7, records, {"step": 7})
    for cp in checkpointers:
        cp.close()
    files = {p.name: p.read_bytes() for p in step_dir.iterdir()}
    yield Committed(step_dir.name, files, {"weights": weights, "accum": accum, "dense": dense})


def _fix_header(raw: bytearray, **fields: int) -> None:
    """Set header fields and recompute the header's own checksum."""
    header = _Header.unpack(bytes(raw[:HEADER_SIZE]), "part")
    values = {
        "state": header.state,
        "step": header.step,
        "seq": header.seq,
        "total_len": header.total_len,
        "json_len": header.json_len,
        "crc_seq": header.crc_seq,
        "crc32": header.crc32,
    } | fields
    raw[:HEADER_SIZE] = _Header(**values).pack()


def rewrite_descriptor(part: bytes, new_json: bytes) -> bytes:
    """The part with its JSON descriptor replaced and every length and checksum made to fit, so
    that only the descriptor's content can make the reader refuse it."""
    header = _Header.unpack(part[:HEADER_SIZE], "part")
    body = bytearray(part[: header.total_len - header.json_len] + new_json)
    crc = zlib.crc32(memoryview(body)[HEADER_SIZE:])
    _fix_header(body, total_len=len(body), json_len=len(new_json), crc32=crc)
    return bytes(body)


def _parsable(part: bytes) -> bool:
    """Whether the part's header and descriptor still read (so that they can be edited)."""
    try:
        descriptor(part)
    except (CheckpointError, ValueError, RecursionError):  # a bad header; JSON that won't read
        return False
    return True


def descriptor(part: bytes) -> Any:
    header = _Header.unpack(part[:HEADER_SIZE], "part")
    return json.loads(part[header.total_len - header.json_len : header.total_len])


def fix_manifest(files: dict[str, bytes]) -> None:
    """Update each part's size and crc32 in the manifest to the files' current bytes (when the
    manifest is still one: an earlier edit may have replaced it with anything)."""
    try:
        manifest = json.loads(files[MANIFEST])
        entries = [e for e in manifest["parts"] if isinstance(e, dict)]
    except (KeyError, TypeError, ValueError):
        return
    for entry in entries:
        raw = files.get(str(entry.get("file")))
        if raw is not None and len(raw) >= HEADER_SIZE:
            entry["bytes"] = len(raw)
            entry["crc32"] = zlib.crc32(raw[HEADER_SIZE:])
    files[MANIFEST] = json.dumps(sealed(manifest)).encode()


def sealed(manifest: Any) -> Any:
    """``manifest`` with its checksum recomputed (when it is an object): an edit that a hand or
    a tool made consistently, which only the field checks can catch."""
    if isinstance(manifest, dict):
        manifest = {**manifest, CHECKSUM_KEY: manifest_checksum(manifest)}
    return manifest


Mutation = Callable[[dict[str, bytes]], None]


class FileSet(dict[str, bytes]):
    """The files being edited; a short repr because hypothesis shows its strategies' arguments."""

    def __repr__(self) -> str:
        return f"<files {sorted(self)}>"


#: A manifest as commit() writes it (for edits after an earlier edit destroyed the real one).
ORIGINAL_MANIFEST = json.dumps(
    {
        "format": "dlrover-kfp-flash-checkpoint",
        "version": 1,
        "job_id": JOB,
        "step": 7,
        "num_ps": 2,
        "total_rows": ROWS,
        "dim": DIM,
        "table_sizes": [70, 50],
        "parts": [
            {"file": f"ps-{k}.bin", "bytes": 8192, "crc32": 1, "seq": 1, "meta": {"ps_index": k}}
            for k in range(2)
        ],
        "extra": {},
    }
)


@st.composite
def mutations(draw: st.DrawFn, files: dict[str, bytes], *, manifest: bool = True) -> Mutation:
    """One edit of the committed files (drawn against their current bytes); ``manifest``
    False leaves the manifest's content alone (only part files are edited)."""
    names = sorted(n for n in files if manifest or n != MANIFEST)
    parts = [n for n in names if n != MANIFEST]
    kinds = ["flip", "truncate", "extend", "descriptor", "header_fields", "delete"]
    kind = draw(st.sampled_from([*kinds, "manifest_fields", "manifest_any"] if manifest else kinds))
    names = [n for n in names if files[n]]  # an earlier edit may have emptied one
    parts = [n for n in parts if n in names and _parsable(files[n])]
    if not names:
        return lambda f: None
    if not parts and kind in ("descriptor", "header_fields"):
        kind = "flip"
    if kind == "flip":
        name = draw(st.sampled_from(names))
        size = len(files[name])
        # Half of the flips in the header and the descriptor, where the parsers are.
        where = draw(
            st.one_of(
                st.integers(0, min(HEADER_SIZE, size) - 1),
                st.integers(0, size - 1),
                st.integers(max(0, size - 300), size - 1),
            )
        )
        bit = draw(st.integers(0, 7))

        def flip(f: dict[str, bytes]) -> None:
            raw = bytearray(f[name])
            raw[where] ^= 1 << bit
            f[name] = bytes(raw)

        return flip
    if kind == "truncate":
        name = draw(st.sampled_from(names))
        keep = draw(st.integers(0, len(files[name]) - 1))

        def truncate(f: dict[str, bytes]) -> None:
            f[name] = f[name][:keep]

        return truncate
    if kind == "extend":
        name = draw(st.sampled_from(names))
        tail = draw(st.binary(min_size=1, max_size=64))

        def extend(f: dict[str, bytes]) -> None:
            f[name] = f[name] + tail

        return extend
    if kind == "delete":
        name = draw(st.sampled_from(names))

        def delete(f: dict[str, bytes]) -> None:
            del f[name]

        return delete
    if kind == "manifest_fields":
        try:
            current = json.loads(files[MANIFEST])
        except (KeyError, ValueError):
            current = json.loads(ORIGINAL_MANIFEST)
        new = draw(mutated(current))
        # Most edits keep the checksum right (to reach the field checks); some leave it stale.
        seal = draw(st.sampled_from([True, True, True, False]))
        text = json.dumps(sealed(new) if seal else new).encode()
        return lambda f: f.__setitem__(MANIFEST, text)
    if kind == "manifest_any":
        text = draw(st.one_of(json_values.map(json.dumps), st.binary(max_size=64)))
        data = text.encode() if isinstance(text, str) else text
        return lambda f: f.__setitem__(MANIFEST, data)
    name = draw(st.sampled_from(parts))
    if kind == "descriptor":
        new_desc = draw(st.one_of(mutated(descriptor(files[name])), json_values))

        def change_descriptor(f: dict[str, bytes]) -> None:
            f[name] = rewrite_descriptor(f[name], json.dumps(new_desc).encode())
            fix_manifest(f)

        return change_descriptor
    field = draw(st.sampled_from(["state", "step", "seq", "total_len", "json_len", "crc_seq"]))
    limit = 2**63 - 1 if field == "step" else 2**64 - 1
    if field == "state":
        limit = 2**32 - 1
    value = draw(st.one_of(st.integers(0, limit), st.integers(0, 70_000)))

    def change_header(f: dict[str, bytes]) -> None:
        raw = bytearray(f[name])
        _fix_header(raw, **{field: value})
        f[name] = bytes(raw)

    return change_header


def _raise(exc: BaseException) -> None:
    raise exc


def restore_all(committed: Committed, root: Path, *, exact: bool) -> None:
    """Select and restore every PS; whatever restores must be the saved state (``exact``) or
    at least arrays of the geometry the manifest states. A descriptor edited with every
    checksum fixed up is a different valid checkpoint, which no check can tell from the
    original: only ``exact`` edits (bytes, lengths, headers) must be detected."""
    choice = expect_clean(lambda: select_checkpoint(root), (CheckpointError,))
    if choice is None:
        return
    partition = Partition(ROWS, NUM_PS)
    for k in range(NUM_PS):
        part = expect_clean(
            lambda k=k: load_checkpoint(root, num_ps=NUM_PS, ps_index=k, choice=choice),  # type: ignore[misc]
            (CheckpointError,),
        )
        if part is None:
            continue
        gids = partition.gids_of(k)
        assert part.weights.shape == (len(gids), DIM)
        if not exact:
            continue
        np.testing.assert_array_equal(part.weights, committed.weights[gids])
        np.testing.assert_array_equal(part.accum, committed.accum[gids])
        if k == 0:
            np.testing.assert_array_equal(part.dense, committed.dense)


@fuzz_settings(scale=0.5)
@given(st.data())
def test_mutated_checkpoint_restores_exactly_or_is_refused(
    committed: Committed, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    files = FileSet(committed.files)
    for _ in range(data.draw(st.integers(1, 2))):
        # Part files and the manifest (restore._disk_choice reads it with parse_manifest).
        data.draw(mutations(files))(files)
    root = tmp_path_factory.getbasetemp() / "ckpt-fuzz"
    shutil.rmtree(root, ignore_errors=True)
    step_dir = root / committed.directory
    step_dir.mkdir(parents=True)
    for name, raw in files.items():
        (step_dir / name).write_bytes(raw)
    exact = all(
        _parsable(files.get(name, b"")) and descriptor(files[name]) == descriptor(raw)
        for name, raw in committed.files.items()
        if name != MANIFEST
    )
    restore_all(committed, root, exact=exact)


def _part_with(committed: Committed, change: Callable[[dict[str, Any]], object]) -> bytes:
    name = next(n for n in sorted(committed.files) if n != MANIFEST)
    desc = descriptor(committed.files[name])
    change(desc)
    return rewrite_descriptor(committed.files[name], json.dumps(desc).encode())


@fuzz_settings(scale=0.5)
@given(st.data())
def test_mutated_snapshot_reads_exactly_or_is_refused(
    committed: Committed, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """A part read as a shared-memory snapshot (``read_snapshot``): the restart path."""
    files = FileSet(committed.files)
    name = next(n for n in sorted(files) if n != MANIFEST)
    data.draw(mutations(FileSet({name: files[name], MANIFEST: files[MANIFEST]})))(files)
    if name not in files:
        return
    path = tmp_path_factory.getbasetemp() / "snapshot.part"
    path.write_bytes(files[name])
    result = expect_clean(lambda: read_snapshot(path), (CheckpointError,))
    if result is not None:
        info, arrays = result
        assert info.meta.job_id and 0 <= info.meta.ps_index < info.meta.num_ps
        assert all(isinstance(a, np.ndarray) and a.dtype.kind in "fiub" for a in arrays.values())


@fuzz_settings()
@given(st.data())
def test_mutated_manifest_parses_or_is_corrupt(committed: Committed, data: st.DataObject) -> None:
    files = FileSet(committed.files)
    for _ in range(data.draw(st.integers(1, 3))):
        mutation = data.draw(mutations(files))
        mutation(files)
    raw = files.get(MANIFEST, b"")
    manifest = expect_clean(lambda: parse_manifest(raw, "manifest.json"), (CheckpointError,))
    if manifest is not None:
        assert isinstance(manifest, dict) and len(manifest["parts"]) == manifest["num_ps"]


def test_manifest_parser_refuses_non_objects() -> None:
    """The inputs that crashed restore.py's own manifest reading before it used this parser."""
    for raw in (b"null", b"[" * 100_000, b'{"version": ' + b"9" * 5000 + b"}", b"\xff"):
        with pytest.raises(CheckpointError, match=r"^manifest\.json: unreadable manifest"):
            parse_manifest(raw, "manifest.json")


def _with_manifest(manifest: bytes) -> Callable[[dict[str, Any]], object]:
    return lambda m: manifest


#: Manifests that crashed restore._disk_choice (AttributeError, OverflowError, RecursionError,
#: ValueError out of select_checkpoint) or that it accepted with a geometry no restore can use.
BAD_MANIFESTS: dict[str, Callable[[dict[str, Any]], object]] = {
    "null": _with_manifest(b"null"),
    "list": _with_manifest(b"[]"),
    "number": _with_manifest(b"3"),
    "string": _with_manifest(b'"x"'),
    "deep": _with_manifest(b"[" * 100_000),
    "not-utf8": _with_manifest(b"\xff"),
    "huge-int": _with_manifest(b'{"step": ' + b"9" * 5000 + b"}"),  # over the int digit limit
    "big-step": lambda m: m.update(step=2**64),  # beyond 64 bits
    "inf-step": lambda m: m.update(step=float("inf")),  # int(inf): OverflowError
    "float-dim": lambda m: m.update(dim=4.5),
    "bool-num_ps": lambda m: m.update(num_ps=True),
    "string-rows": lambda m: m.update(total_rows="120"),
    "parts-object": lambda m: m.update(parts={"a": 1}),
    "part-null": lambda m: m["parts"].__setitem__(0, None),
    "part-meta-list": lambda m: m["parts"][0].update(meta=[0]),
    "part-path": lambda m: m["parts"][0].update(file="../ps-0.bin"),
    "part-inf-bytes": lambda m: m["parts"][0].update(bytes=float("inf")),
    "extra-list": lambda m: m.update(extra=[1, 2]),
    "table-sizes-nan": lambda m: m.update(table_sizes=[float("nan")]),
    "no-ps": lambda m: m.update(num_ps=0, parts=[]),
    "no-rows": lambda m: m.update(total_rows=0),
    "no-dim": lambda m: m.update(dim=0),
    "table-sizes-sum": lambda m: m.update(table_sizes=[70, 51]),
    "same-ps-twice": lambda m: m["parts"][1]["meta"].update(ps_index=0),
    "ps-out-of-range": lambda m: m["parts"][1]["meta"].update(ps_index=5),
}


def _manifest_bytes(committed: Committed, change: Callable[[dict[str, Any]], object]) -> bytes:
    manifest = json.loads(committed.files[MANIFEST])
    replaced = change(manifest)
    if isinstance(replaced, bytes):
        return replaced
    return json.dumps(manifest).encode()  # Infinity and NaN as Python's json writes them


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_restore_skips_a_bad_manifest(
    committed: Committed, tmp_path: Path, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    """A committed checkpoint whose manifest is not a valid one (not an object, wrong types,
    a geometry no restore can use) is skipped with a warning naming the manifest, like any
    corrupt checkpoint: the older good one is restored, and with none left a CheckpointError."""
    good = tmp_path / committed.directory
    bad = tmp_path / "step-0000000009"  # newer than the good one (step 7): tried first
    for step_dir in (good, bad):
        step_dir.mkdir()
        for name, raw in committed.files.items():
            (step_dir / name).write_bytes(raw)
    (bad / MANIFEST).write_bytes(_manifest_bytes(committed, BAD_MANIFESTS[case]))
    with caplog.at_level(logging.WARNING):
        choice = select_checkpoint(tmp_path)
    assert choice is not None and choice.step == 7 and choice.location == str(good)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        f"{bad / MANIFEST}: unreadable manifest" in w and "ignoring this checkpoint" in w
        for w in warnings
    ), warnings
    part = load_checkpoint(tmp_path, num_ps=NUM_PS, ps_index=0)
    assert part is not None and part.step == 7
    np.testing.assert_array_equal(part.dense, committed.dense)
    shutil.rmtree(good)
    with pytest.raises(CheckpointError, match=r"no checkpoint verifies \(1 tried\)"):
        select_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match=r"no checkpoint verifies \(1 tried\)"):
        load_checkpoint(tmp_path, num_ps=NUM_PS, ps_index=0)


# Regressions: descriptor fields that the reader turned into exceptions other than
# CheckpointCorruptError, or arrays whose size it computed from an unchecked shape.
BAD_DESCRIPTORS: list[Callable[[dict[str, Any]], object]] = [
    lambda d: d["arrays"][0].update(shape=[10**400]),
    lambda d: d["arrays"][0].update(shape=[2**62, 2**62]),
    lambda d: d["arrays"][0].update(dtype="O"),
    lambda d: d["arrays"][0].update(dtype="<U8"),
    lambda d: d["arrays"][0].update(dtype="V0"),
    lambda d: d["arrays"][0].update(offset=float("inf")),
    lambda d: d["arrays"][0].update(shape=5),
    lambda d: d["meta"].update(table_sizes=[10**400]),
    lambda d: d["meta"].update(num_ps=float("nan")),
    lambda d: d.update(arrays={"a": 1}),
    lambda d: d.update(extra=[1, 2]),
    lambda d: d["arrays"].append(d["arrays"][0]),
    lambda d: d["arrays"][0].update(dtype=","),  # np.dtype raised SyntaxError
    lambda d: d["arrays"][0].update(dtype="(2,)f4"),
]


@pytest.mark.parametrize("change", range(len(BAD_DESCRIPTORS)))
def test_bad_descriptor_is_corrupt(committed: Committed, tmp_path: Path, change: int) -> None:
    path = tmp_path / "snapshot.part"
    path.write_bytes(_part_with(committed, BAD_DESCRIPTORS[change]))
    with pytest.raises(CheckpointError):
        read_snapshot(path)


def test_header_declaring_a_huge_descriptor_is_corrupt(
    committed: Committed, tmp_path: Path
) -> None:
    """A header may say anything once its own checksum fits: the reader must not trust it."""
    name = next(n for n in sorted(committed.files) if n != MANIFEST)
    raw = bytearray(committed.files[name])
    _fix_header(raw, total_len=len(raw), json_len=len(raw) - 100)
    path = tmp_path / "snapshot.part"
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError):
        read_snapshot(path)


@example(b"\x00" * 64)
@given(st.binary(max_size=200))
@fuzz_settings()
def test_random_bytes_are_not_a_part(tmp_path_factory: pytest.TempPathFactory, raw: bytes) -> None:
    path = tmp_path_factory.getbasetemp() / "random.part"
    path.write_bytes(raw)
    expect_clean(lambda: read_snapshot(path), (CheckpointError,))
