"""A user's cancel of a training run, as an orchestrator says it (see
:mod:`dlrover_kfp.runtime.cancel`): say why first, then stop the master. The local backend's
master reads the marker file in its output directory; a master in the cluster reads the
annotation on its own pod."""

from __future__ import annotations

from dlrover_kfp.runtime.cancel import CANCEL_ANNOTATION, CANCEL_FILE, request_cancel

__all__ = ["CANCEL_ANNOTATION", "CANCEL_FILE", "request_cancel"]
