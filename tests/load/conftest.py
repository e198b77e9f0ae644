"""Shared helpers of the load tests: the benchmarks they run at a small size."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (the folder is not a package)."""
    module_name = f"{name}_benchmark"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


# The PostgreSQL fixtures of the history-store contract suite: a fresh schema per test.
from tests.contract.test_history_store import postgres_schema_url, postgres_url  # noqa: E402

__all__ = ["load_benchmark", "postgres_schema_url", "postgres_url"]
