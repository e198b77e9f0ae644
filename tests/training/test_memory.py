"""Pre-faulted buffers (dlrover_kfp.training.memory) and the snapshot buffer built with them."""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from dlrover_kfp.training import memory
from dlrover_kfp.training.checkpoint import CheckpointError, PartMeta, ShmSnapshot

MB = 1 << 20


def resident_bytes() -> int:
    """This process's resident set (anonymous + file pages), from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


needs_proc = pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")


@needs_proc
def test_touched_empty_is_zero_and_resident_at_once() -> None:
    before = resident_bytes()
    lazy = memory.anonymous((16 * MB // 4,), np.float32)
    assert resident_bytes() - before < 8 * MB  # not mapped in yet
    before = resident_bytes()
    array = memory.touched_empty((4 * MB, 4), np.float32, threads=2)
    assert resident_bytes() - before >= 60 * MB  # 64 MiB mapped in by the call itself
    assert array.shape == (4 * MB, 4) and array.dtype == np.float32
    assert array.flags.c_contiguous and array.flags.writeable
    assert array.ctypes.data % mmap.PAGESIZE == 0
    assert not array.any()
    array[-1, -1] = 3.0
    assert not lazy.any()


def test_huge_page_buffers_are_zero_and_aligned() -> None:
    array = memory.touched_empty((3, 2 * MB), np.uint8, huge_pages=True, threads=2)
    assert not array.any()
    assert array.ctypes.data % mmap.PAGESIZE == 0
    array[2, -1] = 1
    assert int(array.sum()) == 1


def test_empty_shapes() -> None:
    assert memory.touched_empty((0, 8), np.float32).shape == (0, 8)
    assert memory.anonymous(0, np.uint8).size == 0
    memory.populate(np.zeros(0, dtype=np.uint8))


def test_populate_keeps_contents_of_any_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "POPULATE_PIECE", 3 * mmap.PAGESIZE)
    data = np.arange(5 * MB, dtype=np.uint8)
    expected = data.copy()
    for threads in (1, 3):
        memory.populate(data[100 : 4 * MB + 7], threads)  # unaligned start and end
        memory.populate(data, threads)
    assert np.array_equal(data, expected)
    with pytest.raises(ValueError, match="C-contiguous"):
        memory.populate(data[::2])


@needs_proc
def test_fallback_without_madv_populate_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels before 5.14 answer EINVAL: pages are then written one byte each, unchanged."""
    calls = []

    def old_kernel(address: int, length: int, advice: int) -> int:
        calls.append(advice)
        return errno.EINVAL

    monkeypatch.setattr(memory, "_madvise", old_kernel)
    monkeypatch.setattr(memory, "_populate_supported", True)
    monkeypatch.setattr(memory, "POPULATE_PIECE", 5 * mmap.PAGESIZE)
    array = memory.anonymous(8 * MB, np.uint8)
    array[3 * MB : 3 * MB + 10] = 7
    before = resident_bytes()
    memory.populate(array[1:], threads=2)
    assert resident_bytes() - before >= 7 * MB
    assert calls == [memory.MADV_POPULATE_WRITE]  # asked once, then remembered
    assert int(array.sum()) == 70


def test_no_memory_is_an_error_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_madvise", lambda address, length, advice: errno.EFAULT)
    monkeypatch.setattr(memory, "_populate_supported", True)
    with pytest.raises(MemoryError, match="cannot map"):
        memory.touched_empty(MB, np.uint8)


# ------------------------------------------------------------------------ the snapshot buffer


META = PartMeta("job-mem", 1, 0, 100, 4)


@pytest.mark.parametrize("threads", [1, 2])
def test_snapshot_buffer_is_reserved_and_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    monkeypatch.setattr(memory, "POPULATE_PIECE", 16 * mmap.PAGESIZE)
    snap = ShmSnapshot(META, 3 * MB + 5, shm_dir=tmp_path, generation=1, copy_threads=threads)
    try:
        assert snap.path.stat().st_size == snap.capacity >= 3 * MB + 5
        assert not list(tmp_path.glob("*.tmp"))
        weights = np.arange(400, dtype=np.float32).reshape(100, 4)
        snap.snapshot(5, {"weights": weights, "accum": weights * 2})
        assert snap.step == 5
    finally:
        snap.close()
        snap.unlink()


def test_full_tmpfs_is_a_checkpoint_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(CheckpointError, match="no room"):
        ShmSnapshot(META, MB, shm_dir=tmp_path, generation=1)
    assert not list(tmp_path.iterdir())  # the temporary file is gone too


def test_populate_failure_is_a_checkpoint_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "_madvise", lambda address, length, advice: errno.ENOMEM)
    monkeypatch.setattr(memory, "_populate_supported", True)
    with pytest.raises(CheckpointError, match="no room"):
        ShmSnapshot(META, MB, shm_dir=tmp_path, generation=1, copy_threads=2)
    assert not list(tmp_path.iterdir())


def test_without_fallocate_populate_alone_reserves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def unsupported(fd: int, offset: int, length: int) -> None:
        calls.append(offset)
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    monkeypatch.setattr(memory, "POPULATE_PIECE", 16 * mmap.PAGESIZE)
    snap = ShmSnapshot(META, MB, shm_dir=tmp_path, generation=1)
    try:
        assert calls == [0]  # tried once, then left out
        assert snap.path.stat().st_size == snap.capacity
    finally:
        snap.close()
        snap.unlink()
