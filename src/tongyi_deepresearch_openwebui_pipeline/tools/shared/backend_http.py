"""Backend HTTP for the search tools: capped answers, credentials, JSON off the loop.

Backend answers are untrusted: credentials in a URL are sent as Basic auth,
an answer over MAX_RESPONSE_BYTES (on the wire or decoded, read by the
shared safe HTTP code) or unreadable is refused, and big answers are parsed
in steps in a worker thread. Generated into search_tool.py and
scholar_tool.py by scripts/sync_root_files.py (after safe_http.py, whose
names it uses).
"""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code. The
# names it uses come from the tool module's own imports (these are for the
# linters; the snippet below the mark is what is generated).

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import SplitResult, unquote

import httpx

from .safe_http import ACCEPT_ENCODING, _download

# --- snippet ---

T = TypeVar("T")


# Backend answers are untrusted: at most this many bytes are read, counted on
# the wire and again after decompression.
MAX_RESPONSE_BYTES = 5_000_000


# Larger answers are parsed in a worker thread: parsing a few MB of JSON (or
# XML) and picking its records would hold the event loop for tenths of a second.
# The thread parses in steps (see _parse_json) between which the loop runs; an
# answer this small is one step, parsed on the loop.
INLINE_PARSE_BYTES = 65_536


class _TooLargeError(ValueError):
    """A backend answer over MAX_RESPONSE_BYTES, on the wire or decompressed."""


@dataclass(frozen=True)
class _Endpoint:
    """A backend URL without credentials, and the credentials as Basic auth."""

    url: str
    auth: httpx.BasicAuth | None = None


def _split_credentials(parts: SplitResult) -> tuple[str, httpx.BasicAuth | None]:
    """The host part without `user:password@`, and those as Basic auth.

    httpx logs every request URL at INFO and its errors quote it, so
    credentials written into a valve URL must not stay in the URL.
    """
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return parts.netloc, None
    user, _, password = userinfo.partition(":")
    return host, httpx.BasicAuth(unquote(user), unquote(password))


async def _read_body(response: httpx.Response) -> bytes:
    """The decoded body; _TooLargeError past the cap, ValueError if unreadable.

    A backend answer is data, read whole or not at all: bytes after the end
    of its compressed stream, or a stream that ends early, make it unreadable.
    """
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
        raise _TooLargeError
    download = await _download(response, MAX_RESPONSE_BYTES)
    if download.over_cap:
        raise _TooLargeError
    if download.trailing or download.more_members:
        raise ValueError("data after the end of the compressed body")
    if not download.complete:
        raise ValueError("compressed body ended early")
    return download.body


def _backend_failure(
    exc: BaseException, service: str, unreadable: tuple[type[Exception], ...] = ()
) -> str:
    """A short reason a backend call failed, without URLs or secrets.

    Args:
        exc: What the call raised.
        service: The backend as the model reads it ("the search engine").
        unreadable: Errors of a parser besides ValueError: the answer could
            not be read.

    Returns:
        The reason, e.g. "the search engine answered HTTP 503".
    """
    if isinstance(exc, _TooLargeError):
        limit = MAX_RESPONSE_BYTES // 1_000_000
        return f"{service} sent an answer larger than {limit} MB"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"{service} answered HTTP {exc.response.status_code}"
    if isinstance(exc, httpx.TransportError):
        return f"{service} could not be reached"
    if isinstance(exc, (ValueError, *unreadable)):
        return f"{service} sent an answer that could not be read"
    return f"unexpected error ({type(exc).__name__})"


class _RedirectLoopError(httpx.TransportError):
    """A backend that redirected more often than httpx follows: no answer came.

    A transport error, so the tools tell the model the service could not be
    reached (httpx's TooManyRedirects is not one: the tools called it an
    unexpected error).
    """


async def _get(client: httpx.AsyncClient, endpoint: _Endpoint, params: dict) -> bytes:
    """GET a backend answer, bounded in size (see _read_body)."""
    try:
        async with client.stream(
            "GET",
            endpoint.url,
            params=params,
            auth=endpoint.auth,
            headers={"Accept-Encoding": ACCEPT_ENCODING},
        ) as response:
            response.raise_for_status()
            return await _read_body(response)
    except httpx.TooManyRedirects as exc:
        raise _RedirectLoopError("the backend redirected too many times") from exc


# json's C parser holds the interpreter lock for a whole call: one json.loads
# of a 5 MB answer stalled the event loop for tenths of a second, even from a
# worker thread. Answers are parsed in steps of at most this many characters
# instead (well under a millisecond each), and the worker thread hands the
# lock back to the event loop between steps.
JSON_STEP_CHARS = 65_536


