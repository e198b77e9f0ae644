"""One flipped bit in a checkpoint's manifest (the shard ledger, the shard ranges), and a
consistent edit of it (its checksum recomputed), then the run resumed: it falls back to an
older checkpoint and trains its exact count, or refuses; never success with wrong counts,
never a hang.

Before the manifest had a checksum and its ledger was cross-checked against the run's split,
``"epoch": 1`` read as ``0`` (one bit) left a ledger with nothing to lease and the epoch not
done: the resumed master waited at 100% (9 minutes, until it was killed); a range's end read as
``36001`` trained the first held-out row and reported 36,001 of 36,000 samples.

The counts come from the data alone: 40,000 synthetic rows hold out the 10% tail (4,000), so
36,000 are trained once, in shards of 8,192 rows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dlrover_kfp.training.checkpoint.format import CHECKSUM_KEY, manifest_checksum

ROOT = Path(__file__).resolve().parents[2]
ROWS = 100_000
TRAINED = ROWS - ROWS // 10

JOB = f"""\
name: flips
model: {{embedding_dim: 8, table_sizes: [1000, 50, 7, 3000], bottom_mlp: [16, 8], top_mlp: [16, 1]}}
data: {{format: synthetic, rows: {ROWS}, seed: 4}}
training: {{batch_size: 256}}
resources:
  workers: {{count: 1, cpu: 0.25, memory: 2Gi}}
  ps: {{count: 1, cpu: 1, memory: 2Gi}}
"""


def _cli(cwd: Path, out: str, *prefix: str) -> subprocess.CompletedProcess[str]:
    argv = ["run", "--job", "job.yaml", "--static", "--output-dir", out]
    return subprocess.run(
        [sys.executable, *(prefix or ("-m", "dlrover_kfp.cli.main")), *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,  # a resume that hangs at 100% fails here, not at the suite's timeout
        check=False,
    )


def _newest_manifest(out: Path) -> Path:
    return sorted(p for p in (out / "checkpoints").glob("step-*") if p.suffix != ".tmp")[-1] / (
        "manifest.json"
    )


def _flip_epoch(text: str) -> str:
    """The ledger's epoch 1 as 0 (the final checkpoint: every shard done) or 0 as 1 (a periodic
    one): '1' (0x31) and '0' (0x30) differ in one bit."""
    shards = text.index('"shards"')
    at = text.index('"epoch": ', shards) + len('"epoch": ')
    return text[:at] + {"0": "1", "1": "0"}[text[at]] + text[at + 1 :]


def _flip_range_end(text: str) -> str:
    """The last shard's end, 90000, as 90001 ('0' to '1', one bit): a held-out row."""
    ranges = text.index('"ranges"')
    block_end = text.index('"epochs"', ranges)
    at = text.rindex(str(TRAINED), ranges, block_end) + len(str(TRAINED)) - 1
    return text[:at] + "1" + text[at + 1 :]


def _resealed_range_end(text: str) -> str:
    """The same edit made consistently (the checksum recomputed, as a tool would)."""
    manifest = json.loads(_flip_range_end(text))
    manifest[CHECKSUM_KEY] = manifest_checksum(manifest)
    return json.dumps(manifest, indent=1)


EDITS: dict[str, Callable[[str], str]] = {
    "ledger-bit": _flip_epoch,
    "ranges-bit": _flip_range_end,
    "ranges-resealed": _resealed_range_end,
}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run SIGKILLed right after its second committed checkpoint (the final one or a
    periodic one): an older one is beside it."""
    cwd = tmp_path_factory.mktemp("flips")
    (cwd / "job.yaml").write_text(JOB)
    argv = ("-m", "tests.integration.stop_at", "commit-2", "SIGKILL")
    done = subprocess.run(
        [sys.executable, *argv, "run", "--job", "job.yaml", "--static", "--output-dir", "out",
         "--checkpoint-interval", "0.5"],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == -9, f"fewer than 2 checkpoints committed: {done.stderr[-2000:]}"
    committed = [p for p in (cwd / "out" / "checkpoints").glob("step-*") if p.suffix != ".tmp"]
    assert len(committed) >= 2, committed  # an older one to fall back to
    return cwd


def _edits() -> list[Any]:
    """The two one-bit flips in the default suite; the consistent edit, which the ledger's
    cross-check catches (also in ``tests/unit/test_shards.py``), with ``-m long``."""
    return [
        pytest.param(e, id=e, marks=[pytest.mark.long] if e == "ranges-resealed" else [])
        for e in sorted(EDITS)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("edit", _edits())
def test_a_changed_manifest_falls_back_to_an_older_checkpoint(stopped: Path, edit: str) -> None:
    out = f"out-{edit}"
    shutil.copytree(stopped / "out", stopped / out)
    manifest = _newest_manifest(stopped / out)
    before = manifest.read_text()
    after = EDITS[edit](before)
    assert after != before
    if edit.endswith("-bit"):  # exactly one bit of the file differs
        diff = [a ^ b for a, b in zip(before.encode(), after.encode(), strict=True) if a != b]
        assert len(diff) == 1 and bin(diff[0]).count("1") == 1
    manifest.write_text(after)

    resumed = _cli(stopped, out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout)
    assert summary["outcome"]["samples_processed"] == TRAINED
    assert summary["metrics"]["eval_rows"] == ROWS // 10
    reason = "checksum" if edit.endswith("-bit") else "shard ledger is not this run's"
    assert re.search(rf"{manifest.parent}.*{reason}", resumed.stderr), resumed.stderr[-3000:]
    assert "resuming from the checkpoint of step" in resumed.stderr
