"""Whether the trainer is installed: asked once, before a run starts anything.

torch is the ``train`` extra, not a core dependency, so that the Airflow provider, ``plan``,
``record``, ``history`` and the plan/record KFP components install without its 750 MB. A run
without it would otherwise get as far as starting its pods, which fail with an import error
(and are relaunched) before the run gives up on a message about exit codes; asking first turns
that into one line that names the extra to install.

``importlib.util.find_spec`` looks torch up without importing it (an import costs 1-2 s).
"""

from __future__ import annotations

import importlib.util

from dlrover_kfp.errors import MissingExtraError

#: The extra of dlrover-kfp that installs the trainer (pyproject.toml).
TRAIN_EXTRA = "train"


#: The extra that installs the scorer (onnxruntime), for ``dlrover-kfp score``.
SERVE_EXTRA = "serve"


def require_modules(modules: tuple[str, ...], extra: str, what: str) -> None:
    """Raise :class:`MissingExtraError` naming ``extra`` when one of ``modules`` is not
    installed; ``what`` is the thing that needs it, for the message."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(
                f"{what} needs {module}, which is not installed here: "
                f"pip install 'dlrover-kfp[{extra}]'"
            )


def require_trainer(what: str) -> None:
    """Raise :class:`MissingExtraError` naming the ``train`` extra when torch (the trainer) or
    onnx (the model export at the run's end) is not installed; ``what`` is the thing that needs
    it, for the message. Without onnx a run would train to the end and then fail to export."""
    require_modules(("torch", "onnx"), TRAIN_EXTRA, what)


__all__ = ["SERVE_EXTRA", "TRAIN_EXTRA", "require_modules", "require_trainer"]
