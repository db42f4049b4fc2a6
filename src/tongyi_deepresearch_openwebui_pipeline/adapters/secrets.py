"""Secrets: the API key encrypted at rest, and kept out of every message.

Open WebUI stores valves as plain JSON in its database (0.12 can encrypt them
itself, but only when the admin turns that on). When ``WEBUI_SECRET_KEY`` is
set — it always is in a real deployment — the pipe stores its API key as
``encrypted:<token>`` instead: Fernet (AES-128-CBC + HMAC-SHA256) with a key
derived from that secret. Values are decrypted only in memory, right before a
request. ``cryptography`` ships with every Open WebUI version; without it (or
without the secret) values stay as typed.

`Redactor` is the one place that decides what of a secret may be shown: every
message that can carry server text, a URL or a header passes through it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator
from urllib.parse import quote, unquote

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


# -- keeping secrets out of text ----------------------------------------------------

#: A run of this many characters of a secret counts as the secret: servers cut
#: what they echo ("Incorrect API key provided: sk-or-v1-abc…"), and a message
#: cut to fit a status line may end halfway through a key.
SECRET_RUN = 8
#: The shortest piece of a short secret (< SECRET_RUN characters) that makes a
#: server's message unsafe to show at all.
SHORT_SECRET_PIECE = 4
MASK = "***"
WITHHELD = "(the server's message is not shown: it contained part of a secret)"
#: Loggers of the HTTP stack whose records can carry a URL or echoed headers.
HTTP_LOGGERS = (
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
)


def _userinfo(url: str) -> tuple[str, str, str]:
    """``(before, userinfo, after)`` of ``url``; userinfo "" when there is none.

    Parsed by hand: ``urlsplit`` raises on some malformed hosts, and this must
    work on whatever an admin typed.
    """
    scheme, sep, rest = url.partition("//")
    if not sep:
        return url, "", ""
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    userinfo, at, host = rest[:end].rpartition("@")
    if not at:
        return url, "", ""
    return scheme + sep, userinfo, host + rest[end:]


def split_userinfo(url: str) -> tuple[str, str, str]:
    """``(url without user:password@, user, password)``; user/password decoded.

    Credentials written into a URL must never be shown or logged, and httpx
    logs the URL it requests: requests go to the bare URL and carry the
    credentials in an Authorization header instead.
    """
    before, userinfo, after = _userinfo(url)
    if not userinfo and before == url:
        return url, "", ""
    user, _, password = userinfo.partition(":")
    return before + after, unquote(user), unquote(password)


def basic_token(user: str, password: str) -> str:
    """The credentials of an HTTP Basic Authorization header."""
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def url_secrets(url: str) -> list[str]:
    """What must never be shown of a URL's credentials, in every encoding.

    The password; or, for ``https://TOKEN@host`` (no password), the user name,
    which is then the credential.
    """
    _, userinfo, _ = _userinfo(url)
    if not userinfo:
        return []
    user, _, password = userinfo.partition(":")
    secret_raw = password or user
    secret = unquote(secret_raw)
    return [
        secret,
        secret_raw,
        quote(secret, safe=""),
        basic_token(unquote(user), unquote(password)),
    ]


class Redactor:
    """Keeps a set of secrets out of any text: the one redaction point.

    Every message that can carry server text or a URL passes through here
    before it is cut, logged, emitted or shown. The rule, for each secret:

    - of ``SECRET_RUN`` characters or more: any run of ``SECRET_RUN``
      characters of it is masked, so an echoed key is masked whole and a key
      a server (or a cut) truncated is masked as far as it goes;
    - shorter: the whole secret is masked, and a *server's* message that
      contains ``SHORT_SECRET_PIECE`` characters of it is withheld, since
      masking only the whole would let its prefixes through.
    """

    def __init__(self, secrets: list[str] | tuple[str, ...] = ()) -> None:
        """Remember the secrets (blank ones and surrounding whitespace dropped)."""
        cleaned = {s.strip() for s in secrets if s and s.strip()}
        self._long = sorted((s for s in cleaned if len(s) >= SECRET_RUN), key=len)
        self._short = sorted((s for s in cleaned if len(s) < SECRET_RUN), key=len)
        self._runs = {
            s[i : i + SECRET_RUN]
            for s in self._long
            for i in range(len(s) - SECRET_RUN + 1)
        }
        self._pieces = {
            s[i : i + n]
            for s in self._short
            for n in [min(SHORT_SECRET_PIECE, len(s))]
            for i in range(len(s) - n + 1)
        }
        self.longest = max((len(s) for s in cleaned), default=0)

    def __bool__(self) -> bool:
        """Whether there is anything to keep out."""
        return bool(self._long or self._short)

    def __call__(self, text: str) -> str:
        """``text`` with every secret (and long run of one) masked."""
        if not self or not text:
            return text
        if self._runs:
            text = self._mask_runs(text)
        for secret in reversed(self._short):
            text = text.replace(secret, MASK)
        return text

    def _mask_runs(self, text: str) -> str:
        # Mark every position covered by a window that is a run of a secret,
        # then mask each marked stretch once: linear in len(text).
        covered_until = -1
        spans: list[list[int]] = []
        runs = self._runs
        for start in range(len(text) - SECRET_RUN + 1):
            if text[start : start + SECRET_RUN] in runs:
                end = start + SECRET_RUN
                if spans and start <= covered_until:
                    spans[-1][1] = end
                else:
                    spans.append([start, end])
                covered_until = end
        if not spans:
            return text
        out: list[str] = []
        position = 0
        for start, end in spans:
            out += [text[position:start], MASK]
            position = end
        out.append(text[position:])
        return "".join(out)

    def server_text(self, text: str, limit: int) -> str:
        """A server's message made safe to show, then cut to ``limit`` chars.

        Only ``limit`` plus the longest secret's length is looked at, so a
        secret that straddles the cut is still seen whole.
        """
        window = text[: limit + self.longest]
        if any(piece in window for piece in self._pieces):
            return WITHHELD
        return self(window)[:limit]


class _ActiveSecrets(logging.Filter):
    """Masks the secrets of every live client in the HTTP stack's log records.

    httpx logs each request's URL at INFO and httpcore every response header
    at DEBUG: a server that echoes the key in a header would otherwise put
    it in the log. Records are only built when their level is enabled, so
    this costs nothing while those loggers are quiet.
    """

    def __init__(self) -> None:
        super().__init__()
        self.redactors: list[Redactor] = []

    def filter(self, record: logging.LogRecord) -> bool:
        redactors = list(self.redactors)
        if not redactors:
            return True
        message = original = record.getMessage()
        for redactor in redactors:
            message = redactor(message)
        if message != original:
            record.msg, record.args = message, None
        return True


_ACTIVE = _ActiveSecrets()
for _name in HTTP_LOGGERS:
    logging.getLogger(_name).addFilter(_ACTIVE)


@contextlib.contextmanager
def guard_http_logs(redactor: Redactor) -> Iterator[None]:
    """Mask ``redactor``'s secrets in the HTTP stack's logs within the block."""
    if not redactor:
        yield
        return
    _ACTIVE.redactors.append(redactor)
    try:
        yield
    finally:
        _ACTIVE.redactors.remove(redactor)
