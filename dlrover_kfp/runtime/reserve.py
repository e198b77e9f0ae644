"""Disk space a run holds back for its profile, so that a full disk never loses the run's record.

A run's output disk can fill while it trains (its checkpoints, its logs, anything else on the
disk). The checkpoints then fail and the run fails, and what is left to write is the profile:
the record of what happened, which tomorrow's run starts from. So a run keeps a preallocated
file, ``DIR/.profile-reserve``, from its start: big enough for the profile's writes at the end
(``DIR/profile.json`` and, when the history's disk is full too, the copy in the history's
pending store), growing with the profile's samples. A write of the profile that finds the disk
full gives up that much of the reserve and is tried again (:func:`~dlrover_kfp.files.
write_atomic`); once the profile is where it goes, the reserve is removed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dlrover_kfp.core.documents import to_json
from dlrover_kfp.core.profile import RuntimeSample
from dlrover_kfp.files import reserve_space

log = logging.getLogger(__name__)

#: The reserve's file in a run's output directory.
RESERVE_FILE = ".profile-reserve"

#: The profile's size before any sample: the job, plans, events and outcome are a few KiB;
#: 256 KiB also holds the ~1,000 events (~250 bytes each) of a long elastic run.
BASE_BYTES = 256 << 10

#: Copies of the profile the reserve holds: ``profile.json``, the pending store's copy (the
#: history and its pending store are on the output's disk by default), and ``profile.json``
#: again with the event that says where the copy is (the old one is freed only by the rename).
COPIES = 3

#: The reserve grows in steps of this: a sample of 4 pods is ~1.2 KiB and of 34 pods ~9 KiB
#: (measured on to_json of RuntimeSample), so a step is hundreds of samples, one fallocate.
STEP_BYTES = 1 << 20


def reserve_path(output_dir: Path) -> Path:
    return output_dir / RESERVE_FILE


class ProfileReserve:
    """The reserve of one run (see the module docstring); :meth:`add` each runtime sample."""

    def __init__(self, output_dir: Path) -> None:
        self.path = reserve_path(output_dir)
        #: the bytes the profile will need, as far as its samples so far say
        self.profile_bytes = BASE_BYTES
        #: the bytes the reserve holds (0 until the disk had room for it)
        self.held = 0
        self._warned = False
        self._grow()

    def add(self, sample: RuntimeSample) -> None:
        """The profile grew by ``sample``: grow the reserve with it (in whole steps)."""
        self.profile_bytes += len(to_json(sample)) + 2  # the list's ",\n"
        self._grow()

    def _grow(self) -> None:
        wanted = COPIES * self.profile_bytes
        if wanted <= self.held:
            return
        size = -(-wanted // STEP_BYTES) * STEP_BYTES
        if reserve_space(self.path, size):
            self.held = size
        elif not self._warned:
            self._warned = True
            log.warning(
                "%s: cannot reserve %d KiB for the profile (disk full?); a full disk at the "
                "end of the run may leave no profile.json",
                self.path,
                size >> 10,
            )

    def untouched(self) -> bool:
        """Whether no write has needed the reserve (the disk was not full)."""
        try:
            return self.path.stat().st_size >= self.held
        except FileNotFoundError:
            return self.held == 0

    def release(self) -> None:
        """The profile is where it goes: give the space back."""
        self.path.unlink(missing_ok=True)
        self.held = 0


__all__ = ["RESERVE_FILE", "ProfileReserve", "reserve_path"]
