"""A process body for the fresh-file race test, in a module that imports only the store.

The test forks these from a forkserver that preloads this module, so each process starts in
milliseconds instead of re-importing the test suite's dependencies.
"""

from __future__ import annotations

from typing import Any

from dlrover_kfp.history import open_history


def open_once(url: str, barrier: Any, results: Any) -> None:
    """Open the store (creating it) at the same moment as the others; report any error."""
    try:
        barrier.wait(timeout=60)
        open_history(url).close()
        results.put("")
    except Exception as exc:  # reported to the parent, which fails the test with it
        results.put(repr(exc))
