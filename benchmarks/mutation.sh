#!/usr/bin/env bash
# Mutation testing of calibkit's core modules with mutmut (a benchmark, not run in CI).
#
#   benchmarks/mutation.sh [MODULE...]      e.g. benchmarks/mutation.sh calibkit/store/base.py
#   benchmarks/mutation.sh extended         every module of train/, bench/, data/, integrations/
#
# Each module is mutated in its own sandbox (a copy of calibkit/ and tests/ under $MUTATION_DIR,
# default /tmp/calibkit-mutation) whose mutmut configuration names only that module and only the
# test files that exercise it; mutmut then runs, for each mutant, only the tests that call the
# mutated function. One worker per CPU core; MUTATION_CHILDREN overrides it.
# Prints one line per module and, last, `killed K of N mutants` (K counts killed and timed-out
# mutants, N every mutant generated, including those no selected test reaches in-process: mutmut
# maps tests to functions by tracing the pytest process, so code reached only in subprocesses
# (CLI calls, spawned DDP workers) counts as not reached). Tests marked slow are left out.
# Needs the dev extra: pip install -e '.[dev]'.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
MUTMUT=${MUTMUT:-$(dirname "$(command -v "$PY")")/mutmut}
WORK=${MUTATION_DIR:-/tmp/calibkit-mutation}
CHILDREN=${MUTATION_CHILDREN:-$(nproc)}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

