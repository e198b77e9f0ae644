"""The environment of a real Airflow for the example DAG's tests: a fresh AIRFLOW_HOME, the
example DAGs folder, an SQLite metadata database migrated with ``airflow db migrate``, and the
run's own history and runs directory. The caller's environment passes through except the
variables that would reach another Airflow, history or store (``drop``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def migrated_airflow_env(
    tmp_path: Path,
    *,
    drop: tuple[str, ...] = ("AIRFLOW", "DLROVER_KFP"),
    **extra: str,
) -> dict[str, str]:
    """The environment, after ``airflow db migrate`` ran in it (asserted to succeed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        AIRFLOW_HOME=str(tmp_path / "airflow"),
        AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "examples" / "airflow"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{tmp_path}/airflow.db",
        DLROVER_KFP_HISTORY_URL=f"sqlite:///{tmp_path / 'history.db'}",
        DLROVER_KFP_RUNS_DIR=str(tmp_path / "runs"),
    )
    env.update(extra)
    airflow_cli = Path(sys.executable).parent / "airflow"
    migrate = subprocess.run(
        [str(airflow_cli), "db", "migrate"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
    return env
