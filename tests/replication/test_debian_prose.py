"""The twin's prose: HTML pages -> paragraphs (data/html_text.py) and the pinned Debian
packages -> documents (longctx_replication/debian_prose.py), on hand-made pages; no network, no apt."""

import hashlib

import pytest

from longctx.data.corpus import CorpusReport
from longctx.data.html_text import html_paragraphs, html_text
from longctx.data.tokenizer import load_tokenizer
from longctx.errors import DataError
from longctx_replication.debian_prose import ProsePackage, fetch, package_documents, write_tokenizer

PAGE = """<!DOCTYPE html><html><head><title>6.2. apt-get</title><style>p {color: red}</style></head>
<body><div id="banner"><a href="x"><span class="text">Download the ebook</span></a></div>
<p id="title">The Debian Administrator's Handbook</p>
<div class="navheader"><table><tr><td><a>Prev</a></td></tr></table></div>
<div class="toc"><dl class="toc"><dt>6.2.1. Initialization</dt><div class="toc">nested</div></dl></div>
<div role="navigation">index | next</div>
<h2 class="title">6.2. aptitude,
   apt-get, and <code class="command">apt</code> Commands</h2><a class="headerlink">&para;</a>
<div class="para">APT is a <em>vast</em> project &mdash; whose plans<br>included a GUI.</div>
<pre class="screen"><code># apt update</code></pre>
<table class="table"><tr><td>package</td><td>size</td></tr></table>
<ul><li>First item</li><li>Second &amp; last</li></ul>
<script>var a = "<p>not text</p>";</script>
<div class="navfooter">Next</div></body></html>"""


def test_html_keeps_the_prose_and_drops_navigation_listings_and_tables():
    # Expected paragraphs written by hand from PAGE above.
    assert html_paragraphs(PAGE) == [
        "6.2. aptitude, apt-get, and apt Commands",
        "APT is a vast project \u2014 whose plans",
        "included a GUI.",
        "First item",
        "Second & last",
    ]
    assert html_text("<p>one</p><p>two  \n words</p>") == "one\n\ntwo words"


def test_a_skipped_element_ends_at_its_own_closing_tag_even_when_nested():
    html = "<div class='toc'><div>in toc</div><div>still toc</div></div><p>after</p>"
    assert html_paragraphs(html) == ["after"]


def _package(tmp_path, pages: dict[str, str]) -> tuple[ProsePackage, object]:
    root = tmp_path / "tree"
    for name, body in pages.items():
        path = root / "usr/share/doc/manual" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
    return ProsePackage("manual", "1.0", "0" * 64, "usr/share/doc/manual/*.html", "GPL-2+"), root


def test_one_document_per_page_sorted_generated_pages_excluded_empty_pages_reported(tmp_path):
    package, root = _package(
        tmp_path,
        {
            "b.html": "<p>Second page.</p>",
            "a.html": "<p>First page.</p>",
            "genindex.html": "<p>Index of terms</p>",
            "toc.html": "<div class='toc'><p>only navigation</p></div>",
        },
    )
    report = CorpusReport()
    documents = list(package_documents(package, root, report))
    assert [(d.id, d.text, d.domain) for d in documents] == [
        ("debian:manual/usr/share/doc/manual/a.html", "First page.", "prose"),
        ("debian:manual/usr/share/doc/manual/b.html", "Second page.", "prose"),
    ]
    assert [(r.where, r.kind) for r in report.rejections] == [("manual/usr/share/doc/manual/toc.html", "empty")]
    with pytest.raises(DataError, match="toc.html: no prose"):
        list(package_documents(package, root))


def test_a_tree_without_the_pages_is_named_in_the_error(tmp_path):
    package, _ = _package(tmp_path, {"a.html": "<p>x</p>"})
    with pytest.raises(DataError, match="holds no page matching"):
        list(package_documents(package, tmp_path / "elsewhere"))


def test_fetch_refuses_a_deb_that_is_not_the_pinned_build(tmp_path):
    deb = tmp_path / "manual_1.0_all.deb"
    deb.write_bytes(b"not the archive's file")
    pinned = ProsePackage("manual", "1.0", hashlib.sha256(b"the real one").hexdigest(), "*.html", "GPL-2+")
    with pytest.raises(DataError, match="not the pinned"):
        fetch(pinned, tmp_path)
    matching = ProsePackage("manual", "1.0", hashlib.sha256(b"not the archive's file").hexdigest(), "*.html", "GPL-2+")
    assert fetch(matching, tmp_path) == deb  # already there and right: no download


def test_the_written_tokenizer_file_is_the_same_tokenizer(tmp_path):
    path = write_tokenizer("bpe-300", tmp_path)
    original, written = load_tokenizer("bpe-300"), load_tokenizer(str(path))
    assert written.fingerprint == original.fingerprint
    assert (written.eos_id, written.pad_id) == (original.eos_id, original.pad_id)
    text = "The crate holds 48213 units."
    assert written.encode(text) == original.encode(text)
