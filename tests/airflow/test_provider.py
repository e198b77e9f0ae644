"""The provider as Airflow discovers it: provider info, entry points, the plugin."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from importlib.metadata import distribution, entry_points
from pathlib import Path

import pytest

pytest.importorskip("airflow.sdk", reason="the airflow extra is not installed")

import airflow
import jsonschema

from airflow_plugin import PACKAGE_NAME, get_provider_info
from airflow_plugin.plugin import DlroverKfpPlugin
from dlrover_kfp import __version__


def _import(dotted: str) -> object:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_provider_info_conforms_to_airflows_schema() -> None:
    schema_path = Path(airflow.__file__).parent / "provider_info.schema.json"
    schema = json.loads(schema_path.read_text())
    info = get_provider_info()
    jsonschema.Draft7Validator(schema).validate(info)
    assert info["package-name"] == PACKAGE_NAME == distribution(PACKAGE_NAME).metadata["Name"]
    assert info["versions"] == [__version__]
    # a new dict each call: Airflow adds keys to the one it gets
    assert get_provider_info() is not info


def test_everything_the_provider_info_names_imports() -> None:
    info = get_provider_info()
    for group in ("operators", "hooks", "triggers"):
        for entry in info[group]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    for conn in info["connection-types"]:
        hook = _import(conn["hook-class-name"])
        assert hook.conn_type == conn["connection-type"]
    for link in info["extra-links"]:
        assert _import(link).name == "Run report"  # type: ignore[attr-defined]


def test_entry_points_name_the_provider_and_the_plugin() -> None:
    (provider,) = [
        ep
        for ep in entry_points(group="apache_airflow_provider")
        if ep.value.startswith("airflow_plugin")
    ]
    assert provider.load() is get_provider_info
    (plugin,) = [ep for ep in entry_points(group="airflow.plugins") if ep.name == "dlrover_kfp"]
    assert plugin.load() is DlroverKfpPlugin


def _airflow(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The ``airflow`` command of this environment. Run from ``cwd``: with the repository root
    on ``sys.path`` (pytest's ``pythonpath``), the ``dlrover_kfp.egg-info`` that an editable
    install leaves there is a second copy of the distribution, and Airflow, which does not
    deduplicate entry points, would load the plugin twice."""
    airflow_cli = Path(sys.executable).parent / "airflow"
    return subprocess.run(
        [str(airflow_cli), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
        cwd=cwd,
        check=False,
    )


def _json_of(stdout: str) -> list[dict[str, str]]:
    result: list[dict[str, str]] = json.loads(stdout[stdout.index("[") :])
    return result


def test_airflow_loads_the_plugin_through_its_entry_point(tmp_path: Path) -> None:
    result = _airflow("plugins", "--output", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    (ours,) = [p for p in _json_of(result.stdout) if p["name"] == "dlrover_kfp"]
    assert "RunReportLink" in str(ours["operator_extra_links"])
    assert f"{PACKAGE_NAME}==" in str(ours["source"])  # from the entry point
    output = result.stdout + result.stderr
    assert "already registered" not in output
    assert "Failed to load plugin" not in output


def test_airflow_providers_list_shows_the_provider(tmp_path: Path) -> None:
    result = _airflow("providers", "list", "--output", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    listed = {p["package_name"]: p for p in _json_of(result.stdout)}
    assert listed[PACKAGE_NAME]["version"] == __version__
