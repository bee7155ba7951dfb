"""Render report sections as terminal text, Markdown (``report.md``) and self-contained HTML (``index.html``).

A report is a title, an intro and a list of :class:`Section`; each renderer walks the same list,
so the three outputs never disagree. Section text may use two pieces of Markdown, both rendered
in HTML: ```code``` and ``**bold**``.
"""

from __future__ import annotations

import base64
import html
import re
import textwrap
from dataclasses import dataclass, field
from urllib.parse import quote

from calibkit.report.figures import Figure
from calibkit.report.tables import BEST_MARK, Table, md_escape, md_table, text_table


@dataclass
class Section:
    """One part of the report.

    Attributes:
        title: the heading.
        text: paragraphs (blank-line separated) shown under the heading.
        tables: tables, in order.
        figures: figures with captions (HTML and Markdown only).
        terminal: also printed in the terminal (title, text and tables).
        anchor: the HTML id (derived from the title when empty).
        terminal_text: the text printed in the terminal instead of ``text`` (None: ``text``).
        lead: part of the first screen: the leading sections come before the table of contents,
            their figures side by side (HTML).
    """

    title: str
    text: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    terminal: bool = True
    anchor: str = ""
    terminal_text: str | None = None
    lead: bool = False


def _plain(text: str, width: int | None = None) -> str:
    """Terminal form of section text: no Markdown marks, ASCII, paragraphs wrapped to ``width``."""
    text = text.replace("**", "").replace("`", "").replace("±", "+-")
    if not width:
        return text
    return "\n\n".join(_fill(p, width) for p in text.split("\n\n"))


_BULLET = re.compile(r"^( *)- ")


def _fill(paragraph: str, width: int) -> str:
    """One paragraph wrapped to ``width``; a Markdown list keeps one item per line (nested items
    indented, continuation lines hanging under the item's text)."""
    if not any(_BULLET.match(line) for line in paragraph.splitlines()):
        return textwrap.fill(paragraph, width)
    items: list[tuple[str, list[str]]] = []  # (indent of the continuation lines, words' lines)
    for line in paragraph.splitlines():
        bullet = _BULLET.match(line)
        if bullet or not items:
            items.append((" " * (len(bullet.group(0)) if bullet else 0), [line]))
        else:
            items[-1][1].append(line.strip())
    return "\n".join(textwrap.fill(" ".join(lines), width, subsequent_indent=indent) for indent, lines in items)


def to_text(title: str, sections: list[Section], width: int | None) -> str:
    """Terminal text: the title, then every terminal section with its tables fitted to ``width``."""
    parts = [title] if title else []
    for s in sections:
        if not s.terminal or not (s.tables or s.text):
            continue
        parts += ["", s.title]
        text = s.text if s.terminal_text is None else s.terminal_text
        if text:
            parts.append(_plain(text, width))
        if s.tables:
            parts.append("\n\n".join(text_table(t, width) for t in s.tables))
    return "\n".join(parts)


def anchor_of(s: Section) -> str:
    return s.anchor or re.sub(r"[^a-z0-9]+", "-", s.title.lower()).strip("-")


def _ordered(sections: list[Section]) -> tuple[list[Section], list[Section]]:
    """``(lead, rest)``: the first screen's sections, then the others, each in their order."""
    return [s for s in sections if s.lead], [s for s in sections if not s.lead]


def to_markdown(title: str, intro: str, sections: list[Section]) -> str:
    """``report.md``: every text escaped by :func:`md_escape` (user notes, names and paths land as text,
    never as HTML or links); the figures' links and the table of contents' anchors are the only links."""
    lead, rest = _ordered(sections)
    out = [f"# {md_escape(title)}", "", md_escape(intro), ""]
    for s in lead + rest:
        if s is (rest[0] if rest else None):
            out += ["## Contents", "", *[f"- [{md_escape(r.title)}](#{anchor_of(r)})" for r in rest], ""]
        out += [f"## {md_escape(s.title)}", ""]
        if s.text:
            out += [md_escape(s.text), ""]
        for t in s.tables:
            out += [md_table(t), ""]
        for f in s.figures:
            one = " ".join(f.caption.split())  # one line: a blank line would end the image
            alt = one.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]").replace("<", "&lt;")
            out += [f"![{alt}](figures/{quote(f.path.name)})", "", f"*{md_escape(one)}*", ""]
    return "\n".join(out)


