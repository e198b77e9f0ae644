"""The "Run report" button of a train task.

In Airflow 3 the worker resolves a task's extra links when the task ends: the task runner
calls :meth:`RunReportLink.get_link` on the operator that ran and stores the URL in XCom under
the link's ``xcom_key`` (``_link_RunReportLink``); the API server only reads that XCom back
(the plugin registers the class so that the serialized DAG names it). So ``get_link`` runs
where the report was written, on the operator that wrote it: it takes the report's path from
the operator (the train operator also pushes it as XCom ``report``) and turns it into a URL:
``[dlrover_kfp] report_base_url`` + the report's path under the runs directory when that
option is set (a web server serves the runs directory), else a ``file://`` URL of the worker's
disk. No report yet (the task deferred, the run never ended, the report could not be drawn):
no link. The link is computed again when the task resumes and ends, and replaces the empty one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from airflow.sdk import BaseOperatorLink, conf

from airflow_plugin.runs import REPORT_BASE_URL_OPTION, report_url

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

#: The XCom key under which the train operator pushes the report's path.
REPORT_XCOM_KEY: Final = "report"
#: The train operator's attribute that holds the report's path once it is written.
REPORT_ATTRIBUTE: Final = "report_path"


def report_base_url() -> str:
    section, option = REPORT_BASE_URL_OPTION
    return str(conf.get(section, option, fallback="") or "")


class RunReportLink(BaseOperatorLink):
    """A link to the run report (``report.html``) of an :class:`ElasticTrainOperator` task."""

    name = "Run report"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        # Not XCom.get_value: the link is also resolved when the task defers, before there is
        # a report, and a missing XCom is logged as an error by the task SDK's client.
        path = getattr(operator, REPORT_ATTRIBUTE, None)
        if not path:
            return ""
        return report_url(str(path), report_base_url())


__all__ = ["REPORT_ATTRIBUTE", "REPORT_XCOM_KEY", "RunReportLink", "report_base_url"]
