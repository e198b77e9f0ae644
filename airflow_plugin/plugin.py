"""The Airflow plugin of dlrover-kfp, loaded through the ``airflow.plugins`` entry point.

It registers the train task's extra link (:class:`~airflow_plugin.links.RunReportLink`), so
that the API server can rebuild it when it reads a serialized DAG.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_plugin.links import RunReportLink


class DlroverKfpPlugin(AirflowPlugin):
    name = "dlrover_kfp"
    operator_extra_links: list[Any] = [RunReportLink()]  # noqa: RUF012 - Airflow's own type


__all__ = ["DlroverKfpPlugin"]
