"""The light install: what works without the ``train`` extra (torch), and what refuses.

torch is the ``train`` extra (pyproject.toml), so that the Airflow provider and the plan and
record steps install without it. Each case runs in a fresh interpreter in which torch cannot
be imported: ``sys.modules["torch"] = None`` is Python's own way to block an import, and it
gives the two answers an environment without torch gives (``import torch`` raises
``ModuleNotFoundError``, ``importlib.util.find_spec("torch")`` is None). A real venv without
torch is checked by hand as docs/install.md says.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from dlrover_kfp.core.documents import to_json
from tests.factories import make_profile

REPO = Path(__file__).resolve().parents[2]
SMALL_JOB = REPO / "examples" / "jobs" / "small.yaml"

#: First lines of every case: torch cannot be imported in this interpreter.
_NO_TORCH = "import sys\nsys.modules['torch'] = None\n"


def _run_without_torch(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "DLROVER_KFP_HISTORY_URL": f"sqlite:///{tmp_path / 'history.db'}",
        "DLROVER_KFP_RUNS_DIR": str(tmp_path / "runs"),
    }
    return subprocess.run(
        [sys.executable, "-c", _NO_TORCH + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
        check=False,
    )


def test_provider_plan_record_and_history_work_without_torch(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(to_json(make_profile("light-1")), encoding="utf-8")
    code = f"""
        import airflow_plugin.hooks, airflow_plugin.operators, airflow_plugin.plugin
        import airflow_plugin.triggers
        from components import glue
        from dlrover_kfp.cli.main import main
        tmp = {str(tmp_path)!r}
        assert main(["plan", "--job", {str(SMALL_JOB)!r}, "--output", tmp + "/plan.json"]) == 0
        glue.plan_resources({str(SMALL_JOB)!r}, "", "local", "kfp-run-1", tmp + "/p.json",
                            tmp + "/p.md")
        assert main(["record", "--profile", {str(profile)!r}]) == 0
        glue.record_profile({str(profile)!r}, "", "kfp-run-1", tmp + "/summary.md")
        assert main(["history", "show", "light-1"]) == 0
        print("torch imported:", sys.modules["torch"] is not None)
    """
    done = _run_without_torch(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "torch imported: False"
    assert (tmp_path / "plan.json").is_file()
    assert (tmp_path / "p.json").is_file()


def test_a_run_without_torch_fails_with_one_line_naming_the_extra(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = f"""
        from dlrover_kfp.cli.main import main
        sys.exit(main(["run", "--job", {str(SMALL_JOB)!r}, "--output-dir", {str(out)!r}]))
    """
    done = _run_without_torch(code, tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "dlrover-kfp: error: training dlrm-small needs torch, which is not installed here: "
        "pip install 'dlrover-kfp[train]'"
    ]
    # refused before anything started: no pod launched (each writes logs/<pod>.log), no profile
    assert list(out.rglob("*.log")) == []
    assert not (out / "profile.json").exists()
