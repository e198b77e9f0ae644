"""The run's HTML report, as the orchestrators publish it beside the run's profile.

Drawing needs matplotlib, a slow import: it is imported on the first call, so that a DAG file
or a component that imports this module at parse time does not pay for it. What an
orchestrator does when drawing fails is its own (an Airflow task goes on without a report; a
KFP artifact must exist, so it gets a page that says what went wrong).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dlrover_kfp.core.profile import JobProfile


def run_report_html(profile: JobProfile) -> str:
    """The report of one run (``dlrover-kfp report``'s page): a self-contained HTML page."""
    from dlrover_kfp.report import render_run_report  # noqa: PLC0415 - matplotlib: slow

    return render_run_report(profile)


__all__ = ["run_report_html"]
