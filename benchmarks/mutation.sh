#!/usr/bin/env bash
# Mutation testing of calibkit's core modules with mutmut (a benchmark, not run in CI).
#
#   benchmarks/mutation.sh [MODULE...]      e.g. benchmarks/mutation.sh calibkit/store/base.py
#   benchmarks/mutation.sh extended         every module of train/, bench/, data/, integrations/
#   benchmarks/mutation.sh choosing         the modules where calibkit chooses (calibrator, method
#                                           pair, confirmatory verdict, tuning rule)
#
# Each module is mutated in its own sandbox (a copy of calibkit/ and tests/ under $MUTATION_DIR,
# default /tmp/calibkit-mutation) whose mutmut configuration names only that module and only the
# test files that exercise it; mutmut then runs, for each mutant, only the tests that call the
# mutated function. One worker per CPU core; MUTATION_CHILDREN overrides it.
# Prints one line per module and, last, `killed K of N mutants`, preceded by the same count over the
# choosing modules of the run (`choosing modules: killed K of N`) (K counts killed and timed-out
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

# the in-process tests of tests/bench/test_tune.py that train nothing (the tuner with Bench._train
# replaced by fixed validation logits, the search spaces, the selection rule); its seven others train
TUNE_INPROCESS="tests/bench/test_tune.py::test_tuner_arguments_methods_and_seed tests/bench/test_tune.py::test_tuner_trains_scores_selects_and_logs_each_candidate tests/bench/test_tune.py::test_val_metrics_of_a_missing_run_and_other_bins tests/bench/test_tune.py::test_a_failed_candidate_leaves_no_selection_and_says_so tests/bench/test_tune.py::test_run_one_trains_one_named_candidate tests/bench/test_tune.py::test_check_consistent_names_the_differing_settings tests/bench/test_tune.py::test_the_tuners_bench_trains_ce_on_the_selection_seed_with_its_settings tests/bench/test_tune.py::test_produce_hands_each_kind_its_view_seed_and_directory tests/bench/test_tune.py::test_wait_for_others_waits_while_another_process_trains_a_candidate_of_this_tuning tests/bench/test_tune.py::test_check_consistent_reads_this_tunings_rows_only tests/bench/test_tune.py::test_a_candidate_that_builds_on_ce_waits_while_another_process_trains_ce tests/bench/test_tune.py::test_search_space_is_a_valid_literal tests/bench/test_tune.py::test_mbls_and_fedlas_mbls_search_one_margin_grid_with_lambda_fixed tests/bench/test_tune.py::test_candidates_apply_values_and_current_values tests/bench/test_tune.py::test_every_preset_holds_one_checkpoint_policy tests/bench/test_tune.py::test_selection_is_the_argmin_among_accurate_candidates tests/bench/test_tune.py::test_ties_go_to_the_value_nearest_the_published_default tests/bench/test_tune.py::test_edge_detection tests/bench/test_tune.py::test_val_metrics_read_only_the_validation_tensors tests/bench/test_tune.py::test_bench_waits_for_a_needed_run_held_by_another_bench tests/bench/test_tune.py::test_default_preset_values_are_the_committed_selection"

