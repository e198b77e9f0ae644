"""Compile the components and the pipeline to YAML: the committed files beside them (the
default image), or another directory for another image."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from kfp import compiler

from components.elastic_dlrm import IMAGE, Components, build

#: The directory of the committed YAML (this package's own).
HERE = Path(__file__).resolve().parent


def targets(built: Components) -> dict[str, Any]:
    """file name -> what compiles into it"""
    return {
        "plan_resources.yaml": built.plan_resources,
        "elastic_train.yaml": built.elastic_train,
        "record_profile.yaml": built.record_profile,
        "elastic_dlrm_pipeline.yaml": built.elastic_dlrm_pipeline,
        "prepare_example_data.yaml": built.prepare_example_data,
        "publish_model.yaml": built.publish_model,
        "score_model.yaml": built.score_model,
        "evaluate_model.yaml": built.evaluate_model,
    }


#: The committed files.
TARGETS = tuple(targets(build(IMAGE)))


def compile_all(output_dir: Path = HERE, image: str = IMAGE) -> list[Path]:
    """Write every target, built for ``image``, into ``output_dir``; each file is replaced
    whole (compiled to a temporary file in the same directory, then renamed), never left
    half-written."""
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, target in targets(build(image)).items():
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