# module -> the test files (or file::test node ids) that exercise it (space separated)
declare -A TESTS=(
  [calibkit/store/base.py]="tests/test_store.py tests/test_blindspots_store.py tests/store/test_store_backends.py"
  [calibkit/store/sqlite.py]="tests/test_store.py tests/test_blindspots_store.py tests/store/test_store_backends.py tests/store/test_store_paths.py"
  [calibkit/store/common.py]="tests/test_store.py tests/test_blindspots_store.py tests/store/test_store_backends.py"
  [calibkit/methods/csm/store.py]="tests/test_csm_store.py tests/test_blindspots_csm_store.py"
  [calibkit/bench/evaluation.py]="tests/test_bench.py tests/test_blindspots_bench.py tests/test_blindspots_twostage.py tests/test_blindspots_bench_evaluation.py"
  [calibkit/functional/binning.py]="tests/test_functional_metrics.py tests/test_metrics.py tests/test_blindspots_binning.py tests/test_metric_inputs.py tests/test_blindspots_binning2.py"
  [calibkit/functional/metrics.py]="tests/test_functional_metrics.py tests/test_metric_inputs.py tests/test_blindspots_binning.py tests/test_blindspots_metrics.py"
  [calibkit/functional/panel.py]="tests/test_metric_inputs.py tests/test_pixel_metrics.py tests/test_functional_metrics.py tests/test_blindspots_binning.py tests/test_blindspots_panel.py"
  [calibkit/functional/panel_device.py]="tests/test_metric_inputs.py tests/test_pixel_metrics.py tests/test_blindspots_binning.py tests/test_blindspots_panel.py"
  [calibkit/functional/panel_types.py]="tests/test_blindspots_panel.py tests/test_metric_inputs.py tests/test_functional_metrics.py"
  [calibkit/bootstrap.py]="tests/test_metrics.py tests/test_blindspots_bootstrap.py"
  [calibkit/grouped_bootstrap.py]="tests/test_segmentation_train.py tests/test_blindspots_bootstrap.py"
  [calibkit/functional/losses.py]="tests/test_functional_losses.py tests/test_losses.py tests/test_dense_losses.py tests/test_blindspots_functional_losses.py"
  [calibkit/metrics.py]="tests/test_metrics.py tests/test_pixel_metrics.py tests/test_metric_inputs.py tests/test_blindspots_metrics.py"
  [calibkit/calibrators/temperature.py]="tests/test_calibrators.py tests/test_blindspots_calibrators.py tests/calibrators/test_temperature.py"
  [calibkit/calibrators/_base.py]="tests/calibrators/test_base.py tests/calibrators/test_temperature.py"
  [calibkit/calibrators/scaling.py]="tests/calibrators/test_scaling.py tests/calibrators/test_base.py"
  [calibkit/calibrators/ets.py]="tests/calibrators/test_ets.py tests/calibrators/test_base.py"
  [calibkit/calibrators/binning.py]="tests/calibrators/test_binning.py tests/calibrators/test_base.py"
  [calibkit/calibrators/spline.py]="tests/calibrators/test_spline.py tests/calibrators/test_base.py"
  [calibkit/calibrators/io.py]="tests/calibrators/test_io.py tests/calibrators/test_base.py"
  [calibkit/methods/maccal/estimator.py]="tests/test_maccal.py tests/test_maccal_run.py tests/test_blindspots_maccal.py"
  [calibkit/methods/maccal/masking.py]="tests/test_maccal.py tests/test_blindspots_maccal.py"
  [calibkit/methods/maccal/stage2.py]="tests/test_maccal.py tests/test_maccal_run.py tests/test_blindspots_training.py tests/test_blindspots_maccal.py"
  [calibkit/report/data.py]="tests/test_report.py tests/test_blindspots_bench.py tests/test_blindspots_report.py"
  [calibkit/report/tables.py]="tests/test_report.py tests/test_blindspots_report.py"
  [calibkit/report/tuning.py]="tests/test_report.py tests/test_blindspots_report.py"
  [calibkit/report/build.py]="tests/test_report.py tests/test_blindspots_report.py"
  [calibkit/report/render.py]="tests/test_report.py tests/test_blindspots_report.py"
  [calibkit/report/figures.py]="tests/test_report.py tests/test_blindspots_report.py"
  [calibkit/losses/basic.py]="tests/test_losses.py tests/test_dense_losses.py tests/test_blindspots_losses.py"
  [calibkit/losses/fedlas.py]="tests/test_losses.py tests/test_dense_losses.py tests/test_blindspots_losses.py"
  [calibkit/losses/adafocal.py]="tests/test_losses.py tests/test_dense_losses.py tests/test_blindspots_losses.py tests/test_adafocal_binning.py"
  [calibkit/bench/twostage.py]="tests/test_blindspots_twostage.py"
  [calibkit/bench/presetfile.py]="tests/test_presets.py"
  [calibkit/bench/overrides.py]="tests/test_presets.py"
  [calibkit/data/tensors.py]="tests/test_own_data.py"
  [calibkit/data/ood_user.py]="tests/test_own_data.py"
  [calibkit/models/custom.py]="tests/test_own_data.py"
  [calibkit/train/steps.py]="tests/test_train.py tests/test_blindspots_training.py tests/test_segmentation_train.py tests/test_blindspots_steps.py"
  [calibkit/distributed.py]="tests/test_blindspots_fedlas_ddp.py tests/test_metrics.py tests/test_losses.py"
  [calibkit/methods/csm/annotate.py]="tests/test_csm.py tests/test_csm_store.py tests/test_blindspots_twostage.py tests/test_blindspots_annotate.py"
  [calibkit/methods/csm/generator.py]="tests/test_csm.py tests/test_csm_store.py tests/test_blindspots_csm_modules.py tests/test_blindspots_csm_generator.py"
  [calibkit/methods/csm/train_generator.py]="tests/test_csm_api.py tests/test_csm.py tests/test_blindspots_csm_train_generator.py"
  [calibkit/methods/maccal/run.py]="tests/test_maccal_run.py tests/test_blindspots_training.py tests/test_blindspots_maccal_run.py"
  [calibkit/losses/__init__.py]="tests/test_losses.py tests/test_blindspots_losses.py tests/test_blindspots_losses_registry.py"
  [calibkit/methods/csm/inputs.py]="tests/test_csm_api.py tests/test_blindspots_csm_modules.py"
  [calibkit/methods/csm/dataset.py]="tests/test_csm_store.py tests/test_csm_api.py tests/test_blindspots_csm_modules.py"
  [calibkit/methods/csm/sampler.py]="tests/test_csm.py tests/test_blindspots_csm_modules.py"
  [calibkit/methods/csm/generate.py]="tests/test_csm.py tests/test_csm_store.py tests/test_blindspots_csm_modules.py"
  [calibkit/functional/iou.py]="tests/test_metric_inputs.py tests/test_pixel_metrics.py tests/test_blindspots_functional.py"
  [calibkit/functional/pixels.py]="tests/test_dense_losses.py tests/test_blindspots_functional.py"
  [calibkit/functional/inputs.py]="tests/test_metric_inputs.py tests/test_pixel_metrics.py tests/test_blindspots_functional.py"
  # train/, bench/, data/ and integrations/ (the EXTENDED list below)
  [calibkit/train/__init__.py]="tests/test_train.py"
  [calibkit/train/schedule.py]="tests/test_train.py::test_learning_rate_schedules"
  [calibkit/train/keep.py]="tests/test_train_keep.py tests/test_train.py"
  [calibkit/train/dense.py]="tests/test_segmentation_train.py tests/test_blindspots_bench_evaluation.py tests/test_segmentation_e2e.py"
  [calibkit/train/loop.py]="tests/test_train.py tests/test_blindspots_fedlas_ddp.py tests/test_text_train.py tests/test_errors.py"
  [calibkit/bench/__init__.py]="tests/test_bench.py"
  [calibkit/bench/paths.py]="tests/test_blindspots_twostage.py"
  [calibkit/bench/preflight.py]="tests/test_package.py tests/test_bench.py"
  [calibkit/bench/space.py]="tests/test_tune.py"
  [calibkit/bench/progress.py]="tests/test_progress.py"
  [calibkit/bench/workers.py]="tests/test_bench_workers.py"
  [calibkit/bench/runner.py]="tests/test_bench.py tests/test_blindspots_bench.py tests/test_tune.py tests/test_bench_workers.py"
  [calibkit/bench/tune.py]="tests/test_tune.py tests/test_blindspots_report.py"
  [calibkit/bench/grid.py]="tests/test_bench.py tests/test_tune.py"
  [calibkit/data/__init__.py]="tests/test_data.py"
  [calibkit/data/svhn.py]="tests/test_data.py"
  [calibkit/data/digits.py]="tests/test_data.py"
  [calibkit/data/ood.py]="tests/test_data.py tests/test_text_train.py tests/test_blindspots_bench_evaluation.py"
  [calibkit/data/newsgroups.py]="tests/test_text_data.py"
  [calibkit/data/idx.py]="tests/test_data.py tests/test_segmentation_data.py"
  [calibkit/data/segmentation.py]="tests/test_segmentation_data.py tests/test_segmentation_train.py"
  [calibkit/data/cifar.py]="tests/test_data.py"
  [calibkit/data/textsets.py]="tests/test_text_data.py tests/test_text_train.py"
  [calibkit/data/tokenizer.py]="tests/test_text_data.py"
  [calibkit/data/debian.py]="tests/test_text_data.py tests/test_text_train.py"
  [calibkit/data/voc.py]="tests/test_segmentation_data.py"
  [calibkit/data/scenes.py]="tests/test_segmentation_data.py"
  [calibkit/data/inputs.py]="tests/test_train.py tests/test_segmentation_train.py tests/test_text_train.py tests/test_text_data.py tests/test_blindspots_steps.py"
  [calibkit/data/folders.py]="tests/test_data.py tests/test_cli.py"
  [calibkit/data/transforms.py]="tests/test_data.py tests/test_segmentation_data.py"
  [calibkit/data/bundle.py]="tests/test_data.py tests/test_segmentation_data.py"
  [calibkit/data/corruptions.py]="tests/test_corruptions.py"
  [calibkit/data/datasets.py]="tests/test_data.py tests/test_text_data.py tests/test_segmentation_data.py tests/test_cli.py"
  [calibkit/train/preempt.py]="tests/test_train_preempt.py"
  [calibkit/bench/collect.py]="tests/test_bench_results.py"
  [calibkit/bench/results.py]="tests/test_bench_results.py"
  [calibkit/bench/slurm.py]="tests/test_bench_slurm_plan.py tests/test_bench_slurm.py"
  [calibkit/bench/slurm_plan.py]="tests/test_bench_slurm_plan.py"
  [calibkit/integrations/__init__.py]="tests/test_integrations.py"
  [calibkit/integrations/huggingface.py]="tests/test_integrations.py"
  [calibkit/integrations/torchmetrics.py]="tests/test_integrations.py tests/test_cuda_metrics.py"
)
# the issue's core modules (functional/, losses, metrics, calibrators, methods/, bench/evaluation,
# report, store); the other entries of TESTS are measured on request
DEFAULT=(calibkit/methods/csm/store.py calibkit/bench/evaluation.py calibkit/calibrators/temperature.py
         calibkit/metrics.py calibkit/methods/csm/annotate.py calibkit/methods/maccal/masking.py
         calibkit/functional/metrics.py calibkit/methods/maccal/estimator.py
         calibkit/methods/maccal/stage2.py calibkit/functional/losses.py calibkit/store/base.py calibkit/store/sqlite.py calibkit/store/common.py
         calibkit/functional/binning.py calibkit/losses/basic.py
         calibkit/losses/fedlas.py calibkit/losses/adafocal.py
         calibkit/losses/__init__.py calibkit/methods/csm/sampler.py calibkit/methods/csm/inputs.py
         calibkit/methods/csm/dataset.py calibkit/methods/maccal/run.py calibkit/methods/csm/generate.py
         calibkit/methods/csm/generator.py calibkit/methods/csm/train_generator.py
         calibkit/functional/iou.py calibkit/functional/inputs.py calibkit/functional/pixels.py
         calibkit/functional/panel_device.py calibkit/functional/panel.py
         calibkit/functional/panel_types.py
         calibkit/report/data.py calibkit/report/tables.py calibkit/report/tuning.py
         calibkit/report/build.py calibkit/report/render.py calibkit/report/figures.py)
