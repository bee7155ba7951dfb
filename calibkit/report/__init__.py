"""The bench report: terminal tables, ``report.md`` and a self-contained ``index.html``.

Everything is rebuilt from the results database (``runs.db``) and the logits files its rows point
to, so ``calibkit report DIR`` gives the same report as the bench that wrote ``DIR``.

It opens with the **recommendation**: the method + post-hoc calibrator pair chosen on the
validation split (:mod:`~calibkit.report.verdict`), with its test evidence and its difference from
CE + temperature scaling. Then the methods **ranked by test ECE** (accuracy, ECE after temperature
scaling and the difference from CE beside it, the best value of each column marked: a table of
test results, not a choice), then the grid-order tables
(mean +- std over seeds, std with ``ddof=1``; a single seed shows the mean alone), then figures.
Calibration numbers (ECE, AECE, classwise ECE, MCE, O-/U-ECE) and accuracies are x100, NLL and
Brier as they are. The ``dECE vs CE`` column is a **paired bootstrap** over test samples: every
resample draws one set of test indices, applied to both the method's and CE's probabilities of
the same seed; the statistic is the seed-averaged ECE difference, so the interval reflects the
test-set sampling noise (the spread over seeds is in the +- column). The interval is the
**basic** bootstrap interval (``calibkit.bootstrap.bootstrap_interval``, the default of
``paired_bootstrap_diff``), which corrects the bias of the difference of two binned ECEs. A
difference whose 95% interval excludes 0 is marked by its side: ``*`` significantly better (below 0
for an error), ``!`` significantly worse.

Every run's saved validation/test logits also go through every post-hoc calibrator of
``calibkit.calibrators.CALIBRATORS`` at report time (:mod:`~calibkit.report.calibrated`, cached
under ``DIR/cache/calibrated/``): each method's calibrator chosen on cross-fitted validation scores
(cached under ``DIR/cache/selection/``), the methods x calibrators tables and heatmap, and in the ranking
the paired differences from CE + temperature scaling before and after the method's own TS, the
accuracy difference from CE and intervals for O-ECE and U-ECE (:mod:`~calibkit.report.paired`,
which also backs ``calibkit compare``).

Segmentation runs (``test_image`` in their logits file): the tables are over every labelled test
pixel (the run's streamed evaluation), the ``dECE`` column over the stored test pixel sample with
an **image-level** paired bootstrap (:mod:`calibkit.grouped_bootstrap`: pixels of one image are
not independent), and the tables add mIoU and leave out the OOD and shift columns.

Modules: :mod:`~calibkit.report.data` (numbers), :mod:`~calibkit.report.tables` (tables and their
text/Markdown forms), :mod:`~calibkit.report.figures` (PNG figures), :mod:`~calibkit.report.render`
(sections to text, Markdown, HTML), :mod:`~calibkit.report.build` (``build_report`` and the list
of section builders, :data:`~calibkit.report.build.SECTIONS`, where new report parts plug in).
"""

from calibkit.report.build import SECTIONS, ReportContext, build_report
from calibkit.report.data import ece_deltas, label, load_probs, ranking, summarize
from calibkit.report.render import Section
from calibkit.report.tables import AFTER_COLS, BEFORE_COLS, EXTRA_COLS, SUMMARY_COLS, Table

__all__ = ["build_report", "SECTIONS", "ReportContext", "Section", "Table", "summarize", "ece_deltas", "ranking",
           "label", "load_probs", "BEFORE_COLS", "AFTER_COLS", "EXTRA_COLS", "SUMMARY_COLS"]
