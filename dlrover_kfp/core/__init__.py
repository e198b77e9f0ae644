"""The pure core: contracts, the resource-performance model and the planner.

Nothing under this package performs I/O or imports kubernetes, airflow, kfp or SQL; everything
here is a function over frozen dataclasses, testable without a cluster.
"""
