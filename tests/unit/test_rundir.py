"""The output directory's lock and the inputs a run is bound to, without training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlrover_kfp.errors import UserInputError
from dlrover_kfp.runtime.rundir import (
    LOCK_FILE,
    OutputDirBusyError,
    OutputDirLock,
    RunInputsChangedError,
    archive_run,
    changed_inputs,
    hold_output_dir,
    prepare_output_dir,
    refuse_changed,
)

HOLD = """
import sys, time
from pathlib import Path
from dlrover_kfp.runtime.rundir import OutputDirLock
OutputDirLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(60)
"""


def _holder(directory: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_naming_the_first_and_the_lock_dies_with_a_killed_holder(
    tmp_path: Path,
) -> None:
    holder = _holder(tmp_path)
    try:
        with pytest.raises(OutputDirBusyError, match=rf"pid {holder.pid} on .*, started 20"):
            OutputDirLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    # No stale lock: the kernel released it with the killed process.
    with OutputDirLock(tmp_path):
        pass
    assert (tmp_path / LOCK_FILE).exists()  # the file stays; only the flock counted


def test_the_lock_is_exclusive_within_one_process_too(tmp_path: Path) -> None:
    with OutputDirLock(tmp_path), pytest.raises(OutputDirBusyError):
        OutputDirLock(tmp_path).acquire()
    with OutputDirLock(tmp_path):  # released on exit
        pass


def test_an_output_dir_that_is_a_file_or_under_a_file_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserInputError, match=r"--output-dir .*/f: is a file, not a directory"):
        prepare_output_dir(tmp_path / "f")
    with pytest.raises(UserInputError, match=r"a parent of it is a file"):
        prepare_output_dir(tmp_path / "f" / "sub")


def test_fresh_archives_the_earlier_run_and_keeps_the_lock_file(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(
        json.dumps({"run_id": "job-1", "job": "job", "started_wall": 1.0})
    )
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "x").write_text("1")
    with hold_output_dir(tmp_path, fresh=True) as held:
        assert held == tmp_path.absolute()
        assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE, "archive"]
    archived = tmp_path / "archive" / "job-1"
    assert (archived / "checkpoints" / "x").read_text() == "1"
    assert json.loads((archived / "run.json").read_text())["run_id"] == "job-1"
    # A second archive of the same run id does not overwrite the first.
    (tmp_path / "run.json").write_text(
        json.dumps({"run_id": "job-1", "job": "job", "started_wall": 1.0})
    )
    assert archive_run(tmp_path, "job-1") == tmp_path / "archive" / "job-1.2"
    assert archive_run(tmp_path) is None  # nothing left to move


def test_a_changed_input_names_the_field_with_its_old_and_new_value(tmp_path: Path) -> None:
    old = {"name": "a", "data.rows": 600000, "model.table_sizes": [10, 20]}
    new = {"name": "a", "data.rows": 300000, "model.table_sizes": [10, 20]}
    with pytest.raises(RunInputsChangedError, match=r"data\.rows: 600000 -> 300000\).*--fresh"):
        refuse_changed(tmp_path / "run.json", old, new)
    refuse_changed(tmp_path / "run.json", old, dict(old))  # the same inputs: resumes


values = st.one_of(st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=3))
inputs = st.dictionaries(st.sampled_from(["a", "b", "c.d", "e[f]"]), values, max_size=4)


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(old=inputs, new=inputs)
def test_changed_inputs_lists_exactly_the_fields_that_differ(
    old: dict[str, object], new: dict[str, object]
) -> None:
    lines = changed_inputs(old, new)
    differing = {
        k for k in old.keys() | new.keys() if k not in old or k not in new or old[k] != new[k]
    }
    assert sorted(line.split(":", 1)[0] for line in lines) == sorted(differing)
    assert not changed_inputs(new, new)


def test_a_refused_holder_returns_at_once(tmp_path: Path) -> None:
    with OutputDirLock(tmp_path):
        started = time.monotonic()
        with pytest.raises(OutputDirBusyError):
            OutputDirLock(tmp_path).acquire()
        assert time.monotonic() - started < 1.0  # non-blocking: no wait for the holder


def test_a_data_file_rewritten_in_place_is_another_input(tmp_path: Path) -> None:
    from dlrover_kfp.core.documents import parse  # noqa: PLC0415
    from dlrover_kfp.core.spec import JobSpec  # noqa: PLC0415
    from dlrover_kfp.runtime.rundir import run_inputs  # noqa: PLC0415
    from dlrover_kfp.training.datasets import open_dataset  # noqa: PLC0415

    data = tmp_path / "part-0.csv"
    source = Path(__file__).resolve().parents[1] / "data" / "criteo_sample.csv"
    data.write_bytes(source.read_bytes())
    spec = parse(
        JobSpec,
        {
            "name": "files",
            "model": {"table_sizes": [100] * 26},
            "data": {"format": "criteo", "path": str(data)},
            "training": {"batch_size": 64},
        },
        "job.yaml",
    )

    def inputs() -> dict[str, object]:
        dataset = open_dataset(spec.data, spec.model, tmp_path)
        return run_inputs(spec, dataset, shard_rows=8192, eval_fraction=0.1)

    before = inputs()
    assert before == inputs()  # stable while nothing changes
    os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns + 1_000_000))
    with pytest.raises(RunInputsChangedError, match=rf"data\.file\[{data}\]: \d+ bytes"):
        refuse_changed(tmp_path / "run.json", before, inputs())
