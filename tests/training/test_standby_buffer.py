"""The new PS of a live move builds its flash-checkpoint buffer on standby, not in the pause.

Reserving and pre-touching the buffer (shared memory the size of the state) costs ~0.5-1 s a
GiB; built after the release it was most of a 1 GiB move's pause (benchmarks/ps_move_pause.py).
The new PS builds it after its copy, before it tells the master it has copied, and serves with
that same buffer; on the stop-first path (released without ``migrate``) it removes it, and the
restored state gets its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover_kfp.core.pod_env import POD_SHM_ENV
from dlrover_kfp.training import checkpoint as ck
from dlrover_kfp.training.wire import Message, PeerInfo
from tests.training.test_ps_transfer import SwitchMaster, old_ps, push_a_few, run_new_ps


class BufferWatch(SwitchMaster):
    """The switch's master, noting the new PS's shm files each time it asks to be released."""

    def __init__(self, *args: object, ckpt_dir: Path, shm_dir: Path, **kwargs: bool) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.job["checkpoint_dir"] = str(ckpt_dir)
        self.shm_dir = shm_dir
        self.on_standby: list[list[Path]] = []

    def handle(self, peer: PeerInfo, msg: Message) -> Message:
        if msg.meta.get("copied"):
            self.on_standby.append(ck.list_shm("job", self.shm_dir))
        return super().handle(peer, msg)


@pytest.mark.parametrize("migrate", [True, False])
def test_the_buffer_is_built_on_standby_and_served_with_or_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrate: bool
) -> None:
    shm_dir = tmp_path / "pod-shm"
    shm_dir.mkdir()
    monkeypatch.setenv(POD_SHM_ENV, str(shm_dir))
    with old_ps(2) as old:
        push_a_few(old, seed=3)
        master = BufferWatch(
            old, 1, copy=True, migrate=migrate, ckpt_dir=tmp_path / "ckpt", shm_dir=shm_dir
        )
        run_new_ps(master, 1, 0)
    assert master.registered is not None
    (standby, *_) = master.on_standby
    assert len(standby) == 1, "no buffer built before the master heard the copy was done"
    serving = ck.list_shm("job", shm_dir)
    if migrate:
        assert serving == standby  # the same buffer serves: none built in the pause
    else:
        assert len(serving) == 1 and serving != standby  # the copy's buffer went with the copy
