"""The message kinds of the job master's RPC service, shared by its clients and the service.

The trainer's processes (PS and workers) are the clients; :mod:`dlrover_kfp.runtime.master`
serves them. The kinds live here, on the trainer's side, so that the trainer depends on no
part of the runtime (the layering of docs/architecture.md: the runtime uses the trainer, never
the other way). What each request carries and returns is documented on the service.
"""

from __future__ import annotations

#: PS ``k`` listens at ``host:port``: ``{"index": k, "address": [host, port]}``.
REGISTER = "register"
#: The job spec, the PS addresses and the run settings (``{"wait": true}`` until every PS
#: registered).
CONFIG = "config"
#: Lease the next data shard: ``{"worker": name, "incarnation": token}``.
GET_SHARD = "get_shard"
#: A leased shard is done, with its samples, steps, summed loss and bad rows.
REPORT = "report"
#: A worker has applied every push and reported every shard it trained, and waits for the PS
#: of generation ``g``: ``{"worker": name, "generation": g}`` (the answer to a ``switch``).
READY = "ready"

#: What a pod's processes used, as the pod measures itself (for clusters without a metrics
#: API): ``{"role", "index", "generation", "cpu_seconds", "rss_mb"}``, CPU time cumulative
#: since the process started, resident memory now, both over the pod's process tree.
USAGE = "usage"

#: Seconds between two ``usage`` reports of a pod. They come from a thread of their own, so a
#: pod that stays silent for a few intervals is frozen (stopped, or its node gone), not busy.
USAGE_INTERVAL_S = 2.0
#: A ``usage`` report's meta key: true in the report a PS pod's supervisor sends before it
#: loads the PS's code (torch: seconds of CPU, tens of seconds in a small pod on a busy node),
#: during which the pod reports nothing else (training/node.py ``announce``).
LOADING = "loading"

#: In the answer to ``get_shard`` and ``report`` while the master changes the PS set (a live
#: migration): ``{"switch": g}`` asks the worker to finish its step, wait for its pushes,
#: report, send ``ready`` and fetch the configuration again (which names the new PS).
SWITCH = "switch"

__all__ = [
    "CONFIG",
    "GET_SHARD",
    "LOADING",
    "READY",
    "REGISTER",
    "REPORT",
    "SWITCH",
    "USAGE",
    "USAGE_INTERVAL_S",
]