# every module of train/, bench/, data/ and integrations/ not in DEFAULT, smallest first
# (`benchmarks/mutation.sh extended`; docs/mutation.md says which of them have been measured)
EXTENDED=(calibkit/bench/paths.py calibkit/train/schedule.py calibkit/data/svhn.py calibkit/data/digits.py
          calibkit/train/keep.py calibkit/data/ood.py calibkit/integrations/huggingface.py
          calibkit/data/newsgroups.py calibkit/bench/preflight.py calibkit/bench/space.py
          calibkit/bench/progress.py calibkit/data/idx.py calibkit/integrations/torchmetrics.py
          calibkit/bench/workers.py calibkit/data/segmentation.py calibkit/data/cifar.py
          calibkit/data/textsets.py calibkit/data/tokenizer.py calibkit/data/voc.py calibkit/data/scenes.py
          calibkit/data/inputs.py calibkit/data/folders.py calibkit/data/transforms.py calibkit/train/dense.py
          calibkit/data/bundle.py calibkit/data/corruptions.py calibkit/data/datasets.py calibkit/bench/runner.py
          calibkit/bench/tune.py calibkit/data/debian.py calibkit/bench/grid.py calibkit/train/loop.py
          calibkit/train/preempt.py calibkit/bench/collect.py calibkit/bench/results.py
          calibkit/bench/slurm_plan.py calibkit/bench/slurm.py
          calibkit/train/__init__.py calibkit/bench/__init__.py calibkit/data/__init__.py
          calibkit/integrations/__init__.py)
