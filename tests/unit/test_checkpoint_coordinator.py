"""The master's checkpoint coordinator against a PS that answers over the real transport."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlrover_kfp.runtime.checkpoints import CheckpointCoordinator
from dlrover_kfp.training import checkpoint as ckpt
from dlrover_kfp.training.wire import Message, PeerInfo, Server, new_secret


class FakePs:
    """Snapshots at once; the persist of step 1 fails, later ones never finish."""

    def __init__(self) -> None:
        self.step = -1
        self.snapshots: list[int] = []

    def handle(self, peer: PeerInfo, msg: Message) -> Message:
        if msg.kind == "checkpoint":
            self.step = int(msg.meta["step"])
            self.snapshots.append(self.step)
            return Message("ok", {"blocked_s": 0.001}, ())
        if msg.kind == "checkpoint_status":
            status: dict[str, Any] = {"step": self.step, "done": False, "error": None}
            if self.step == 1:
                status |= {"done": True, "error": "disk full"}
            return Message("checkpoint_status", status, ())
        return Message("ok", {}, ())


def test_a_failed_checkpoint_does_not_fail_the_next_one(tmp_path: Path) -> None:
    secret = new_secret()
    ps = FakePs()
    server = Server(("127.0.0.1", 0), secret, ps.handle)
    server.serve_in_thread(name="fake-ps")
    coordinator = CheckpointCoordinator(tmp_path, [server.address], secret, timeout_s=1.0)
    try:
        with pytest.raises(ckpt.CheckpointWriteError, match="disk full"):
            coordinator.checkpoint(1, extra={})
        # Step 2's snapshot is taken (its persist goes on behind): step 1's error is not its.
        coordinator.snapshot(2, extra={})
        assert ps.snapshots == [1, 2]
    finally:
        coordinator.close()
        server.stop()
        server.close()
    # Step 2's own outcome (its persist never finished) is reported, once it is known.
    assert isinstance(coordinator.error, ckpt.CheckpointWriteError)
    assert "step 2" in str(coordinator.error)
