"""Large, deterministic documents for the event-loop benchmark.

A real-looking HTML article (head with scripts and styles, navigation, long
sections of paragraphs with links, lists and tables) and a multi-page PDF
whose pages carry real text content streams (about 45 lines of Helvetica
text each), both built to a requested size. Each starts with a marker word so
a benchmark can check that the text really came through the conversion.
"""

from __future__ import annotations

import random

HTML_MARKER = "BIGHTMLMARKER"
PDF_MARKER = "BIGPDFMARKER"

# Plain words (no brackets or backslashes: they go into PDF strings as is).
_WORDS = (  # noqa: SIM905 - a word list reads better as one text
    "energy solar panel efficiency cell silicon module output grid storage "
    "battery research report annual growth market capacity installation cost "
    "price policy region country data analysis result figure table study "
    "measurement temperature light conversion layer material thin film "
    "monocrystalline polycrystalline inverter voltage current power plant "
    "project investment forecast trend demand supply chain manufacturing"
).split()


def _lines(count: int, seed: int, width: int = 90) -> list[str]:
    """`count` distinct lines of plain words."""
    rng = random.Random(seed)
    lines = []
    for number in range(count):
        words = [f"L{number}"]
        while sum(len(w) + 1 for w in words) < width:
            words.append(rng.choice(_WORDS))
        lines.append(" ".join(words))
    return lines


def big_html(size: int) -> bytes:
    """An HTML article of about `size` bytes."""
    lines = _lines(400, seed=1)
    head = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        "<title>Solar energy yearbook</title>"
        "<style>" + "body{margin:0} .x{color:#333}" * 200 + "</style>"
        "<script>" + "var tracking = 1;" * 500 + "</script></head><body>"
        "<nav><ul>"
        + "".join(f"<li><a href='/s/{i}'>Section {i}</a></li>" for i in range(50))
        + "</ul></nav><main><article>"
        f"<h1>{HTML_MARKER} Solar energy yearbook</h1>"
    )
    parts = [head]
    total = len(head)
    section = 0
    while total < size - 200:
        section += 1
        block = [f"<h2>Section {section}</h2>"]
        for index in range(8):
            line = lines[(section * 8 + index) % len(lines)]
            block.append(
                f"<p>{line} <a href='/ref/{section}/{index}'>source {index}</a>"
                f" <b>{line[:30]}</b> and more text {line[30:]}.</p>"
            )
        block.append(
            "<ul>"
            + "".join(f"<li>{lines[(section + i) % len(lines)]}</li>" for i in range(4))
            + "</ul><table><tr><th>Year</th><th>Capacity</th></tr>"
            + "".join(
                f"<tr><td>{2000 + i}</td><td>{i * section}</td></tr>" for i in range(6)
            )
            + "</table>"
        )
        text = "".join(block)
        parts.append(text)
        total += len(text)
    parts.append("</article></main><footer>Footer</footer></body></html>")
    return "".join(parts).encode()


def _page_stream(lines: list[str]) -> bytes:
    ops = ["BT /F1 10 Tf 12 TL 56 760 Td"]
    ops.extend(f"({line}) Tj T*" for line in lines)
    ops.append("ET")
    return "\n".join(ops).encode()


def big_pdf(size: int, lines_per_page: int = 45) -> bytes:
    """A valid PDF of about `size` bytes: many pages of real text streams."""
    pool = _lines(997, seed=2)
    sample = len(_page_stream(pool[:lines_per_page])) + 250
    pages = max(1, size // sample)
    # Object numbers: 1 catalog, 2 page tree, 3 font, then page/content pairs.
    page_ids = [4 + 2 * i for i in range(pages)]
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets: list[int] = []

    def add(body: bytes) -> None:
        offsets.append(len(out))
        out.extend(f"{len(offsets)} 0 obj\n".encode() + body + b"\nendobj\n")

    add(b"<< /Type /Catalog /Pages 2 0 R >>")
    kids = " ".join(f"{pid} 0 R" for pid in page_ids)
    add(f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode())
    add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for page in range(pages):
        start = (page * lines_per_page) % len(pool)
        lines = [pool[(start + i) % len(pool)] for i in range(lines_per_page)]
        if page == 0:
            lines[0] = f"{PDF_MARKER} {lines[0]}"
        content = _page_stream(lines)
        add(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> "
            f"/Contents {page_ids[page] + 1} 0 R >>".encode()
        )
        add(
            f"<< /Length {len(content)} >>\nstream\n".encode()
            + content
            + b"\nendstream"
        )
    add(b"<< /Title (Solar energy yearbook, PDF edition) >>")
    info_id = len(offsets)
    xref = len(out)
    out.extend(f"xref\n0 {len(offsets) + 1}\n0000000000 65535 f \n".encode())
    for offset in offsets:
        out.extend(f"{offset:010d} 00000 n \n".encode())
    out.extend(
        f"trailer\n<< /Size {len(offsets) + 1} /Root 1 0 R /Info {info_id} 0 R >>\n"
        f"startxref\n{xref}\n%%EOF\n".encode()
    )
    return bytes(out)