# A list or object bigger than a step is read member by member (each member in
# steps again): at most this deep (an answer's result list, a big record and
# its author list: three or four) ...
JSON_MAX_SPLIT_DEPTH = 8


# ... and at most this many members in all (a result list of hundreds, ten
# thousand for a big SearXNG page; 2.4 million bare zeros are not an answer).
JSON_MAX_SPLIT_VALUES = 100_000


# A value is first tried in a window this big (or twice the size of the
# member before it: records in a list are alike), then four times bigger up
# to a step: a member costs a few times its size at most, never a whole step.
_JSON_FIRST_WINDOW = 256


_JSON_RAW_DECODE = json.JSONDecoder().raw_decode


_JSON_SPACE = re.compile(r"[ \t\n\r]*")


# Whole units of a JSON string (no quote, no control character, complete
# escapes): a step boundary placed after them never splits an escape.
_JSON_STRING_UNITS = re.compile(
    r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*+'
)


_JSON_HIGH_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")


RawDecode = Callable[[str, int], tuple[Any, int]]


def _parse_json(body: bytes, raw_decode: RawDecode = _JSON_RAW_DECODE) -> Any:
    """A backend answer as JSON: json.loads's value, read in bounded steps.

    (Tests watch this function to see which thread parses an answer.)

    Args:
        body: The answer's bytes (UTF-8, -16 or -32, as json.loads reads them).
        raw_decode: json's `JSONDecoder.raw_decode` (the value at an index,
            and where it ends); no call is given more than JSON_STEP_CHARS
            characters.

    Returns:
        The value json.loads(body) gives.

    Raises:
        ValueError: What json.loads refuses, and answers that nest big values
            deeper than JSON_MAX_SPLIT_DEPTH or hold more than
            JSON_MAX_SPLIT_VALUES members of big values.
    """
    return _JsonSteps(_json_text(body), raw_decode).document()


def _json_text(body: bytes) -> str:
    """The body decoded as json.loads decodes bytes, a step at a time."""
    import codecs  # noqa: PLC0415  (the tools' import lists are not shared code)

    decoder = codecs.getincrementaldecoder(json.detect_encoding(body))("surrogatepass")
    pieces = [
        decoder.decode(body[start : start + JSON_STEP_CHARS])
        for start in range(0, len(body), JSON_STEP_CHARS)
    ]
    pieces.append(decoder.decode(b"", final=True))
    return "".join(pieces)


def _next_window(size: int) -> int:
    """The first window for a member after one of `size` characters."""
    return min(max(2 * size, _JSON_FIRST_WINDOW), JSON_STEP_CHARS)


