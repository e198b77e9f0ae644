"""Compile the components and the pipeline to the YAML committed beside them."""

from __future__ import annotations

import tempfile
from pathlib import Path

from kfp import compiler

from components.elastic_dlrm import (
    elastic_dlrm_pipeline,
    elastic_train,
    plan_resources,
    record_profile,
)

#: The directory of the committed YAML (this package's own).
HERE = Path(__file__).resolve().parent

#: file name -> what compiles into it
TARGETS = {
    "plan_resources.yaml": plan_resources,
    "elastic_train.yaml": elastic_train,
    "record_profile.yaml": record_profile,
    "elastic_dlrm_pipeline.yaml": elastic_dlrm_pipeline,
}


def compile_all(output_dir: Path = HERE) -> list[Path]:
    """Write every target into ``output_dir``; each file is replaced whole (compiled to a
    temporary file in the same directory, then renamed), never left half-written."""
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, target in TARGETS.items():
        path = output_dir / name
        with tempfile.NamedTemporaryFile(
            dir=output_dir, prefix=f".{name}.", suffix=".yaml", delete=False
        ) as tmp:
            tmp_path = Path(tmp.name)
        try:
            compiler.Compiler().compile(target, str(tmp_path))
            tmp_path.chmod(0o644)
            tmp_path.replace(path)
        finally:
            tmp_path.unlink(missing_ok=True)
        written.append(path)
    return written


__all__ = ["HERE", "TARGETS", "compile_all"]
