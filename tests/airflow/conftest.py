"""The Airflow provider's tests. Airflow reads its configuration when it is first imported, so
its home is a throwaway directory before any test module imports it (never ``~/airflow``)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

if "AIRFLOW_HOME" not in os.environ:
    _home = tempfile.mkdtemp(prefix="dlrover-kfp-airflow-home-")
    os.environ["AIRFLOW_HOME"] = _home
    atexit.register(shutil.rmtree, _home, True)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
