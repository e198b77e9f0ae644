"""The job secret, and the constants of the handshake by which each end proves it knows it.

Every process of a job gets the same secret from the launcher, through the environment; each
connection authenticates once with it, before any frame (the steps, and why frames are not
MACed, are in the package docstring, :mod:`dlrover_kfp.training.wire`). The secret's bytes live
only in :class:`_Key`, which keeps them out of every repr, str and exception message. The
handshake itself runs in :mod:`.client` (blocking) and in :mod:`.server` (inside its loop).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets

from dlrover_kfp.errors import PermanentError, UserInputError

SECRET_ENV_VAR = "DLROVER_KFP_JOB_SECRET"
_MIN_SECRET_BYTES = 16

# Handshake: hello = magic, version, 3 zero bytes, client nonce; then the server's nonce and
# proof; then the client's proof; then the server's acknowledgement.
_HELLO_MAGIC = b"DKFA"
_NONCE_BYTES = 32
_HELLO_BYTES = 8 + _NONCE_BYTES
_PROOF_BYTES = 32
_CHALLENGE_BYTES = _NONCE_BYTES + _PROOF_BYTES
_ACK = b"DKOK"
_SERVER_LABEL = b"dlrover-kfp-wire/1 server"
_CLIENT_LABEL = b"dlrover-kfp-wire/1 client"


class AuthenticationError(PermanentError):
    """The other side did not prove it knows the job secret (or rejected our proof)."""


# ---------------------------------------------------------------------------------- secrets


class _Key:
    """The job secret, kept out of every repr, str and exception message."""

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes | bytearray):
            raise UserInputError("the job secret must be bytes")
        if len(secret) < _MIN_SECRET_BYTES:
            raise UserInputError(f"the job secret must be at least {_MIN_SECRET_BYTES} bytes")
        self._secret = bytes(secret)

    def prove(self, nonce: bytes, label: bytes) -> bytes:
        return hmac.digest(self._secret, nonce + label, hashlib.sha256)

    def __repr__(self) -> str:
        return "<secret redacted>"

    __str__ = __repr__


def new_secret() -> bytes:
    """A fresh 32-byte per-job secret; the launcher makes one and hands it to every process."""
    return secrets.token_bytes(32)


def secret_to_env(secret: bytes) -> str:
    """The secret as the hex string to put in :data:`SECRET_ENV_VAR` of each pod or process."""
    _Key(secret)  # validates without echoing the value
    return bytes(secret).hex()


def secret_from_env(var: str = SECRET_ENV_VAR) -> bytes:
    """Read the job secret that the launcher put in the environment (hex).

    Errors name the variable but never its value: the message ends up in logs.
    """
    raw = os.environ.get(var)
    if raw is None or not raw.strip():
        raise UserInputError(
            f"environment variable {var} is not set; it must hold the job secret "
            "(hex, from secret_to_env(new_secret()))"
        )
    try:
        secret = bytes.fromhex(raw.strip())
    except ValueError:
        raise UserInputError(f"environment variable {var} is not a hex string") from None
    if len(secret) < _MIN_SECRET_BYTES:
        raise UserInputError(
            f"environment variable {var} holds fewer than {_MIN_SECRET_BYTES} secret bytes"
        )
    return secret
