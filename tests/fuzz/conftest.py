"""Registers the fuzz profiles (``ci`` by default, ``long`` with DLROVER_KFP_FUZZ_PROFILE=long).

See :mod:`tests.fuzz._support`; running ``pytest tests/fuzz --hypothesis-show-statistics``
prints how many inputs each target tried.
"""

from __future__ import annotations

from tests.fuzz import _support

PROFILE = _support.active_profile()
