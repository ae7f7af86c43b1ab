"""The generic HTML page: escaped text and tables, inline SVG figures, atomic writes."""

from __future__ import annotations

import pytest

from modelpress.errors import ModelSaveError
from modelpress.report.html import Page, new_figure


def test_page_escapes_and_embeds_svg(tmp_path):
    page = Page("a <b> & c")
    s = page.section("numbers")
    s.text("x < y")
    s.table(["name", "value"], [["<script>", 1234.5678], ["n", 3]])
    fig, ax = new_figure(3, 2)
    ax.plot([1, 2], [3, 4])
    s.figure(fig, caption="a line")
    out = page.write(tmp_path / "p.html")
    text = out.read_text()
    assert "<script>" not in text and "&lt;script&gt;" in text and "a &lt;b&gt; &amp; c" in text
    assert '<td class="n">1,235</td>' in text and '<td class="n">3</td>' in text
    assert (
        text.count("<svg") == 1
        and "<?xml" not in text
        and "<figcaption>a line</figcaption>" in text
    )
    assert [p.name for p in tmp_path.iterdir()] == ["p.html"]


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ModelSaveError, match="does not exist"):
        Page("t").write(tmp_path / "no" / "p.html")