class _JsonSteps:
    """One JSON text read in steps: each value whole if it fits, else by members."""

    def __init__(self, text: str, raw_decode: RawDecode) -> None:
        """Prepare to read `text` with json's `raw_decode`."""
        self.text = text
        self.raw_decode = raw_decode
        self.split_values = 0

    def document(self) -> Any:
        """The text's one value (whitespace around it allowed, nothing else)."""
        start = self.space(0)
        # A text longer than a step holds a longer value (but for trailing
        # spaces): no need to try it whole.
        fits = len(self.text) - start <= JSON_STEP_CHARS
        whole = self.whole(start, JSON_STEP_CHARS) if fits else None
        value, end = whole or self.split(start, 0)
        if self.space(end) != len(self.text):
            raise ValueError(f"Extra data at character {end}")
        return value

    def space(self, pos: int) -> int:
        """Where the whitespace starting at `pos` ends."""
        while True:
            spaces = _JSON_SPACE.match(self.text, pos, pos + JSON_STEP_CHARS)
            end = spaces.end() if spaces is not None else pos
            if end < pos + JSON_STEP_CHARS:
                return end
            pos = end

    def value(
        self, pos: int, depth: int, window: int = _JSON_FIRST_WINDOW
    ) -> tuple[Any, int]:
        """The value starting at `pos` (tried in `window` first), and its end."""
        return self.whole(pos, window) or self.split(pos, depth)

    def whole(self, pos: int, window: int) -> tuple[Any, int] | None:
        """The value at `pos` read in one step, or None when it needs more.

        Windows grow four-fold up to a step. A number cut by the window's
        edge still reads as a shorter number ("30." as 30, "1e+" as 1), so a
        value that ends within two characters of the edge counts as cut.
        """
        remaining = len(self.text) - pos
        while True:
            piece = self.text[pos : pos + window]
            try:
                value, end = self.raw_decode(piece, 0)
            except (ValueError, RecursionError):
                pass  # cut by the window, or malformed: `split` tells which
            else:
                if end + 2 < len(piece) or len(piece) == remaining:
                    return value, pos + end
            if window >= JSON_STEP_CHARS or len(piece) == remaining:
                return None
            window = min(4 * window, JSON_STEP_CHARS)

    def split(self, pos: int, depth: int) -> tuple[Any, int]:
        """A value too big (or too broken) for one step, read in parts."""
        opener = self.text[pos : pos + 1]
        if opener == '"':
            return self.long_string(pos)
        if opener not in {"{", "["}:
            raise ValueError(f"Expecting value at character {pos}")
        if depth >= JSON_MAX_SPLIT_DEPTH:
            raise ValueError("the answer nests values too deeply")
        if opener == "{":
            return self.members(pos, depth + 1)
        return self.elements(pos, depth + 1)

    def counted(self) -> None:
        """Count one member read by hand; refuse past JSON_MAX_SPLIT_VALUES."""
        self.split_values += 1
        if self.split_values > JSON_MAX_SPLIT_VALUES:
            raise ValueError(
                f"the answer has more than {JSON_MAX_SPLIT_VALUES} values "
                "to read one by one"
            )

    def after(self, pos: int, token: str) -> int:
        """The position after `token` at `pos` (ValueError if it is not there)."""
        if not self.text.startswith(token, pos):
            raise ValueError(f"Expecting {token!r} at character {pos}")
        return pos + len(token)

    def members(self, pos: int, depth: int) -> tuple[dict, int]:
        """The object starting at `pos`, member by member."""
        found: dict = {}
        window = _JSON_FIRST_WINDOW
        pos = self.space(pos + 1)
        if self.text.startswith("}", pos):
            return found, pos + 1
        while True:
            if not self.text.startswith('"', pos):
                raise ValueError(f"Expecting property name at character {pos}")
            name, pos = self.value(pos, depth)
            pos = self.space(self.after(self.space(pos), ":"))
            member, end = self.value(pos, depth, window)
            found[name] = member
            window, pos = _next_window(end - pos), end
            self.counted()
            pos = self.space(pos)
            if self.text.startswith("}", pos):
                return found, pos + 1
            pos = self.space(self.after(pos, ","))

    def elements(self, pos: int, depth: int) -> tuple[list, int]:
        """The array starting at `pos`, element by element."""
        found: list = []
        window = _JSON_FIRST_WINDOW
        pos = self.space(pos + 1)
        if self.text.startswith("]", pos):
            return found, pos + 1
        while True:
            element, end = self.value(pos, depth, window)
            found.append(element)
            window, pos = _next_window(end - pos), end
            self.counted()
            pos = self.space(pos)
            if self.text.startswith("]", pos):
                return found, pos + 1
            pos = self.space(self.after(pos, ","))

    def long_string(self, pos: int) -> tuple[str, int]:
        """A string longer than a step, decoded a step of whole units at a time."""
        parts: list[str] = []
        start = pos + 1
        while True:
            cut = self.unit_boundary(start)
            piece, end = self.raw_decode('"' + self.text[start:cut] + '"', 0)
            if end != cut - start + 2:
                raise ValueError(f"Invalid string at character {start}")
            parts.append(piece)
            if self.text.startswith('"', cut):
                return "".join(parts), cut + 1
            if cut == start:  # a control character, a bad escape, the end
                raise ValueError(f"Unterminated string starting at character {pos}")
            start = cut

    def unit_boundary(self, start: int) -> int:
        """The end of the string units from `start`, at most a step further.

        A high surrogate escape at the end is left for the next step: json
        joins it with the low surrogate escape that may follow.
        """
        stop = min(start + JSON_STEP_CHARS - 2, len(self.text))
        cut = _JSON_STRING_UNITS.match(self.text, start, stop)
        end = cut.end() if cut is not None else start
        last = end - 6
        if last > start and _JSON_HIGH_SURROGATE.match(self.text, last, end):
            before = self.text[start:last]
            if (len(before) - len(before.rstrip("\\"))) % 2 == 0:
                return last  # not itself an escaped backslash followed by "u"
        return end


async def _parse_off_loop(body: bytes, parse: Callable[[bytes], T]) -> T:
    """Run `parse(body)`; in a worker thread when the body is large."""
    if len(body) <= INLINE_PARSE_BYTES:
        return parse(body)
    return await asyncio.to_thread(parse, body)
