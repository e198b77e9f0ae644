"""Big buffers whose pages are mapped in once, at start, by the cheapest means the kernel offers.

On the VMs we run on, the first write to a page of new memory costs far more than the write
itself: the guest takes a page fault and zeroes the page, and zeroing stalls while the host
provides the memory (free-page reporting gives freed guest memory back to the host, and a kernel
profile of populating a buffer is mostly ``clear_page``). Writing a buffer for the first time
runs at 0.4-1.8 GB/s there, against 12-25 GB/s into pages that are already mapped. A PS holds
several GB (weights, Adagrad accumulator, snapshot buffer), so how these pages are touched is
most of its start-up time.

``madvise(MADV_POPULATE_WRITE)`` (Linux >= 5.14) maps a whole range in one system call: the
kernel allocates, zeroes and maps every page in a loop, without a trap per page. Measured here
(fresh processes, medians of 4-5): 4 KiB anonymous pages 2.5-3.2 GB/s against 1.3-1.6 GB/s for a
first write with ``ndarray.fill``; a tmpfs file (``/dev/shm``) after ``posix_fallocate``
1.2-1.7 GB/s against 0.8-1.4 GB/s for writing one byte per page. Transparent huge pages fault in
2 MiB at a time and were bimodal, 0.9-10.7 GB/s. ``MAP_POPULATE`` was no better for anonymous
memory and, on a shared mapping, left the pages to take a write fault later (9 GB/s copies
instead of 25 GB/s). Populating also turns "no memory" into an error code instead of the
SIGBUS that a write into an unbackable tmpfs page raises.

The call goes through ctypes rather than :meth:`mmap.mmap.madvise` because ctypes releases the
GIL: a PS with more than one CPU populates one range while other threads compute.
Where the kernel lacks ``MADV_POPULATE_WRITE`` (EINVAL) the fallback writes one byte per page,
which maps the same pages by faulting them one at a time.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import math
import mmap
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt

PAGE = mmap.PAGESIZE
MADV_POPULATE_WRITE = 23  # <linux/mman.h>; Python's mmap module has no name for it before 3.13
#: Ranges are populated in pieces of this size, so that a pool of threads shares the work.
POPULATE_PIECE = 64 << 20

_libc: ctypes.CDLL | None = None
_populate_supported = True


def _madvise(address: int, length: int, advice: int) -> int:
    """``madvise(2)``; returns 0 or the errno. ctypes drops the GIL for the call's duration."""
    global _libc  # noqa: PLW0603 (loaded once, on first use)
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        _libc.madvise.restype = ctypes.c_int
    if _libc.madvise(address, length, advice) == 0:
        return 0
    return ctypes.get_errno()


def populate(array: npt.NDArray[Any], threads: int = 1) -> None:
    """Map every page under ``array`` (C-contiguous, writable) into this process now.

    The contents are unchanged where pages exist already: MADV_POPULATE_WRITE only faults
    pages in "as if written", it never writes. ``threads`` > 1 splits the range into
    :data:`POPULATE_PIECE` pieces over a pool.
    """
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError("populate needs a C-contiguous, writable array")
    if array.nbytes == 0:
        return
    start = array.ctypes.data
    # madvise wants a page-aligned start: round down to the start of the array's first page,
    # which belongs to the same mapping as the array's first byte.
    first = start - start % PAGE
    end = start + array.nbytes
    pieces = [(a, min(a + POPULATE_PIECE, end)) for a in range(first, end, POPULATE_PIECE)]
    if threads <= 1 or len(pieces) == 1:
        for a, b in pieces:
            _populate_range(array, a, b, start)
        return
    with ThreadPoolExecutor(min(threads, len(pieces)), thread_name_prefix="populate") as pool:
        for future in [pool.submit(_populate_range, array, a, b, start) for a, b in pieces]:
            future.result()


def _populate_range(array: npt.NDArray[Any], a: int, b: int, base: int) -> None:
    global _populate_supported  # noqa: PLW0603 (remembered once the kernel said no)
    if _populate_supported:
        err = _madvise(a, b - a, MADV_POPULATE_WRITE)
        if err == 0:
            return
        if err not in (errno.EINVAL, errno.ENOSYS):
            # ENOMEM / EFAULT: no memory for the pages (a full tmpfs, the cgroup's limit).
            raise MemoryError(f"cannot map {b - a} bytes: {os.strerror(err)}")
        _populate_supported = False
    # Fallback: rewrite the first byte of each page with its own value (the pages may hold data
    # already, e.g. a file): the write fault maps the page for writing. A ufunc, because numpy
    # skips a plain self-assignment.
    view = array.reshape(-1).view(np.uint8)
    lo = max(a, base) - base
    hi = b - base
    first_page = lo + (-(lo + base)) % PAGE  # the first page boundary at or after lo
    for index in (view[first_page:hi:PAGE], view[lo : lo + 1]):
        np.bitwise_or(index, 0, out=index)


def anonymous(
    shape: int | Sequence[int], dtype: npt.DTypeLike, *, huge_pages: bool = False
) -> npt.NDArray[Any]:
    """A new zero-filled array over its own anonymous mapping, pages not yet mapped in.

    Page aligned (so :func:`populate` maps exactly its pages) and unmapped as soon as the last
    view of it is gone. ``huge_pages`` advises transparent huge pages (``MADV_HUGEPAGE``; the
    kernel here has THP in ``madvise`` mode): for a PS's tables, which are read and updated at
    random rows, the TLB then covers 512x more memory. Measured here on 13M x 32 float32
    weights and accumulator, one Adagrad step on 11k unique Zipf rows took 2.5-2.9 ms on huge
    pages against 3.3-3.7 ms on 4 KiB pages. (numpy advises huge pages for its own big arrays
    too.) This is advice for these long-lived tables only: torch's ``THP_MEM_ALLOC_ENABLE``,
    which advises every torch allocation, temporaries included, was measured to make PS
    lookups ~2x slower, and stays off.
    """
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    dt = np.dtype(dtype)
    count = math.prod(dims)
    if count * dt.itemsize == 0:
        return np.zeros(dims, dtype=dt)
    buffer = mmap.mmap(-1, count * dt.itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # advice only: a kernel without THP says EINVAL
            buffer.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(buffer, dtype=dt, count=count).reshape(dims)


def touched_empty(
    shape: int | Sequence[int],
    dtype: npt.DTypeLike,
    *,
    threads: int = 1,
    huge_pages: bool = False,
) -> npt.NDArray[Any]:
    """Like ``np.zeros``, but every page is mapped in now, ``threads`` at a time.

    ``np.zeros`` gets memory from ``calloc`` that faults in on first use; ``torch.zeros``
    writes its memory at first-write speed. Populating is about twice as fast here (see above).
    """
    array = anonymous(shape, dtype, huge_pages=huge_pages)
    populate(array, threads)
    return array