# module -> the test files (or file::test node ids) that exercise it (space separated)
declare -A TESTS=(
  [calibkit/store/base.py]="tests/store/test_store.py tests/store/test_store_edges.py tests/store/test_store_backends.py"
  [calibkit/store/sqlite.py]="tests/store/test_store.py tests/store/test_store_edges.py tests/store/test_store_backends.py tests/store/test_store_paths.py"
  [calibkit/store/common.py]="tests/store/test_store.py tests/store/test_store_edges.py tests/store/test_store_backends.py"
  [calibkit/methods/csm/store.py]="tests/methods/csm/test_store.py tests/methods/csm/test_store_errors.py"
  [calibkit/bench/evaluation.py]="tests/bench/test_runner.py tests/bench/test_evaluation_numbers.py tests/bench/test_twostage.py tests/bench/test_evaluation.py"
  [calibkit/functional/binning.py]="tests/functional/test_metrics.py tests/test_metrics.py tests/functional/test_binning_device.py tests/test_metrics_inputs.py tests/functional/test_binning.py"
  [calibkit/functional/metrics.py]="tests/functional/test_metrics.py tests/test_metrics_inputs.py tests/functional/test_binning_device.py tests/test_metrics_accumulator.py"
  [calibkit/functional/panel.py]="tests/test_metrics_inputs.py tests/test_metrics_pixels.py tests/functional/test_metrics.py tests/functional/test_binning_device.py tests/functional/test_panel.py"
  [calibkit/functional/panel_device.py]="tests/test_metrics_inputs.py tests/test_metrics_pixels.py tests/functional/test_binning_device.py tests/functional/test_panel.py"
  [calibkit/functional/panel_types.py]="tests/functional/test_panel.py tests/test_metrics_inputs.py tests/functional/test_metrics.py"
  [calibkit/bootstrap.py]="tests/test_metrics.py tests/test_bootstrap.py"
  [calibkit/grouped_bootstrap.py]="tests/test_grouped_bootstrap.py tests/train/test_dense.py tests/test_bootstrap.py"
  [calibkit/functional/losses.py]="tests/functional/test_losses.py tests/losses/test_losses.py tests/losses/test_dense.py tests/functional/test_losses_edges.py"
  [calibkit/metrics.py]="tests/test_metrics.py tests/test_metrics_pixels.py tests/test_metrics_inputs.py tests/test_metrics_accumulator.py"
  [calibkit/calibrators/temperature.py]="tests/calibrators/test_calibrators.py tests/calibrators/test_calibrators_edges.py tests/calibrators/test_temperature.py"
  [calibkit/calibrators/_base.py]="tests/calibrators/test_base.py tests/calibrators/test_temperature.py"
  [calibkit/calibrators/scaling.py]="tests/calibrators/test_scaling.py tests/calibrators/test_base.py"
  [calibkit/calibrators/ets.py]="tests/calibrators/test_ets.py tests/calibrators/test_base.py"
  [calibkit/calibrators/binning.py]="tests/calibrators/test_binning.py tests/calibrators/test_base.py"
  [calibkit/calibrators/spline.py]="tests/calibrators/test_spline.py tests/calibrators/test_base.py"
  [calibkit/calibrators/io.py]="tests/calibrators/test_io.py tests/calibrators/test_base.py"
  [calibkit/methods/maccal/estimator.py]="tests/methods/maccal/test_maccal.py tests/methods/maccal/test_run.py tests/methods/maccal/test_maccal_edges.py"
  [calibkit/methods/maccal/masking.py]="tests/methods/maccal/test_maccal.py tests/methods/maccal/test_maccal_edges.py"
  [calibkit/methods/maccal/stage2.py]="tests/methods/maccal/test_maccal.py tests/methods/maccal/test_run.py tests/train/test_training_wiring.py tests/methods/maccal/test_maccal_edges.py"
  [calibkit/report/data.py]="tests/report/test_report.py tests/bench/test_evaluation_numbers.py tests/report/test_report_edges.py"
  [calibkit/report/tables.py]="tests/report/test_report.py tests/report/test_report_edges.py"
  [calibkit/report/tuning.py]="tests/report/test_report.py tests/report/test_report_edges.py"
  [calibkit/report/build.py]="tests/report/test_report.py tests/report/test_report_edges.py"
  [calibkit/report/render.py]="tests/report/test_report.py tests/report/test_report_edges.py"
  [calibkit/report/figures.py]="tests/report/test_report.py tests/report/test_report_edges.py"
  [calibkit/losses/basic.py]="tests/losses/test_losses.py tests/losses/test_dense.py tests/losses/test_losses_edges.py"
  [calibkit/losses/fedlas.py]="tests/losses/test_losses.py tests/losses/test_dense.py tests/losses/test_losses_edges.py"
  [calibkit/losses/adafocal.py]="tests/losses/test_losses.py tests/losses/test_dense.py tests/losses/test_losses_edges.py tests/losses/test_adafocal.py"
  [calibkit/bench/twostage.py]="tests/bench/test_twostage.py"
  [calibkit/bench/presetfile.py]="tests/bench/test_presetfile.py"
  [calibkit/bench/overrides.py]="tests/bench/test_presetfile.py"
  [calibkit/data/tensors.py]="tests/bench/test_own_data.py"
  [calibkit/data/ood_user.py]="tests/bench/test_own_data.py"
  [calibkit/models/custom.py]="tests/bench/test_own_data.py"
  [calibkit/train/steps.py]="tests/train/test_loop.py tests/train/test_training_wiring.py tests/train/test_dense.py tests/train/test_steps.py"
  [calibkit/distributed.py]="tests/test_distributed.py tests/train/test_loop.py::test_shards_cover_every_sample_once_and_gather_restores_order tests/train/test_loop.py::test_eval_batch_size_by_device_and_invariance tests/losses/test_fedlas_ddp.py tests/test_metrics.py tests/losses/test_losses.py"
  [calibkit/methods/csm/annotate.py]="tests/methods/csm/test_csm.py tests/methods/csm/test_store.py tests/bench/test_twostage.py tests/methods/csm/test_annotate.py"
  [calibkit/methods/csm/generator.py]="tests/methods/csm/test_csm.py tests/methods/csm/test_store.py tests/methods/csm/test_sampler_inputs_dataset.py tests/methods/csm/test_generator.py"
  [calibkit/methods/csm/train_generator.py]="tests/methods/csm/test_api.py tests/methods/csm/test_csm.py tests/methods/csm/test_train_generator.py"
  [calibkit/methods/maccal/run.py]="tests/methods/maccal/test_run.py tests/train/test_training_wiring.py tests/methods/maccal/test_run_edges.py"
  [calibkit/losses/__init__.py]="tests/losses/test_losses.py tests/losses/test_losses_edges.py tests/losses/test_registry.py"
  [calibkit/methods/csm/inputs.py]="tests/methods/csm/test_api.py tests/methods/csm/test_sampler_inputs_dataset.py"
  [calibkit/methods/csm/dataset.py]="tests/methods/csm/test_store.py tests/methods/csm/test_api.py tests/methods/csm/test_sampler_inputs_dataset.py"
  [calibkit/methods/csm/sampler.py]="tests/methods/csm/test_csm.py tests/methods/csm/test_sampler_inputs_dataset.py"
  [calibkit/methods/csm/generate.py]="tests/methods/csm/test_csm.py tests/methods/csm/test_store.py tests/methods/csm/test_sampler_inputs_dataset.py"
  [calibkit/functional/iou.py]="tests/test_metrics_inputs.py tests/test_metrics_pixels.py tests/functional/test_iou_pixels_inputs.py"
  [calibkit/functional/pixels.py]="tests/losses/test_dense.py tests/functional/test_iou_pixels_inputs.py"
  [calibkit/functional/inputs.py]="tests/test_metrics_inputs.py tests/test_metrics_pixels.py tests/functional/test_iou_pixels_inputs.py"
  # train/, bench/, data/ and integrations/ (the EXTENDED list below)
  [calibkit/train/__init__.py]="tests/train/test_loop.py"
  [calibkit/train/schedule.py]="tests/train/test_loop.py::test_learning_rate_schedules"
  [calibkit/train/keep.py]="tests/train/test_keep.py tests/train/test_loop.py"
  [calibkit/train/dense.py]="tests/train/test_dense.py tests/bench/test_evaluation.py tests/commands/test_segmentation_e2e.py"
  [calibkit/train/loop.py]="tests/train/test_loop_parts.py tests/train/test_loop.py tests/train/test_keep.py tests/train/test_preempt.py tests/losses/test_fedlas_ddp.py::test_train_drops_its_run_before_the_teardown tests/train/test_text.py::test_resumed_text_run_equals_uninterrupted tests/train/test_text.py::test_model_data_and_method_mismatches_are_refused tests/commands/test_errors.py::test_bad_input_gives_one_line_and_touches_nothing"
  [calibkit/bench/__init__.py]="tests/bench/test_runner.py"
  [calibkit/bench/paths.py]="tests/bench/test_paths.py tests/bench/test_twostage.py"
  [calibkit/bench/preflight.py]="tests/bench/test_preflight.py tests/commands/test_errors.py tests/bench/test_own_data.py tests/bench/test_extend.py tests/methods/maccal/test_run_edges.py"
  [calibkit/bench/space.py]="tests/bench/test_tune.py tests/bench/test_presetfile.py tests/bench/test_space.py"
  [calibkit/bench/progress.py]="tests/bench/test_progress.py"
  [calibkit/bench/workers.py]="tests/bench/test_workers.py"
  [calibkit/bench/runner.py]="tests/bench/test_runner_loop.py tests/bench/test_runner.py tests/bench/test_evaluation_numbers.py tests/bench/test_attempts.py $TUNE_INPROCESS"
  [calibkit/bench/tune.py]="$TUNE_INPROCESS tests/bench/test_extend.py::test_tune_extends_an_edge_twice_records_it_and_shows_it tests/bench/test_extend.py::test_tune_reports_an_axis_with_no_effect tests/report/test_report_edges.py"
  [calibkit/bench/grid.py]="tests/bench/test_grid.py tests/bench/test_presetfile.py tests/bench/test_extend.py::test_next_value_never_passes_a_bound tests/bench/test_extend.py::test_every_declared_axis_has_a_bound_its_grid_respects tests/bench/test_runner.py::test_every_preset_builds_every_run tests/bench/test_runner.py::test_grid_holds_every_method_of_the_issue tests/bench/test_runner.py::test_checkpoint_interval_is_a_runtime_setting_of_the_presets tests/bench/test_tune.py::test_search_space_is_a_valid_literal tests/bench/test_tune.py::test_default_preset_values_are_the_committed_selection"
  [calibkit/data/__init__.py]="tests/data/test_datasets.py"
  [calibkit/data/svhn.py]="tests/data/test_datasets.py"
  [calibkit/data/digits.py]="tests/data/test_datasets.py"
  [calibkit/data/ood.py]="tests/data/test_ood.py tests/data/test_datasets.py tests/train/test_text.py tests/bench/test_evaluation.py tests/bench/test_own_data.py::test_user_ood_sets"
  [calibkit/data/newsgroups.py]="tests/data/test_text.py"
  [calibkit/data/idx.py]="tests/data/test_datasets.py tests/data/test_segmentation.py"
  [calibkit/data/segmentation.py]="tests/data/test_segmentation.py tests/train/test_dense.py"
  [calibkit/data/cifar.py]="tests/data/test_cifar.py tests/data/test_datasets.py"
  [calibkit/data/textsets.py]="tests/data/test_textsets.py tests/data/test_text.py tests/train/test_text.py"
  [calibkit/data/tokenizer.py]="tests/data/test_text.py"
  [calibkit/data/debian.py]="tests/data/test_debian.py tests/data/test_text.py"
  [calibkit/data/voc.py]="tests/data/test_voc.py tests/data/test_segmentation.py"
  [calibkit/data/scenes.py]="tests/data/test_scenes.py tests/data/test_segmentation.py"
  [calibkit/data/inputs.py]="tests/data/test_inputs.py tests/train/test_dense.py tests/data/test_text.py tests/train/test_steps.py"
  [calibkit/data/folders.py]="tests/data/test_folders.py tests/data/test_datasets.py tests/test_cli.py"
  [calibkit/data/transforms.py]="tests/data/test_transforms.py tests/data/test_datasets.py tests/data/test_segmentation.py"
  [calibkit/data/bundle.py]="tests/data/test_bundle.py tests/data/test_datasets.py tests/data/test_segmentation.py"
  [calibkit/data/corruptions.py]="tests/data/test_corruptions.py"
  [calibkit/data/datasets.py]="tests/data/test_datasets.py tests/data/test_text.py tests/data/test_segmentation.py tests/test_cli.py"
  [calibkit/train/preempt.py]="tests/train/test_preempt.py"
  [calibkit/bench/collect.py]="tests/bench/test_results.py tests/bench/test_collect.py"
  [calibkit/bench/attempts.py]="tests/bench/test_attempts.py tests/store/test_store_backends.py"
  [calibkit/bench/results.py]="tests/bench/test_results.py tests/bench/test_collect.py tests/bench/test_slurm_plan.py"
  [calibkit/bench/slurm.py]="tests/bench/test_slurm_queue.py tests/bench/test_slurm_plan.py tests/bench/test_slurm.py"
  [calibkit/bench/slurm_plan.py]="tests/bench/test_slurm_plan.py"
  [calibkit/integrations/__init__.py]="tests/integrations/test_integrations.py"
  [calibkit/integrations/huggingface.py]="tests/integrations/test_integrations.py"
  [calibkit/integrations/torchmetrics.py]="tests/integrations/test_integrations.py tests/test_metrics_cuda.py tests/integrations/test_torchmetrics.py"
  # the choosing modules (CHOOSING below)
  [calibkit/calibrators/selection.py]="tests/calibrators/test_selection.py tests/calibrators/test_selection_pins.py tests/report/test_verdict_pins.py"
  [calibkit/calibrators/crossfit.py]="tests/calibrators/test_selection.py tests/calibrators/test_selection_pins.py"
  [calibkit/report/verdict.py]="tests/report/test_verdict.py tests/report/test_verdict_pins.py tests/report/test_confirm.py"
  [calibkit/report/confirm.py]="tests/report/test_confirm.py tests/report/test_verdict_pins.py"
  [calibkit/bench/selection_rule.py]="tests/bench/test_tune_rule.py tests/bench/test_selection_rule_pins.py"
)
# where calibkit chooses: their kill rate is reported on its own line as well
CHOOSING=(calibkit/bench/selection_rule.py calibkit/report/confirm.py calibkit/calibrators/selection.py
          calibkit/calibrators/crossfit.py calibkit/report/verdict.py)
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
          calibkit/bench/slurm_plan.py calibkit/bench/slurm.py calibkit/bench/attempts.py
          calibkit/train/__init__.py calibkit/bench/__init__.py calibkit/data/__init__.py
          calibkit/integrations/__init__.py)
