"""The bookkeeping of ``benchmarks/ps_move_pause.py``: its ratios, its reading of a PS log, its
arguments. Its moves start real PS processes and take minutes, so they are not run here."""

from __future__ import annotations

import math

import pytest

from benchmarks import ps_move_pause as bench  # benchmarks/ is a namespace package on the path


def _move(method: str, pause_s: float) -> bench.Move:
    return bench.Move(method, pause_s, pause_s, True, method, 0.0, 0.0, 1 << 20)


def test_ratios_divide_each_method_by_network_of_the_same_round() -> None:
    rounds = [
        {"network": _move("network", 0.5), "shm": _move("shm", 1.0), "restart": _move("r", 5.0)},
        {"network": _move("network", 0.25), "shm": _move("shm", 1.0), "restart": _move("r", 2.0)},
    ]
    assert bench.ratios(rounds) == {"shm/network": [2.0, 4.0], "restart/network": [10.0, 8.0]}


def test_ready_to_serving_reads_the_ps_log_between_its_state_and_its_serving_line() -> None:
    log = "\n".join(
        [
            "2026-11-27 02:44:01,100 INFO ps-0: PS 0: moved 2097152 rows, 300.0 MiB from 1 old PS",
            "2026-11-27 02:44:01,350 INFO ps-0: PS 0: 2097152 rows x 16 (128.0 MiB) on port 4100",
            "2026-11-27 02:44:09,000 INFO ps-0: PS 0: 2097152 rows x 16 (128.0 MiB) on port 4200",
        ]
    )
    assert bench.ready_to_serving(log) == pytest.approx(0.25)
    restored = log.replace("moved 2097152 rows", "restored step 1 from /x (shm, written by 1 PS)")
    assert bench.ready_to_serving(restored) == pytest.approx(0.25)
    assert math.isnan(bench.ready_to_serving(log.splitlines()[1]))  # no state line: unknown


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gib", "0"], "--gib: must be > 0"),
        (["--rounds", "0"], "--rounds: must be > 0"),
        (["--methods", "shm,restart"], "include it"),
        (["--methods", "network,disk"], "unknown ['disk']"),
        (["--gib", "2"], "holds about 11.0 GiB at once, 8.0 GiB available"),
    ],
)
def test_bad_arguments_exit_2_saying_which(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bench, "mem_available", lambda: 8 << 30)
    with pytest.raises(SystemExit) as exited:
        bench.main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
