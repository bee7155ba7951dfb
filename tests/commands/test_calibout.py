"""``calibkit calibrate``'s HTML sections and the saving of the chosen calibrator."""

from types import SimpleNamespace

import pytest
import torch

from calibkit.calibrators import load
from calibkit.commands.calibout import markdown_sections, save_chosen

TEXT = """## Recommendation

**Use: vector** (chosen on validation).

- test ECE x100 1.00

## Validation

| calibrator | ECE x100 | status |
|---|---|---|
| none | 5.00 | significantly above |
| vector | 1.00 | **chosen** |

* / !: a note after the table.

name   AURC  size
-----  ----  ----
none   16.2  2.02
ts     16.0  2.21
"""


def test_the_printed_text_becomes_sections_tables_and_paragraphs_in_order():
    secs = markdown_sections(TEXT)
    assert [s.title for s in secs] == ["Recommendation", "Validation", "Validation (continued)"]
    assert secs[0].text == "**Use: vector** (chosen on validation).\n\n- test ECE x100 1.00" and not secs[0].tables
    (table,) = secs[1].tables
    assert table.header == ["calibrator", "ECE x100", "status"]
    assert table.rows == [["none", "5.00", "significantly above"], ["vector", "1.00", "chosen"]]
    assert table.best == {(1, 2)}  # the **chosen** cell is the marked one
    assert secs[2].text == "* / !: a note after the table."
    (fixed,) = secs[2].tables
    assert fixed.header == ["name", "AURC", "size"] and fixed.rows == [["none", "16.2", "2.02"], ["ts", "16.0", "2.21"]]


@pytest.mark.parametrize("shape", [(50, 4), (50,)])
def test_saving_the_uncalibrated_choice_writes_the_identity(tmp_path, capsys, shape):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(*shape, generator=g, dtype=torch.float64) * 3
    sel = SimpleNamespace(chosen="none", fitted={})
    save_chosen(sel, sel.chosen, tmp_path, z)
    assert "saved none (the uncalibrated model: temperature scaling with T = 1)" in capsys.readouterr().out
    cal = load(tmp_path / "none")
    want = torch.sigmoid(z) if z.dim() == 1 else torch.softmax(z, 1)
    assert torch.allclose(cal.predict_proba(z).double().reshape(want.shape), want, atol=1e-15, rtol=0)
    assert cal.binary_ == (z.dim() == 1) and cal.n_classes_ == (2 if z.dim() == 1 else 4)
