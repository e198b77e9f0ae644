"""Flash checkpoint against torch.save, on one PS's embedding state (weights + Adagrad accumulator).

Side by side in one run, each repeated ``--repeat`` times (median, with min-max):

1. training blocked by our flash checkpoint: the copy into the pre-touched shared-memory buffer;
2. ``torch.save`` of the same tensors to the local disk, plus ``fsync``: what training would
   block for without flash checkpoints;
3. time until our background persist is durable and committed (snapshot start to rename);
4. restore from shared memory, crc32 verification included, into preallocated tensors (what a
   PS that has built its tables does) and into fresh memory (allocation included);
5. restore from the committed files, page cache warm and page cache dropped (``posix_fadvise``
   DONTNEED on the part file, so the bytes come from the device).

Targets: blocked / torch.save <= 0.10; restore >= 1 GB/s. Sizes in GiB, rates in GB/s (1e9).
The checkpoint goes under a temp dir on the local disk (``--dir``; not /dev/shm), and the shm
buffer and the temp dir are removed at the end, also on error or Ctrl-C.

    python benchmarks/flash_checkpoint.py [--gib 1.0] [--dim 16] [--repeat 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrover_kfp.training.checkpoint import (
    FlashCheckpointer,
    PartMeta,
    StateSpec,
    cleanup_shm,
    commit,
    default_shm_dir,
    load_checkpoint,
)

DENSE = 1 << 20  # a 4 MiB dense vector (and its accumulator), as PS 0 holds


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    result = fn()
    return time.perf_counter() - began, result


def torch_save(arrays: dict[str, torch.Tensor], path: Path) -> None:
    with path.open("wb") as f:
        torch.save(arrays, f)
        f.flush()
        os.fsync(f.fileno())


def drop_cache(directory: Path) -> None:
    """Evict the (clean, fsynced) part files from the page cache."""
    for path in directory.glob("*.bin"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def spread(values: list[float]) -> str:
    return f"(min {min(values):.3f}, max {max(values):.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="embedding state (weights+accum)")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--copy-threads",
        type=int,
        default=1,
        help="threads for the snapshot copy (a PS uses 1 by default)",
    )
    parser.add_argument(
        "--dir",
        default=tempfile.gettempdir(),
        help="local disk directory for the checkpoints (default: temp dir)",
    )
    args = parser.parse_args()

    rows = int(args.gib * 2**30 / (2 * args.dim * 4))
    job_id = f"flash-bench-{os.getpid()}"
    workdir = Path(tempfile.mkdtemp(prefix="flash-bench-", dir=args.dir))
    root = workdir / "ckpt"
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, python {platform.python_version()}"
    )
    print(
        f"state: {rows:,} rows x {args.dim} float32 x 2 (weights + accum) + 2 x {DENSE:,} dense"
        f"; checkpoints in {workdir}, shm in {default_shm_dir()}"
    )
    checkpointer: FlashCheckpointer | None = None
    try:
        torch.manual_seed(0)
        built, arrays = timed(
            lambda: {
                "weights": torch.randn(rows, args.dim),
                "accum": torch.rand(rows, args.dim),
                "dense": torch.randn(DENSE),
                "dense_accum": torch.rand(DENSE),
            }
        )
        nbytes = sum(t.numel() * t.element_size() for t in arrays.values())
        gb = nbytes / 1e9
        meta = PartMeta(job_id, num_ps=1, ps_index=0, total_rows=rows, dim=args.dim)
        setup, checkpointer = timed(
            lambda: FlashCheckpointer(
                root, meta, StateSpec.of(arrays), copy_threads=args.copy_threads
            )
        )
        print(
            f"built {nbytes / 2**30:.2f} GiB in {built:.1f} s; shm buffer of "
            f"{checkpointer.shm.capacity / 2**30:.2f} GiB reserved and touched in {setup:.2f} s "
            "(once, at PS start)"
        )
        # Preallocated, touched destinations: the tables a restarted PS has just built.
        out = {name: torch.zeros_like(t) for name, t in arrays.items()}

        figures: dict[str, list[float]] = {
            k: []
            for k in (
                "blocked",
                "torch_save",
                "durable",
                "shm_out",
                "shm_fresh",
                "disk_warm",
                "disk_cold",
            )
        }

        def save_torch() -> None:
            path = workdir / "torch_save.pt"
            t, _ = timed(lambda: torch_save(arrays, path))
            figures["torch_save"].append(t)
            path.unlink()

        for r in range(args.repeat):
            step = r + 1
            arrays["weights"][r].add_(1.0)  # every checkpoint holds a different state
            if r % 2:  # alternate the order, so that disk noise hits both alike
                save_torch()
            began = time.perf_counter()
            stats, future = checkpointer.save(step, arrays)
            record = future.result()
            committed = commit(root, step, [record], {"bench": True}, keep=2)
            figures["durable"].append(time.perf_counter() - began)
            figures["blocked"].append(stats.blocked_s)
            if not r % 2:
                save_torch()

            def restore(**kw: Any) -> Any:
                return load_checkpoint(root, num_ps=1, ps_index=0, **kw)

            t, part = timed(lambda: restore(job_id=job_id, out=out))
            assert part.source == "shm" and part.step == step and part.verified
            figures["shm_out"].append(t)
            if r == 0:
                assert all(torch.equal(out[n], arrays[n]) for n in arrays), "restored != saved"
            t, part = timed(lambda: restore(job_id=job_id))
            assert part.source == "shm" and torch.equal(
                torch.from_numpy(part.weights), arrays["weights"]
            )
            figures["shm_fresh"].append(t)
            del part
            t, part = timed(lambda: restore(out=out))
            assert part.source == "disk" and part.step == step
            figures["disk_warm"].append(t)
            drop_cache(committed)
            t, part = timed(lambda: restore(out=out))
            assert part.source == "disk" and torch.equal(out["accum"], arrays["accum"])
            figures["disk_cold"].append(t)
            print(
                f"  run {step}: blocked {stats.blocked_s:.3f} s, torch.save "
                f"{figures['torch_save'][-1]:.3f} s, durable {figures['durable'][-1]:.3f} s, "
                f"restore shm {gb / figures['shm_out'][-1]:.2f} GB/s, "
                f"disk {gb / figures['disk_cold'][-1]:.2f} GB/s (cold)"
            )

        med = {k: statistics.median(v) for k, v in figures.items()}
        ratio = med["blocked"] / med["torch_save"]
        print(f"\nmedian of {args.repeat}, {nbytes / 2**30:.2f} GiB ({gb:.2f} GB) per checkpoint:")
        print(
            f"  (1) training blocked, flash snapshot   {med['blocked']:7.3f} s  "
            f"{gb / med['blocked']:6.2f} GB/s  {spread(figures['blocked'])}"
        )
        print(
            f"  (2) torch.save + fsync                 {med['torch_save']:7.3f} s  "
            f"{gb / med['torch_save']:6.2f} GB/s  {spread(figures['torch_save'])}"
        )
        print(
            f"  (3) flash: durable and committed       {med['durable']:7.3f} s  "
            f"{gb / med['durable']:6.2f} GB/s  {spread(figures['durable'])}"
        )
        for key, label in (
            ("shm_out", "(4) restore shm + crc32, preallocated"),
            ("shm_fresh", "    restore shm + crc32, fresh memory"),
            ("disk_warm", "(5) restore disk + crc32, cache warm  "),
            ("disk_cold", "    restore disk + crc32, cache cold  "),
        ):
            print(
                f"  {label}  {med[key]:7.3f} s  {gb / med[key]:6.2f} GB/s  {spread(figures[key])}"
            )
        restore_gbs = gb / med["shm_out"]
        print(
            f"\nblocked / torch.save = {ratio:.3f}  (target <= 0.10: "
            f"{'OK' if ratio <= 0.10 else 'MISSED'}); against the fastest torch.save: "
            f"{med['blocked'] / min(figures['torch_save']):.3f}"
        )
        print(
            f"restore from shm = {restore_gbs:.2f} GB/s, from disk (cold) = "
            f"{gb / med['disk_cold']:.2f} GB/s  (target >= 1 GB/s: "
            f"{'OK' if restore_gbs >= 1.0 else 'MISSED'})"
        )
        return 0
    finally:
        if checkpointer is not None:
            checkpointer.close()
        removed = cleanup_shm(job_id)
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"cleaned up {workdir} and {len(removed)} shm file(s)")


if __name__ == "__main__":
    raise SystemExit(main())
