"""HTML documentation pages -> plain prose paragraphs, with the standard library's parser.

The GPU twin's natural text (longctx_replication/debian_prose.py) comes from Debian's HTML manuals. A
page becomes one document: the text of its block elements (paragraphs, headings, list
items, notes), one paragraph per block, whitespace inside a paragraph collapsed, blank
lines between paragraphs. Left out, with everything inside them:

- what is not prose: `pre` (shell sessions, configuration files, program listings),
  `table` (package and option lists), `script`, `style`, the `head`;
- the navigation every page of a DocBook or Sphinx manual repeats (elements whose `class`
  or `id` names a table of contents, a navigation bar, a sidebar or the site banner), which
  would otherwise be trained on every page.

Inline elements (`code`, `em`, links) keep their text in the sentence. Character
references are decoded (`convert_charrefs`).
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

SKIPPED_TAGS = frozenset({"head", "script", "style", "pre", "table", "nav"})
"""Elements left out with their content."""
SKIPPED_NAMES = frozenset(
    {
        "toc",
        "navheader",
        "navfooter",
        "docnav",
        "banner",
        "list-of-tables",
        "list-of-figures",
        "related",
        "sphinxsidebar",
        "headerlink",
        "footer",
    }
)
"""`class` tokens or `id`s of elements left out with their content (DocBook and Sphinx
navigation, Sphinx's pilcrow links); so is any element with `role="navigation"`."""
SKIPPED_IDS = frozenset({"title"})
"""`id`s of site headers (the handbook's `<p id="title">` repeats the book title on every page)."""
BLOCK_TAGS = frozenset(
    {"p", "div", "li", "dt", "dd", "br", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "section", "tr", "title"}
)
"""Elements that start and end a paragraph."""
_SPACE = re.compile(r"\s+")


class _ProseParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self._current: list[str] = []
        self._skip_tag: str | None = None
        self._skip_depth = 0

    def _skipped(self, tag: str, attrs: list[tuple[str, str | None]]) -> bool:
        if tag in SKIPPED_TAGS:
            return True
        values = dict(attrs)
        classes = set((values.get("class") or "").split())
        element_id = values.get("id") or ""
        if values.get("role") == "navigation" or element_id in SKIPPED_NAMES or element_id in SKIPPED_IDS:
            return True
        return bool(classes & SKIPPED_NAMES)

    def _end_paragraph(self) -> None:
        text = _SPACE.sub(" ", "".join(self._current)).strip()
        if text:
            self.paragraphs.append(text)
        self._current = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skip_tag is not None:
            self._skip_depth += tag == self._skip_tag
            return
        if self._skipped(tag, attrs):
            self._end_paragraph()
            self._skip_tag, self._skip_depth = tag, 1
        elif tag in BLOCK_TAGS:
            self._end_paragraph()

    def handle_endtag(self, tag: str) -> None:
        if self._skip_tag is not None:
            if tag == self._skip_tag:
                self._skip_depth -= 1
                if self._skip_depth == 0:
                    self._skip_tag = None
            return
        if tag in BLOCK_TAGS:
            self._end_paragraph()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skip_tag is None and tag in BLOCK_TAGS:  # <br/>: a break, never a skipped subtree
            self._end_paragraph()

    def handle_data(self, data: str) -> None:
        if self._skip_tag is None:
            self._current.append(data)


def html_paragraphs(html: str) -> list[str]:
    """The prose paragraphs of one HTML page, in document order (see the module docstring)."""
    parser = _ProseParser()
    parser.feed(html)
    parser.close()
    parser._end_paragraph()
    return parser.paragraphs


def html_text(html: str) -> str:
    """One page as text: its paragraphs separated by blank lines."""
    return "\n\n".join(html_paragraphs(html))
