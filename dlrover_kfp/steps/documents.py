"""What an orchestrator passes between the steps: the plan, the profile and the job spec as
documents (a dict for Airflow's XCom, JSON for KFP's artifacts, YAML for a job master).

The orchestrators (``airflow_plugin/``, ``components/``) reach the library through
:mod:`dlrover_kfp.steps` and its public API only (an import-linter contract); these are the
document rules they need, so that they never import the core's contracts themselves.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from dlrover_kfp.core.documents import parse, to_dict, to_json
from dlrover_kfp.core.plan import ResourcePlan
from dlrover_kfp.core.profile import JobProfile
from dlrover_kfp.core.spec import CriteoData, JobSpec, TableData
from dlrover_kfp.errors import SpecError
from dlrover_kfp.files import read_document

if TYPE_CHECKING:
    # Not imported at run time: steps.spec loads the planner (scipy), and a DAG file that
    # imports the Airflow operators (which import this module) should not pay for it.
    from dlrover_kfp.steps.spec import LoadedSpec


def plan_from_document(data: object, source: str = "plan") -> ResourcePlan | None:
    """A plan as an orchestrator hands it over: the document (a dict), its JSON text, or
    nothing (None or an empty string: a pipeline parameter's way of saying "no plan", so that
    the train step plans the start itself). :class:`~dlrover_kfp.errors.SpecError` names the
    key and the value of a plan that does not validate."""
    if isinstance(data, str):
        if not data.strip():
            return None
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise SpecError(f"{source}: not a JSON document ({exc})") from None
    return parse(ResourcePlan, data, source) if data is not None else None


def profile_from_document(data: object, source: str = "profile") -> JobProfile:
    """A run's profile as an orchestrator hands it over: the document (a dict, e.g. an XCom),
    its JSON text (starting with ``{``), or the path of a ``profile.json``.
    :class:`~dlrover_kfp.errors.SpecError` names the key and the value of one that does not
    validate; a missing file is a :class:`~dlrover_kfp.errors.UserInputError`."""
    if isinstance(data, str):
        text = data.strip()
        if not text:
            raise SpecError(f"{source}: empty; give a profile document or a profile.json path")
        if not text.startswith("{"):
            return read_document(JobProfile, text)
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise SpecError(f"{source}: not a JSON document ({exc})") from None
    return parse(JobProfile, data, source)


def standalone_spec_yaml(loaded: LoadedSpec) -> str:
    """The job spec as YAML that a process started in another directory reads the same way:
    a relative data path is made absolute against the directory it was relative to
    (:attr:`LoadedSpec.base_dir`); a URL (``s3://``, ``file://``) stays as it is."""
    spec: JobSpec = loaded.spec
    if (
        isinstance(spec.data, CriteoData | TableData)
        and "://" not in spec.data.path  # a URL is where it is
        and not Path(spec.data.path).is_absolute()
    ):
        data = dataclasses.replace(spec.data, path=str(loaded.base_dir / spec.data.path))
        spec = dataclasses.replace(spec, data=data)
    return yaml.safe_dump(to_dict(spec), sort_keys=False)


__all__ = [
    "JobProfile",
    "ResourcePlan",
    "plan_from_document",
    "profile_from_document",
    "standalone_spec_yaml",
    "to_dict",
    "to_json",
]
