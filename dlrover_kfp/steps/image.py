"""One setting for the image of a pipeline's pods: the components' and the job's worker and PS.

The job master starts its worker and PS pods from the image it runs in, so the two must be the
same name: a KFP component's ``base_image`` and ``$DLROVER_KFP_IMAGE`` (what the master gives
its pods) come from :func:`pipeline_image`, and ``deploy/build.sh`` tags that name.

The name must be fully qualified: a registry host, a repository and a tag or digest. A bare
``dlrover-kfp:0.1.0`` is resolved by the container runtime as ``docker.io/library/dlrover-kfp``,
a public repository that anyone could publish to and that we do not: a cluster would pull a
stranger's image, or fail with a misleading "pull access denied". An omitted tag means
``latest``, which changes under a running pipeline.

No registry hosts this project's image, so the default names none that exists:
``registry.invalid/dlrover-kfp:VERSION`` (``.invalid`` is reserved, RFC 2606, and never
resolves). An image built by ``deploy/build.sh`` and loaded into the nodes (``kind load``)
runs under it as is; anywhere else the platform team pushes the image to its own registry and
sets that name (``DLROVER_KFP_IMAGE`` or ``dlrover-kfp compile --image``), and a pod that still
has the default fails with "no such host registry.invalid", which says what to set.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Final

from dlrover_kfp import __version__
from dlrover_kfp.errors import UserInputError

#: The environment variable that names the image (compile time: the components'; in a job
#: master's pod: its worker and PS pods').
IMAGE_ENV: Final = "DLROVER_KFP_IMAGE"

#: The repository deploy/build.sh tags when none is given (see the module docstring).
DEFAULT_REPOSITORY: Final = "registry.invalid/dlrover-kfp"

#: The default image: this package's version in :data:`DEFAULT_REPOSITORY`.
DEFAULT_IMAGE: Final = f"{DEFAULT_REPOSITORY}:{__version__}"

# The grammar of github.com/distribution/reference, less the parts we refuse (no registry,
# no tag): host[:port]/path[:tag][@digest].
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_HOST = rf"{_LABEL}(?:\.{_LABEL})*"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"(?P<host>{_HOST})(?::(?P<port>[0-9]+))?"
    rf"/(?P<path>{_PATH_PART}(?:/{_PATH_PART})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}))?"
)


def check_image(name: str, source: str = IMAGE_ENV) -> str:
    """``name`` stripped, if it is a fully qualified image reference; else a
    :class:`UserInputError` naming ``source`` and the value, and what a good one looks like."""
    value = name.strip()
    hint = f"give registry/name:tag, for example registry.example.com/ml/dlrover-kfp:{__version__}"
    first, slash, _ = value.partition("/")
    if not slash or not _is_registry(first):
        raise UserInputError(
            f"{source}: {value!r} names no registry, so the container runtime would look for it "
            f"on Docker Hub, where this project publishes nothing; {hint}"
        )
    match = _REFERENCE.fullmatch(value)
    if match is None:
        raise UserInputError(f"{source}: {value!r} is not an image reference; {hint}")
    if match["tag"] is None and match["digest"] is None:
        raise UserInputError(
            f"{source}: {value!r} has no tag, so the runtime would pull :latest, which changes "
            f"under a running pipeline; {hint}"
        )
    return value


def _is_registry(component: str) -> bool:
    """The first path component names a registry host (the runtime's own rule): it has a dot
    or a port, or it is ``localhost``; otherwise it is a Docker Hub user (``ml/dlrover-kfp``)."""
    return "." in component or ":" in component or component == "localhost"


def pipeline_image(environ: Mapping[str, str] = os.environ) -> str:
    """``$DLROVER_KFP_IMAGE`` (checked: :func:`check_image`), else :data:`DEFAULT_IMAGE`. An
    empty variable counts as unset."""
    given = environ.get(IMAGE_ENV, "").strip()
    return check_image(given) if given else DEFAULT_IMAGE


__all__ = ["DEFAULT_IMAGE", "DEFAULT_REPOSITORY", "IMAGE_ENV", "check_image", "pipeline_image"]
