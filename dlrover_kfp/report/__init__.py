"""Reports people would rather look at than read: one run's page, one scenario's page.

* :func:`render_run_report`: a job profile as a self-contained HTML page with its charts.
* :func:`render_scenario_report`: a scenario's runs side by side, oldest first.
* :mod:`dlrover_kfp.report.plots`: the package's one plotting package (matplotlib, no pyplot;
  a module per chart family); the simulator draws its charts with it too.

The layer sits above the history and the core and below the runtime and the simulator: it reads
profiles and never runs anything.
"""

from dlrover_kfp.report.run import render_run_report
from dlrover_kfp.report.scenario import render_scenario_report

__all__ = ["render_run_report", "render_scenario_report"]
