"""Every relative link of the README and of ``docs/*.md`` reaches a file or folder that exists, and every ``#anchor``
a heading of its target, by GitHub's rules for heading anchors. Links to other sites are not followed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from experiments.paths import PROJECT_ROOT
from experiments.publishing import readme

_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
_ATX = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose(text: str) -> str:
    """``text`` without its fenced code, code spans and HTML comments: where a link is a link."""
    return _CODE_SPAN.sub("", _COMMENT.sub("", _FENCE.sub("", text)))


def links(text: str) -> list[str]:
    """The targets of the inline, image and reference links of a Markdown text, outside code."""
    text = prose(text)
    return _INLINE_LINK.findall(text) + _REFERENCE.findall(text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text (github-slugger): its rendered text lower-cased, every character but
    letters, digits, ``_``, ``-`` and spaces dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or image: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text: a repeated slug gets ``-1``, ``-2``, ..."""
    lines = _FENCE.sub(lambda match: "\n" * match.group(0).count("\n"), text).splitlines()
    seen: dict[str, int] = {}
    found = set()
    for number, line in enumerate(lines):
        heading = _ATX.match(line)
        if heading:
            title = heading.group(1)
        elif (number + 1 < len(lines) and _SETEXT.match(lines[number + 1]) and line.strip()
              and not line.lstrip().startswith(("|", "-", "*", ">")) and not _ATX.match(line)):
            title = line.strip()
        else:
            continue
        base = slug(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """The links of the Markdown file ``path`` that lead nowhere, each with why."""
    broken = []
    for target in links(path.read_text()):
        if not target or _SCHEME.match(target) or target.startswith("//"):
            continue
        file, _, anchor = target.partition("#")
        destination = (path.parent / file).resolve() if file else path
        if not destination.exists():
            broken.append(f"{target}: no {file}")
        elif anchor and destination.is_dir():
            broken.append(f"{target}: an anchor on a folder")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination.read_text()):
            broken.append(f"{target}: no heading #{anchor} in {file or path.name}")
    return broken


@pytest.mark.parametrize("path", readme.documents(), ids=lambda path: path.relative_to(PROJECT_ROOT).as_posix())
def test_every_link_of_the_readme_and_docs_resolves(path):
    assert broken_links(path) == []


def test_the_docs_index_links_every_page():
    index = readme.DOCS / "README.md"
    linked = {target.partition("#")[0] for target in links(index.read_text())}
    assert {page.name for page in readme.DOCS.glob("*.md")} - {"README.md"} <= linked


def test_slugs_follow_github():
    assert slug("What is in `topk`") == "what-is-in-topk"
    assert slug("Prop. 3.5: the bound") == "prop-35-the-bound"
    assert slug("Long-tailed data: margins and eps in cosine units") == "long-tailed-data-margins-and-eps-in-cosine-units"
    assert slug("The `paper` profile's data") == "the-paper-profiles-data"
    assert slug("A & B") == "a--b"
    assert slug("`superclass_mixing` and [the report](x.md)") == "superclass_mixing-and-the-report"
    assert anchors("# Notes\n\n## Notes\n\n```\n# not a heading\n```\nSetext\n------\n") == {"notes", "notes-1", "setext"}


def test_a_broken_file_or_anchor_is_found_and_code_is_not_read(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Its part\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/page.md#its-part) [ok](docs/) [ok](#top) ![ok](docs/page.md) [web](https://example.org/#x)\n"
        "[gone](docs/gone.md) [no anchor](docs/page.md#elsewhere) [self](#nowhere)\n"
        "`[code](docs/gone.md)`\n\n```\n[fenced](docs/gone.md)\n```\n\n[ref]: docs/also-gone.md\n\n# Top\n")
    assert broken_links(tmp_path / "README.md") == [
        "docs/gone.md: no docs/gone.md", "docs/page.md#elsewhere: no heading #elsewhere in docs/page.md",
        "#nowhere: no heading #nowhere in README.md", "docs/also-gone.md: no docs/also-gone.md"]
