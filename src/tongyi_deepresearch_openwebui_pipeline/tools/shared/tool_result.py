"""`ToolResult`: a tool's text that also says whether the call worked."""

# The tool modules do not import annotations from __future__ (Open WebUI
# builds their specs from live annotations), so neither does this code.

# --- snippet ---


class ToolResult(str):
    """The text for the model, carrying whether the call worked and its sources.

    Open WebUI and the model see a plain string. The research pipe reads `ok`
    so a failed call shows as failed: the words alone cannot tell it (a page
    may well begin with "Error"); `sources`, the pages the call read, as the
    `data` of Open WebUI source events, so it can number citations; and
    `papers`, the scholarly records a search found (title, url, pdf,
    authors, year, venue, doi), so a cited paper is exported as one.
    """

    ok: bool
    sources: tuple
    papers: tuple

    def __new__(
        cls, text: str, *, ok: bool, sources: tuple = (), papers: tuple = ()
    ) -> "ToolResult":
        """Wrap ``text``; ``ok`` is False when the call produced nothing usable."""
        result = super().__new__(cls, text)
        result.ok = ok
        result.sources = tuple(sources)
        result.papers = tuple(papers)
        return result
