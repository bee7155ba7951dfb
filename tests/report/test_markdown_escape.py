"""``report.md`` escapes user text (preset notes, names, paths): no raw HTML, no link but the figures'."""

from pathlib import Path

import pytest

from calibkit.report.figures import Figure
from calibkit.report.render import Section, to_markdown
from calibkit.report.tables import Table, md_code, md_escape

PAYLOADS = ["<script>alert(1)</script>", "[x](javascript:alert(1))", "![i](http://evil/x.png)",
            "<img src=x onerror=alert(1)>", "[r][1]\n\n[1]: javascript:alert(1)", "<javascript:alert(1)>",
            "a`<script>b`c", "``<b>x</b>"]


def test_md_escape_by_hand():
    assert md_escape("<b>") == "&lt;b&gt;"
    assert md_escape("[x](javascript:y)") == "[x]\\(javascript:y)"
    assert md_escape("[1]: u") == "[1]\\: u"
    assert md_escape("ECE [0.10, 0.20] **best** `a<b`") == "ECE [0.10, 0.20] **best** `a<b`"  # kept as written
    assert md_code("plain") == "`plain`"
    assert md_code("a`b") == "``a`b``" and md_code("`x") == "`` `x ``"


@pytest.mark.parametrize("payload", PAYLOADS)
def test_every_text_of_report_md_renders_as_text(payload):
    markdown_it = pytest.importorskip("markdown_it")
    fig = Figure(Path("figures/f.png"), f"caption {payload}")
    sec = Section(f"title {payload}", f"note: {payload}\n\npath `{payload}`",
                  [Table(["name", "value"], [[payload, "1"]], key_columns=1)], [fig])
    md = to_markdown(f"preset {payload}", f"intro {payload}", [sec])
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(md)
    assert "<script" not in html and html.count("<img") == 1  # the figure's, nothing else
    # the only link: the table of contents' anchor within the page (#...; none where the payload's line
    # breaks end the list item), never the payload's
    hrefs = [p.split('"')[0] for p in html.split('href="')[1:]]
    srcs = [p.split('"')[0] for p in html.split('src="')[1:]]
    assert html.count("<a ") == len(hrefs) <= 1 and all(h.startswith("#title-") for h in hrefs), hrefs
    assert srcs == ["figures/f.png"], srcs
