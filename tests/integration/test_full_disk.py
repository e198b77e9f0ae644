"""A full output disk keeps the run's record (issue 25, item 4).

The disk is a small tmpfs (root only, as in the chaos suite's full-disk test) that holds the
run's output directory *and* the user's data directory (the default place of the history and
of its pending store), as on a laptop with one disk. It is filled to the last byte before the
run's final checkpoint: the checkpoint fails and the run fails with that reason, no partial
``step-N.tmp`` stays, ``profile.json`` is still written (from the space the run reserved at
its start), the history (full too) keeps the profile in its pending store with an event that
says "disk full", and once the user frees space ``dlrover-kfp record --pending`` records it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlrover_kfp.cli.main import main
from dlrover_kfp.core.documents import to_json
from dlrover_kfp.files import write_atomic
from dlrover_kfp.history import open_history
from dlrover_kfp.history.pending import pending_dir
from dlrover_kfp.runtime.job import RunResult
from dlrover_kfp.runtime.launch import record_run
from dlrover_kfp.runtime.reserve import RESERVE_FILE, ProfileReserve
from tests.chaos.harness import SmallDisk, mounted_small_disk
from tests.factories import make_profile
from tests.integration.test_run_cli import JOB as CLI_JOB

REPO = Path(__file__).resolve().parents[2]

#: test_run_cli's small job, under a name of its own.
JOB = CLI_JOB.replace("name: cli-run\nscenario: ads-ctr\n", "name: full-disk\n")
assert "name: full-disk\n" in JOB


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    yield from mounted_small_disk(tmp_path / "disk", 16)


def _history_ids(db: Path) -> list[str]:
    with open_history(str(db)) as store:
        return [s.run_id for s in store.list(limit=100)]


def test_the_end_of_a_run_on_a_full_disk_keeps_its_profile(
    disk: SmallDisk, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the run does once it has failed on a full disk, without the training (fast): the
    profile is written from the reserve, and the history on the same full disk keeps it
    pending; `record --pending` records it once space is freed."""
    monkeypatch.setenv("XDG_DATA_HOME", str(disk.path / "data"))
    monkeypatch.delenv("DLROVER_KFP_PENDING_DIR", raising=False)
    out = disk.path / "out"
    out.mkdir()
    db = disk.path / "data" / "dlrover-kfp" / "history.db"
    open_history(str(db)).close()  # the default location, created
    reserve = ProfileReserve(out)
    profile = make_profile("full-disk-1", status="failed", reason="disk full", samples=200)
    for sample in profile.samples:  # as the run grows it with each runtime sample
        reserve.add(sample)
    text = to_json(profile) + "\n"
    free = disk.fill()
    assert (out / RESERVE_FILE).stat().st_size == reserve.held > 3 * len(text)
    with pytest.raises(OSError, match="No space left"):
        (out / "probe").write_text(text)  # the disk is full
    write_atomic(out / "profile.json", text, reserve=reserve.path)
    said: list[str] = []
    result = record_run(str(db), RunResult(profile, out, None), said.append)

    kept = pending_dir(f"sqlite:///{db}") / "full-disk-1.json"
    assert kept.is_file(), said
    event = result.profile.events[-1]
    assert "disk full" in event.detail and "record --pending" in event.detail, event
    assert json.loads((out / "profile.json").read_text())["events"][-1]["detail"] == event.detail
    assert not (out / RESERVE_FILE).exists()  # given back once the profile is safe
    free()  # as a user would: make room, then record what waited
    assert main(["record", "--pending", "--history", str(db)]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "recorded": [{"run_id": "full-disk-1", "new": True}]
    }
    assert not kept.exists()
    assert _history_ids(db) == ["full-disk-1"]


@pytest.mark.long  # 25 s: a real static run, then its final checkpoint tried 4 times (7 s)
def test_a_run_that_fills_its_disk_fails_with_the_reason_and_its_profile_is_recorded(
    disk: SmallDisk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    data = disk.path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(data))  # here as in the run: where pending is
    db = data / "dlrover-kfp" / "history.db"  # the default location, on the full disk
    out = disk.path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "XDG_DATA_HOME": str(data),
        "DLROVER_KFP_PENDING_DIR": "",
    }
    cli = [sys.executable, "-m", "dlrover_kfp.cli.main"]
    argv = [*cli, "run", "--static", "--job", str(tmp_path / "job.yaml"), "--output-dir"]
    flags = ["--history", str(db), "--sample-interval", "0.3", "--checkpoint-interval", "0"]
    child = subprocess.Popen(
        [*argv, str(out), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    err = ""
    free = None
    try:
        assert child.stderr is not None
        for line in child.stderr:
            err += line
            if "samples/s" in line:  # training has started: the final checkpoint is ahead
                free = disk.fill()
                break
        started = time.monotonic()
        stdout, rest = child.communicate(timeout=240)
        err += rest
    finally:
        if child.poll() is None:
            child.kill()
    assert free is not None, err
    print(f"\nthe run ended {time.monotonic() - started:.1f} s after the disk was full")
    assert child.returncode == 1, err  # a failed run, not a crash
    assert "Traceback" not in err
    summary = json.loads(stdout)
    reason = summary["outcome"]["reason"]
    assert summary["outcome"]["status"] == "failed"
    assert "final checkpoint" in reason and "No space left on device" in reason
    assert not list((out / "checkpoints").glob("step-*.tmp")), list(out.rglob("*"))
    assert not (out / RESERVE_FILE).exists()
    profile = json.loads((out / "profile.json").read_text())
    assert profile["outcome"]["reason"] == reason
    assert "disk full" in profile["events"][-1]["detail"]
    run_id = summary["run_id"]
    kept = pending_dir(f"sqlite:///{db}", {"DLROVER_KFP_PENDING_DIR": ""}) / f"{run_id}.json"
    assert kept.parent.parent == data / "dlrover-kfp" / "pending"
    assert kept.is_file(), err

    free()  # as a user would: make room on the disk, then record what waited

    def after(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*cli, *args, "--history", str(db)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done

    record = after("record", "--pending")
    assert json.loads(record.stdout) == {"recorded": [{"run_id": run_id, "new": True}]}
    listed = after("history", "list")
    assert run_id in listed.stdout and "failed" in listed.stdout