MODULES=("$@")
[ ${#MODULES[@]} -eq 0 ] && MODULES=("${DEFAULT[@]}")
[ "${MODULES[*]}" = extended ] && MODULES=("${EXTENDED[@]}")
[ "${MODULES[*]}" = choosing ] && MODULES=("${CHOOSING[@]}")
is_choosing() { local c; for c in "${CHOOSING[@]}"; do [ "$c" = "$1" ] && return 0; done; return 1; }

toml_list() { local out="" x; for x in "$@"; do out+="\"$x\", "; done; echo "[${out%, }]"; }

K=0; N=0; CK=0; CN=0; T0=$SECONDS
for mod in "${MODULES[@]}"; do
  t0=$SECONDS
  [ -n "${TESTS[$mod]+x}" ] || { echo "mutation.sh: error: no test selection for $mod" >&2; exit 1; }
  tests=()
  for t in ${TESTS[$mod]}; do [ -f "$ROOT/${t%%::*}" ] && tests+=("$t"); done  # a file or file::test
  box="$WORK/$(echo "$mod" | tr / _)"
  rm -rf "$box" && mkdir -p "$box"
  cp -r "$ROOT/calibkit" "$ROOT/tests" "$ROOT/benchmarks" "$ROOT/docs" "$ROOT/tools" "$box/"  # some tests load a benchmarks/ or tools/ script or read docs/
  cat > "$box/pyproject.toml" <<TOML
[tool.mutmut]
source_paths = ["calibkit"]
also_copy = ["benchmarks", "docs", "tools"]
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
  if [ ! -f "$box/mutants/mutmut-cicd-stats.json" ]; then  # e.g. a package __init__ of imports only
    meta="$box/mutants/${mod}.meta"
    n=$("$PY" -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["exit_code_by_key"]))' "$meta" 2>/dev/null || echo "?")
    echo "$mod: no mutants run ($n generated: mutmut mutates function bodies only; see $box/run.log) in $((SECONDS - t0)) s"
    continue
  fi
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
  if is_choosing "$mod"; then CK=$((CK + k)); CN=$((CN + n)); fi
done
echo "all modules: $((SECONDS - T0)) s with $CHILDREN workers"
[ "$CN" -gt 0 ] && echo "choosing modules: killed $CK of $CN mutants"
echo "killed $K of $N mutants"
