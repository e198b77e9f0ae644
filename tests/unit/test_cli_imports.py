"""``dlrover-kfp`` starts without torch and scipy, which its quick commands do not use.

Every ``dlrover-kfp`` process pays for what ``cli.main`` imports: ``--help``, ``schema``,
``history list``, ``cleanup``, and the master that ``run``, the Airflow operator and the KFP
components start. torch took 1.1 s of a 2.6 s start and scipy 0.7 s; they are imported where
they are used: the export at the end of a run (torch, scipy.stats), a fit (scipy.optimize), a PS
restoring its tensors. ``cli.main`` imports every command module, and through ``run``,
``quickstart`` and ``cleanup`` the master's (runtime.job, launch, elastic, export) and the
checkpoint package, so building the parser covers them all.

Each case runs in a fresh interpreter and reads ``sys.modules``: what was imported, not how
long it took, so the tests are deterministic.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: Run in a fresh interpreter: the code of a case, then print the heavy packages it loaded.
_PROBE = """
import contextlib, io, json, sys
{code}
print(json.dumps(sorted(name for name in ("torch", "scipy") if name in sys.modules)))
"""

_MAIN = "from dlrover_kfp.cli.main import main\n"
_QUIET = "with contextlib.redirect_stdout(io.StringIO()):\n    assert main({argv!r}) == 0\n"


def _heavy_loaded(code: str) -> list[str]:
    """Which of torch and scipy a fresh interpreter holds after running ``code``."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(code=code)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    loaded: list[str] = json.loads(out.stdout.splitlines()[-1])
    return loaded


def test_building_the_parser_imports_neither_torch_nor_scipy() -> None:
    """``dlrover-kfp --help`` (and any usage error) needs only argparse and the registrations."""
    code = "from dlrover_kfp.cli.main import build_parser\nbuild_parser()\n"
    assert _heavy_loaded(code) == []


def test_schema_imports_neither_torch_nor_scipy() -> None:
    assert _heavy_loaded(_MAIN + _QUIET.format(argv=["schema", "job"])) == []


def test_history_list_imports_neither_torch_nor_scipy(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    assert _heavy_loaded(_MAIN + _QUIET.format(argv=["history", "list", "--history", url])) == []
