"""The Airflow provider of dlrover-kfp: plan, train and record DLRM jobs from Airflow 3 DAGs.

Airflow finds this package through two entry points of the ``dlrover-kfp`` distribution
(``pyproject.toml``): ``apache_airflow_provider`` calls :func:`get_provider_info` (so that
``airflow providers list`` shows it and the UI knows its connection type and extra link), and
``airflow.plugins`` loads :class:`airflow_plugin.plugin.DlroverKfpPlugin` (the provider info
does not name the plugin again: with ``lazy_load_providers`` off Airflow would load it twice and
report the second as an import error).

Like Airflow's own providers the integration is thin: the operators (:mod:`.operators`) call
:mod:`dlrover_kfp.steps`, the hook (:mod:`.hooks`) turns an Airflow connection into a history
store URL, and the trigger (:mod:`.triggers`) waits for a submitted job master without holding
a worker slot. This module imports nothing from Airflow: the providers manager imports it
early, in every Airflow process.
"""

from __future__ import annotations

from typing import Any

from dlrover_kfp import __version__

#: The distribution's name: Airflow refuses a provider whose ``package-name`` differs from it.
PACKAGE_NAME = "dlrover-kfp"

#: The connection type the hook registers (``airflow connections add --conn-type``).
CONNECTION_TYPE = "dlrover_kfp_history"

_INTEGRATION = "dlrover-kfp"


def get_provider_info() -> dict[str, Any]:
    """The provider's description in the form of ``airflow/provider_info.schema.json``.

    A new dictionary on every call: the providers manager adds keys to the one it gets.
    """
    return {
        "package-name": PACKAGE_NAME,
        "name": "dlrover-kfp",
        "description": "Resource planning and elastic parameter-server DLRM training: plan a "
        "job from the history of similar runs, train it elastically, record its profile.\n",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": _INTEGRATION,
                "tags": ["software"],
            }
        ],
        "operators": [
            {"integration-name": _INTEGRATION, "python-modules": ["airflow_plugin.operators"]}
        ],
        "hooks": [{"integration-name": _INTEGRATION, "python-modules": ["airflow_plugin.hooks"]}],
        "triggers": [
            {"integration-name": _INTEGRATION, "python-modules": ["airflow_plugin.triggers"]}
        ],
        "connection-types": [
            {
                "connection-type": CONNECTION_TYPE,
                "hook-class-name": "airflow_plugin.hooks.DlroverHistoryHook",
                "hook-name": "dlrover-kfp history store",
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {"schema": "Database (or SQLite file, no host)"},
                    "placeholders": {
                        "host": "PostgreSQL server; empty for a SQLite file",
                        "schema": "dlrover_kfp, or /var/lib/dlrover-kfp/history.db",
                        "extra": '{"url": "any SQLAlchemy URL (overrides the fields)"}',
                    },
                },
            }
        ],
        "extra-links": ["airflow_plugin.links.RunReportLink"],
        "config": {
            "dlrover_kfp": {
                "description": "The dlrover-kfp provider.",
                "options": {
                    "report_base_url": {
                        "description": "A URL under which the runs directory "
                        "(DLROVER_KFP_RUNS_DIR) is served: the run report link points there "
                        "instead of at a file:// URL of the worker's disk.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "https://reports.example.com/dlrover-kfp/",
                        "default": "",
                    }
                },
            }
        },
    }


__all__ = ["CONNECTION_TYPE", "PACKAGE_NAME", "get_provider_info"]
