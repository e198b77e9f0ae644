"""Two rules read off the source tree: nothing deserialises with pickle (or anything else that
runs code from the bytes it reads), and the history store's SQL never comes from string
building. Each rule is first shown to catch what it forbids, on snippets, then run on the tree.
"""

from __future__ import annotations

import ast

import pytest

from tests.security.source_scan import (
    deserialisation_findings,
    python_files,
    scan,
    sql_findings,
)

#: The packages that run in a job, a pipeline step or an Airflow worker.
SHIPPED = ("dlrover_kfp", "airflow_plugin", "components")

#: Findings accepted on purpose, by "path: what" (line numbers move), each with its reason.
#: Empty today: checkpoints are read by training/checkpoint/reader.py from its own raw format
#: (a JSON manifest and numpy buffers, checksummed), the model is only written (torch.save of a
#: state_dict, for the user), and job documents go through yaml.safe_load.
DESERIALISATION_ALLOWED: dict[str, str] = {}
SQL_ALLOWED: dict[str, str] = {}


def _unallowed(findings: list[str], allowed: dict[str, str]) -> list[str]:
    def key(finding: str) -> str:
        path, _, rest = finding.partition(":")
        return f"{path}:{rest.partition(':')[2]}"  # "path: what", without the line

    return [f for f in findings if key(f) not in allowed]


# -- the rules catch what they forbid -----------------------------------------------------------

UNSAFE_SNIPPETS = [
    "import pickle",
    "import cPickle as p",
    "from marshal import loads",
    "import shelve",
    "import dill",
    "from multiprocessing.connection import Listener",
    "from multiprocessing import connection",
    "import torch\ntorch.load(path)",
    "import torch\ntorch.load(path, weights_only=False)",
    "from torch import load\nload(path)",
    "import yaml\nyaml.load(text)",
    "import yaml\nyaml.load(text, Loader=yaml.Loader)",
    "import yaml\nyaml.load(text, yaml.UnsafeLoader)",
    "import yaml\nyaml.unsafe_load(text)",
    "import yaml\nclass L(yaml.Loader): pass\nyaml.load(text, Loader=L)",
    "import yaml\nyaml.full_load(text)",
    "import numpy as np\nnp.load(path, allow_pickle=True)",
    "import pandas as pd\npd.read_pickle(path)",
    "eval(meta['expr'])",
    "exec(code)",
]
SAFE_SNIPPETS = [
    "import torch\ntorch.load(path, weights_only=True)",
    "import torch\ntorch.save(state, path)",
    "import yaml\nyaml.safe_load(text)",
    "import yaml\nyaml.load(text, Loader=yaml.SafeLoader)",
    "import yaml\nyaml.load(text, yaml.CSafeLoader)",
    "import yaml\nclass A(yaml.SafeLoader): pass\nclass B(A): pass\nyaml.load(text, Loader=B)",
    "import numpy as np\nnp.load(path)",
    "import json\njson.loads(text)",
    "import multiprocessing\nmultiprocessing.get_context('spawn')",
    "ast.literal_eval(text)",
]


@pytest.mark.parametrize("snippet", UNSAFE_SNIPPETS)
def test_the_deserialisation_rule_catches(snippet: str) -> None:
    assert deserialisation_findings(ast.parse(snippet), "snippet.py")


@pytest.mark.parametrize("snippet", SAFE_SNIPPETS)
def test_the_deserialisation_rule_passes(snippet: str) -> None:
    assert deserialisation_findings(ast.parse(snippet), "snippet.py") == []


UNSAFE_SQL = [
    "conn.execute(sa.text(f\"SELECT * FROM profiles WHERE run_id = '{run_id}'\"))",
    'conn.execute(sa.text("SELECT * FROM profiles WHERE run_id = \'" + run_id + "\'"))',
    "conn.exec_driver_sql(\"DELETE FROM profiles WHERE run_id = '%s'\" % run_id)",
    'conn.exec_driver_sql("DROP TABLE {}".format(name))',
    'sql = f"SELECT {column} FROM job_summaries"\nconn.exec_driver_sql(sql)',
    'sql = "SELECT 1"\nsql += where\ncursor.execute(sql)',
    "cursor.executescript(';'.join(statements))",
    "sa.text(statement)",  # text() of a variable: SQL from wherever it came
    "sa.literal_column(name)",
    "conn.execute(sa.select(job_summaries).where(sa.text(f\"scenario = '{s}'\")))",
]
SAFE_SQL = [
    'conn.execute(sa.text("SELECT * FROM profiles WHERE run_id = :id"), {"id": run_id})',
    'cursor.execute("PRAGMA foreign_keys=ON")',
    'conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")',
    "conn.execute(sa.select(profiles).where(profiles.c.run_id == run_id))",
    "conn.execute(sa.insert(profiles), rows)",
    'LOCK = sa.text("SELECT pg_advisory_xact_lock(:key)")\nconn.execute(LOCK, {"key": 1})',
]


@pytest.mark.parametrize("snippet", UNSAFE_SQL)
def test_the_sql_rule_catches(snippet: str) -> None:
    assert sql_findings(ast.parse(snippet), "snippet.py")


@pytest.mark.parametrize("snippet", SAFE_SQL)
def test_the_sql_rule_passes(snippet: str) -> None:
    assert sql_findings(ast.parse(snippet), "snippet.py") == []


# -- the tree -----------------------------------------------------------------------------------


def test_nothing_shipped_deserialises_with_pickle_or_runs_code_from_data() -> None:
    files = list(python_files(*SHIPPED))
    assert len(files) > 100  # the scan saw the tree, not an empty directory
    findings = _unallowed(scan(files, "deserialisation"), DESERIALISATION_ALLOWED)
    assert findings == [], "\n".join(findings)


def test_the_history_store_builds_no_sql_from_strings() -> None:
    files = list(python_files("dlrover_kfp/history"))
    assert {f.name for f in files} >= {"sql.py", "engine.py", "migrations.py"}
    findings = _unallowed(scan(files, "sql"), SQL_ALLOWED)
    assert findings == [], "\n".join(findings)
