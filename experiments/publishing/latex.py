"""LaTeX in HTML without MathJax: ``$...$`` segments become MathML, which browsers draw natively, so the report
needs no script from a CDN to show Table 1's formulas."""

from __future__ import annotations

import html

from latex2mathml.converter import convert


def to_html(text: str) -> str:
    """``text`` with every ``$...$`` segment as inline MathML and the rest HTML-escaped."""
    pieces = text.split("$")
    if len(pieces) % 2 == 0:
        raise ValueError(f"unbalanced '$' in {text!r}")
    return "".join(convert(piece) if i % 2 else html.escape(piece) for i, piece in enumerate(pieces))


def html_table(rows: list[dict[str, str]]) -> str:
    """An HTML table of ``rows`` (dicts with the same keys), each cell through :func:`to_html`."""
    columns = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{to_html(row[c])}</td>" for c in columns) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
