"""What ``calibkit calibrate`` writes besides its Markdown: the HTML page and the saved calibrator.

The HTML page (``DIR/report/index.html``) is rendered by the bench report's machinery
(:func:`calibkit.report.render.to_html`): one self-contained file with the recommendation, the
validation table the choice was made on, the test tables and the reliability diagrams of the
uncalibrated model and of the chosen calibrator on the test rows. Its sections are the ones printed
in the terminal, parsed back from their Markdown (headings ``## ``, tables of ``|`` rows), so the
page and the terminal never disagree.

``--save`` without a name saves the chosen calibrator as ``DIR/NAME.safetensors`` + ``.json``
under its own name. When the uncalibrated model is chosen (``none``), the file saved is
temperature scaling with ``T = 1`` under the name ``none``: ``softmax(z / 1) = softmax(z)`` (and
``sigmoid(z / 1)`` for binary scores), so ``calibkit apply`` returns the uncalibrated probabilities,
with the same checks of K and layout as any other calibrator.
"""

from __future__ import annotations

import re
from pathlib import Path

from calibkit.calibrators import TemperatureScaling, save
from calibkit.calibrators.selection import NONE
from calibkit.diskio import atomic_write
from calibkit.errors import UserError
from calibkit.report.figures import Figure
from calibkit.report.render import Section, to_html
from calibkit.report.tables import Table

HTML = "index.html"


def markdown_sections(text: str):
    """:class:`~calibkit.report.render.Section` list of the printed ``text``: ``## `` headings, Markdown
    ``|`` tables (``**x**`` cells become the table's marked cells), fixed-width tables (a header, a
    rule of dashes, rows whose columns are 2+ spaces apart), every other line a paragraph."""
    sections: list[Section] = []
    for block in ("\n" + text).split("\n## ")[1:]:
        title, _, body = block.partition("\n")
        section = Section(title.strip())
        paragraphs: list[str] = []
        table, kind = None, ""
        lines = body.splitlines()
        for n, line in enumerate(lines):
            ahead = lines[n + 1] if n + 1 < len(lines) else ""
            if kind == "fixed" and table is not None and line.strip():  # "fixed" follows a table's header
                table.rows.append(_columns(line))
                continue
            if kind == "md" and line.startswith("|"):
                _md_row(table, line)
                continue
            if table is not None and kind != "header":
                section.tables.append(table)
                table, kind = None, ""
            if line.startswith("|"):
                table, kind = _new_table([c.strip() for c in line.strip().strip("|").split("|")]), "md"
            elif _rule(ahead) and line.strip():
                table, kind = _new_table(_columns(line)), "header"
            elif kind == "header" or not line.strip():
                pass
            else:
                if section.tables:  # text after a table: a section of its own, so the page keeps the order
                    section.text = "\n\n".join(paragraphs)
                    sections.append(section)
                    section, paragraphs = Section(f"{title.strip()} (continued)"), []
                paragraphs.append(line.strip())
            if kind == "header" and _rule(line):
                kind = "fixed"
        if table is not None:
            section.tables.append(table)
        section.text = "\n\n".join(paragraphs)
        sections.append(section)
    return sections


def _new_table(header):
    return Table(header, [])


def _md_row(table, line: str) -> None:
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if all(set(c) <= set("-: ") for c in cells):  # the header's rule
        return
    i = len(table.rows)
    table.best |= {(i, j) for j, c in enumerate(cells) if c.startswith("**") and "**" in c[2:]}
    table.rows.append([c.replace("**", "") for c in cells])


def _rule(line: str) -> bool:
    """A fixed-width table's rule: runs of ``-`` separated by spaces (``-----  ----``)."""
    return bool(line.strip()) and set(line.strip()) <= {"-", " "} and "  " in line.strip()


def _columns(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def html_report(report: Path, text: str, chosen: str, val: tuple, test: tuple) -> Path:
    """Write ``report/index.html`` from the printed ``text`` and the reliability diagrams already in
    ``report`` (the uncalibrated model's and the ``chosen`` one's); returns its path."""
    sections = markdown_sections(text)
    figures = [Figure(report / f"reliability_{name}.png", caption)
               for name, caption in ((NONE, "Before: the uncalibrated model on the test rows"),
                                     (chosen, f"After: the chosen calibrator, {chosen}, on the test rows"))
               if name == NONE or chosen != NONE]
    if sections:
        sections[0].figures = figures
    intro = (f"Every calibrator fitted and chosen on `{val[0]}` ({val[1]} rows), scored on `{test[0]}` "
             f"({test[1]} rows). The choice uses the validation rows only; the test numbers are for reference.")
    path = report / HTML
    doc = to_html(f"calibkit calibrate: use {chosen}", intro, sections)
    atomic_write(path, lambda tmp: Path(tmp).write_text(doc))
    return path


def save_chosen(sel, name: str, out: Path, logits) -> None:
    """Save ``sel``'s calibrator ``name`` (``"none"``: the identity, module docstring) to ``out``; print where."""
    if name == NONE:
        cal = identity(logits)
    elif name in sel.fitted:
        cal = sel.fitted[name]
    else:  # pragma: no cover - run() refuses a calibrator that was not fitted before anything is written
        raise UserError(f"--save {name!r}: not fitted")
    st, js = save(cal, out / name)
    what = " (the uncalibrated model: temperature scaling with T = 1)" if name == NONE else ""
    print(f"\nsaved {name}{what}: {st} + {js}\napply it with: calibkit apply --calibrator {out / name} "
          "--input NEW.npz --out NEW_calibrated.npz")


def identity(logits):
    """Temperature scaling fixed at ``T = 1`` for logits shaped like ``logits`` (the identity map)."""
    cal = TemperatureScaling()
    cal.temperature_, cal.n_iter_ = 1.0, 0
    cal.binary_ = logits.dim() == 1
    cal.n_classes_ = 2 if cal.binary_ else int(logits.shape[1])
    return cal