def inline(text: str) -> str:
    """Escape ``text`` for HTML and render its ```code``` and ``**bold**`` spans."""
    text = html.escape(text, quote=False)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


def _paragraphs(text: str) -> str:
    return "".join(f"<p>{inline(p.strip())}</p>" for p in text.split("\n\n") if p.strip())


def html_table(table: Table) -> str:
    """An HTML table; label columns get class ``key``, the best cells of their column class
    ``best``, of their row class ``rowbest``."""
    def cls(j, extra=""):
        names = " ".join(n for n in ("key" if j < table.key_columns else "", extra) if n)
        return f' class="{names}"' if names else ""
    th = "".join(f"<th{cls(j)}>{html.escape(h)}</th>" for j, h in enumerate(table.header))
    body = "".join(
        "<tr>" + "".join(f"<td{cls(j, _marks(table, i, j))}>{html.escape(c)}</td>"
                         for j, c in enumerate(r)) + "</tr>"
        for i, r in enumerate(table.rows))
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _marks(table: Table, i: int, j: int) -> str:
    return " ".join(n for n, cells in (("best", table.best), ("rowbest", table.row_best)) if (i, j) in cells)


def _img(fig: Figure) -> str:
    data = base64.b64encode(fig.path.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{html.escape(fig.caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{inline(fig.caption)}</figcaption></figure>")


STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1300px;padding:0 1em;color:#222}"
    "h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd}"
    "table{border-collapse:collapse;font-size:13px;margin:.6em 0}"
    "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right;white-space:nowrap}"
    "th{background:#f3f3f3}th.key,td.key{text-align:left}"
    "td.best{font-weight:bold;background:#e3f4e1}td.rowbest{font-style:italic;text-decoration:underline}"
    "code{background:#f3f3f3;padding:0 3px;border-radius:3px}"
    "figure{margin:1.2em 0}img{max-width:100%}figcaption{font-size:14px;color:#444;margin-top:.3em}"
    "div.lead{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}"
    "div.lead figure{margin:.4em 0;flex:1 1 360px;max-width:560px}div.lead figcaption{font-size:12px}"
    "nav#contents ol{columns:2;font-size:14px}"
)


def to_html(title: str, intro: str, sections: list[Section]) -> str:
    """A self-contained page (figures embedded as data URIs) that reads top-down: the title, the
    leading sections (the recommendation and its figures, side by side), a table of contents of
    the other sections, the other sections."""
    lead, rest = _ordered(sections)
    parts = [f"<h1>{inline(title)}</h1>", _paragraphs(intro)]
    for s in lead:
        parts += [f'<h2 id="{anchor_of(s)}">{inline(s.title)}</h2>', _paragraphs(s.text)]
        parts += [html_table(t) for t in s.tables]
        if s.figures:
            parts.append('<div class="lead">' + "".join(_img(f) for f in s.figures) + "</div>")
    if rest:
        items = "".join(f'<li><a href="#{anchor_of(s)}">{inline(s.title)}</a></li>' for s in rest)
        parts.append(f'<nav id="contents"><h2>Contents</h2><ol>{items}</ol></nav>')
    for s in rest:
        parts += [f'<h2 id="{anchor_of(s)}">{inline(s.title)}</h2>', _paragraphs(s.text)]
        parts += [html_table(t) for t in s.tables]
        parts += [_img(f) for f in s.figures]
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(_plain(title))}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")


__all__ = ["Section", "to_text", "to_markdown", "to_html", "inline", "html_table", "BEST_MARK"]