MODULES=("$@")
[ ${#MODULES[@]} -eq 0 ] && MODULES=("${DEFAULT[@]}")
[ "${MODULES[*]}" = extended ] && MODULES=("${EXTENDED[@]}")

toml_list() { local out="" x; for x in "$@"; do out+="\"$x\", "; done; echo "[${out%, }]"; }

K=0; N=0; T0=$SECONDS
for mod in "${MODULES[@]}"; do
  t0=$SECONDS
  [ -n "${TESTS[$mod]+x}" ] || { echo "mutation.sh: error: no test selection for $mod" >&2; exit 1; }
  tests=()
  for t in ${TESTS[$mod]}; do [ -f "$ROOT/${t%%::*}" ] && tests+=("$t"); done  # a file or file::test
  box="$WORK/$(echo "$mod" | tr / _)"
  rm -rf "$box" && mkdir -p "$box"
  cp -r "$ROOT/calibkit" "$ROOT/tests" "$ROOT/benchmarks" "$ROOT/docs" "$box/"  # some tests load a benchmarks/ script or read docs/
  cat > "$box/pyproject.toml" <<TOML
[tool.mutmut]
source_paths = ["calibkit"]
also_copy = ["benchmarks", "docs"]
only_mutate = ["$mod"]
pytest_add_cli_args_test_selection = $(toml_list "${tests[@]}")
pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-m", "not slow"]
process_isolation = "fork"

[tool.pytest.ini_options]
markers = ["slow: tests of seconds to tens of seconds (end-to-end training, million-element fits), left out of mutation runs"]
TOML
  ( cd "$box" && "$MUTMUT" run --max-children "$CHILDREN" > run.log 2>&1 || true
    "$MUTMUT" export-cicd-stats >> run.log 2>&1
    "$MUTMUT" results > survivors.txt 2>&1 || true )
  read -r k n s nt to < <("$PY" - "$box/mutants/mutmut-cicd-stats.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
ran = sum(s[k] for k in ("killed", "survived", "timeout", "suspicious", "segfault", "skipped", "no_tests"))
# mutmut stops early when no selected test reaches the module: those mutants count as not reached.
print(s["killed"] + s["timeout"], s["total"], s["survived"] + s["suspicious"] + s["segfault"],
      s["no_tests"] + s["total"] - ran, s["timeout"])
PY
)
  echo "$mod: killed $k of $n (survived $s, no tests $nt, timeout $to) in $((SECONDS - t0)) s; survivors in $box/survivors.txt"
  K=$((K + k)); N=$((N + n))
done
echo "all modules: $((SECONDS - T0)) s with $CHILDREN workers"
echo "killed $K of $N mutants"
