"""Encryption of key valves at rest.

Open WebUI stores valves as plain JSON in its database (0.12 can encrypt them
itself, but only when the admin turns that on). When ``WEBUI_SECRET_KEY`` is
set — it always is in a real deployment — the pipe stores its API key as
``encrypted:<token>`` instead: Fernet (AES-128-CBC + HMAC-SHA256) with a key
derived from that secret. Values are decrypted only in memory, right before a
request. ``cryptography`` ships with every Open WebUI version; without it (or
without the secret) values stay as typed.
"""

from __future__ import annotations

import base64
import hashlib
import os

PREFIX = "encrypted:"


class SecretError(ValueError):
    """A stored secret cannot be decrypted (the server secret changed)."""


def _fernet(secret: str):
    try:
        from cryptography.fernet import Fernet  # noqa: PLC0415 - optional dependency
    except ImportError:
        return None
    key = base64.urlsafe_b64encode(hashlib.sha256(secret.encode()).digest())
    return Fernet(key)


def server_secret() -> str:
    """Open WebUI's secret key, if the process has one."""
    return os.environ.get("WEBUI_SECRET_KEY", "")


def encrypt(value: str, secret: str | None = None) -> str:
    """``value`` encrypted for storage; unchanged when it cannot be."""
    secret = server_secret() if secret is None else secret
    if not value or value.startswith(PREFIX) or not secret:
        return value
    fernet = _fernet(secret)
    if fernet is None:
        return value
    return PREFIX + fernet.encrypt(value.encode()).decode()


def decrypt(value: str, secret: str | None = None) -> str:
    """The plain value of a stored (possibly encrypted) secret.

    Raises:
        SecretError: the value is encrypted but cannot be read with this
            server's secret (it changed, or cryptography is missing).
    """
    if not value.startswith(PREFIX):
        return value
    secret = server_secret() if secret is None else secret
    fernet = _fernet(secret) if secret else None
    if fernet is None:
        raise SecretError(
            "The stored API key is encrypted but WEBUI_SECRET_KEY is not available; "
            "enter the key in the valves again."
        )
    try:
        return fernet.decrypt(value[len(PREFIX) :].encode()).decode()
    except Exception as error:  # InvalidToken, or a damaged value
        raise SecretError(
            "The stored API key cannot be decrypted (WEBUI_SECRET_KEY changed?); "
            "enter the key in the valves again."
        ) from error
