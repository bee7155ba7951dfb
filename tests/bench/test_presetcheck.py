"""``calibkit preset check`` and the bench's preflight refuse the same values with the same line
(calibkit.bench.presetcheck.check_values), before anything is written; and a ``module:factory``
model is found in the working directory by the installed console script."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from calibkit.bench.preflight import check_bench
from calibkit.bench.presetcheck import check_preset
from calibkit.bench.presetfile import load_preset
from calibkit.calibrators.registry import CALIBRATORS

BASE = 'name = "t"\ndataset = "digits"\nmodel = "mlp"\nseeds = [0]\nmethods = ["ls", "maccal", "csm"]\nood = "none"\n'


def _preset(tmp_path, text: str):
    path = tmp_path / "p.toml"
    path.write_text(text)
    return load_preset(str(path)), str(path)


def _refused(tmp_path, text: str, error=ValueError) -> tuple[str, str]:
    """The line of ``preset check`` and that of the bench's preflight (which writes nothing)."""
    preset, path = _preset(tmp_path, text)
    with pytest.raises(error) as checked:
        check_preset(preset, source=path)
    out = tmp_path / "out"
    with pytest.raises(error) as bench:
        check_bench(preset, out)
    assert not out.exists()
    first, second = str(checked.value), str(bench.value)
    assert first.startswith(f"{path}: ") and second.startswith("preset t: ") and "\n" not in first
    assert first[len(path) + 2:] == second[len("preset t: "):]  # one rule, one line, both commands
    return first[len(path) + 2:], path


def test_the_base_preset_is_valid(tmp_path):
    preset, path = _preset(tmp_path, BASE)
    assert check_preset(preset, source=path).startswith(f"{path}: preset t is valid")


@pytest.mark.parametrize("change, message", [
    (("seeds = [0]", "seeds = []"), "seeds: give at least one seed"),
    (("seeds = [0]", "seeds = [-1]"), "seeds: every seed must be an integer >= 0, got -1"),
    (("seeds = [0]", "seeds = [0, 0]"), "seeds: repeated seed in [0, 0]"),
    (("", "n_boot = 0\n"), "n_boot: must be an integer >= 10 (bootstrap resamples; fewer give no interval), got 0"),
    (("", "robust_n = -1\n"), "robust_n: must be an integer >= 0 (test images corrupted; 0: all), got -1"),
    (("", "severities = [9]\n"), "severities: every severity must be one of 1, 2, 3, 4, 5, got 9"),
    (("", "num_threads = 0\n"), "num_threads: must be an integer >= 1 (leave it out for torch's default), got 0"),
    (("", "tune_seed = -3\n"), "tune_seed: must be an integer >= 0, got -3"),
    (("", "[csm]\nsharpness = -1.0\n"), "[csm] sharpness: must be a finite number in (0, inf), got -1.0"),
    (("", '[csm]\nencoder = "efficientnet"\n'), "[csm] encoder: expected one of classifier, efficientnet_lite0, "
     "got 'efficientnet' (nearest valid name: efficientnet_lite0)"),
    (("", "[maccal]\nr_min = 1.5\n"), "[maccal] r_min: must be a finite number in (0, 1], got 1.5"),
    (("", '[space.ls]\n"maccal.eta" = [1, 2]\n'),
     "[space.ls] 'maccal.eta': ls does not read maccal.* (read by: maccal); every candidate would train the same"),
    (("", '[space.ls]\n"train.mix_alpha" = [0.1, 0.2]\n'),
     "[space.ls] 'train.mix_alpha': ls does not read train.mix_alpha (read by: mixup, regmixup); every candidate "
     "would train the same"),
    (("", '[space.ls]\n"loss.alpha" = [-1.0, 2.0]\n'),
     "[space.ls] 'loss.alpha': every value must be a finite number in [0, 1), got -1.0"),
    (("", '[space.ls]\n"loss.alpha" = [0.1, nan]\n'),
     "[space.ls] 'loss.alpha': every value must be a finite number in [0, 1), got nan"),
    (("", '[space.maccal]\n"maccal.eta" = {values = [1, 2], default = 3}\n'),
     "[space.maccal] 'maccal.eta': the default must be one of the values [1.0, 2.0], got 3.0"),
    (("", '[space.maccal]\n"maccal.epochs" = [5, 10]\n'),
     "[space.maccal] 'maccal.epochs': value 5.0: epochs: must be an integer >= 1, got 5.0"),
    (("", '[space.csm]\n"csm.sharpness" = [1.0, 2.0]\n"train.csm_weight" = [0.0, 1.0]\n'),
     "[space.csm] 'train.csm_weight': value 0.0: csm_weight: must be > 0, got 0.0"),
    (("", 'modality = "text"\n'), "modality: digits holds images, so the modality is 'image', got 'text'"),
    (("", 'report_calibrators = ["temperature", "vectr"]\n'), "report_calibrators: unknown calibrator 'vectr' "
     f"(nearest valid name: vector); valid: {', '.join(CALIBRATORS)}"),
    (("", 'report_calibrators = ["vector"]\n'), "report_calibrators: a list of distinct calibrator names holding "
     "'temperature' (the report's reference calibrator), or left out for every calibrator; got ['vector']"),
    (("", 'report_calibrators = ["temperature", "temperature"]\n'), "report_calibrators: a list of distinct "
     "calibrator names holding 'temperature' (the report's reference calibrator), or left out for every "
     "calibrator; got ['temperature', 'temperature']"),
])
def test_each_bad_value_is_one_line_naming_file_key_and_rule(tmp_path, change, message):
    old, new = change
    if old:
        text = BASE.replace(old, new)
    else:  # a table goes after the top-level keys, a top-level key before them
        text = BASE + new if new.startswith("[") else new + BASE
    assert _refused(tmp_path, text)[0] == message



def test_a_tune_seed_among_the_seeds_is_warned_by_preset_check(tmp_path):
    preset, path = _preset(tmp_path, BASE + "tune_seed = 0\n")
    with pytest.warns(UserWarning) as seen:
        assert check_preset(preset, source=path).startswith(f"{path}: preset t is valid")
    assert [str(w.message) for w in seen] == [
        f"{path}: tune_seed 0 is also an evaluation seed of preset t (seeds 0): the selection sees the randomness "
        "of a run whose test numbers are reported; choose a seed outside them (the shipped presets tune on 100)"]


def test_paths_must_exist(tmp_path):
    message, _ = _refused(tmp_path, 'ood = "nowhere/ood"\n' + BASE.replace('ood = "none"\n', ""), FileNotFoundError)
    assert message == ("ood: no such folder or file 'nowhere/ood' (an OOD set is none, noise, digits, a data set "
                       "name, a folder of images or an .npz/.safetensors file)")
    folder = BASE.replace('"digits"', '"imagefolder"') + 'data_dir = "nowhere/data"\n'
    message, _ = _refused(tmp_path, folder, FileNotFoundError)
    assert message == "data_dir: no such folder 'nowhere/data'"
    arrays = BASE.replace('"digits"', '"tensors"') + 'data_dir = "nowhere.npz"\n'
    message, _ = _refused(tmp_path, arrays, FileNotFoundError)
    assert message == "data_dir: no such file 'nowhere.npz' (tensors reads one .npz or .safetensors file)"
    (tmp_path / "dir.npz").mkdir()  # it exists, as a folder: "no such file" would mislead
    message, _ = _refused(tmp_path, BASE.replace('"digits"', '"tensors"') + f'data_dir = "{tmp_path / "dir.npz"}"\n')
    assert message == f"data_dir: '{tmp_path / 'dir.npz'}' is a folder, not a file (tensors reads one .npz or " \
                      ".safetensors file)"
    (tmp_path / "afile").write_text("x")
    message, _ = _refused(tmp_path, folder.replace("nowhere/data", str(tmp_path / "afile")))
    assert message == f"data_dir: '{tmp_path / 'afile'}' is a file, not a folder (imagefolder reads a folder)"
    message, _ = _refused(tmp_path, BASE + '[csm]\nstore = "nowhere/set"\n', FileNotFoundError)
    assert message == "[csm] store: no such folder 'nowhere/set' (a generated set of `calibkit csm generate`)"
    preset, _ = _preset(tmp_path, BASE.replace('"digits"', '"imagefolder"'))
    with pytest.raises(FileNotFoundError, match="^--data-dir: no such folder 'gone'$"):  # the flag names itself
        check_bench(preset, tmp_path / "out", data_dir="gone")
    preset, _ = _preset(tmp_path, BASE.replace('"digits"', '"tensors"'))
    with pytest.raises(ValueError, match="^--data-dir: '.*dir.npz' is a folder, not a file \\(tensors reads one"):
        check_bench(preset, tmp_path / "out", data_dir=str(tmp_path / "dir.npz"))
    assert not (tmp_path / "out").exists()


def test_the_modality_of_a_tensors_file_is_read_from_its_header(tmp_path):
    import numpy as np

    np.savez(tmp_path / "tok.npz", x_train=np.zeros((4, 7), np.int64), y_train=np.zeros(4, np.int64))
    text = BASE.replace('"digits"', '"tensors"') + f'data_dir = "{tmp_path / "tok.npz"}"\nmodality = "features"\n'
    message, _ = _refused(tmp_path, text)
    assert message == "modality: tensors holds text, so the modality is 'text', got 'features'"


def test_the_modality_of_a_safetensors_file_is_read_from_its_header(tmp_path):
    np = pytest.importorskip("numpy")
    st = pytest.importorskip("safetensors.numpy")

    st.save_file({"x_train": np.zeros((4, 8, 8), np.uint8), "y_train": np.zeros(4, np.int64)},
                 tmp_path / "i.safetensors")
    text = BASE.replace('"digits"', '"tensors"') + f'data_dir = "{tmp_path / "i.safetensors"}"\nmodality = "text"\n'
    assert _refused(tmp_path, text)[0] == "modality: tensors holds images, so the modality is 'image', got 'text'"



def test_augmentation_on_features_is_refused_before_anything_is_written(tmp_path, capsys):
    import numpy as np

    from calibkit.cli import main

    np.savez(tmp_path / "f.npz", x_train=np.zeros((4, 5), np.float32), y_train=np.arange(4) % 2)
    text = BASE.replace('"digits"', '"tensors"') + f'data_dir = "{tmp_path / "f.npz"}"\n[train]\naugment = true\n'
    assert _refused(tmp_path, text)[0] == ("augment: random crop and flip apply to images only; tensors holds "
                                           "features, which are used as stored: leave --augment out (augment = false)")
    argv = ["bench", "--preset", "smoke", "--data", "tensors", "--data-dir", str(tmp_path / "f.npz"), "--augment",
            "--out", str(tmp_path / "out")]
    assert main(argv) == 1
    assert capsys.readouterr().err == ("calibkit bench: error: preset smoke+data=tensors,augment=on: augment: random "
                                       "crop and flip apply to images only; tensors holds features, which are used "
                                       "as stored: leave --augment out (augment = false)\n")
    assert not (tmp_path / "out").exists()


def test_flag_seeds_are_named_as_flags(tmp_path):
    preset, _ = _preset(tmp_path, BASE)
    with pytest.raises(ValueError, match=r"^--seeds: repeated seed in \[1, 1\]$"):
        check_bench(preset, tmp_path / "out", seeds=[1, 1])


# -- the installed console script ---------------------------------------------------------------
MODELS = '''
from torch import nn


class Net(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.LazyLinear(8))
        self.head = nn.Linear(8, num_classes)

    def forward_features(self, x):
        return self.body(x.float())

    def forward(self, x):
        return self.head(self.forward_features(x))


def good(num_classes, in_channels):
    return Net(num_classes)


def headless(num_classes, in_channels):
    return nn.Linear(3, num_classes)
'''


def _script() -> str:
    here = Path(sys.executable).parent / "calibkit"
    found = str(here) if here.is_file() else shutil.which("calibkit")
    if not found:
        pytest.skip("the calibkit console script is not installed")
    return found


def _run(args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([_script(), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_the_console_script_finds_a_model_module_in_the_working_directory(tmp_path):
    (tmp_path / "cwdmodels_ck.py").write_text(MODELS)
    (tmp_path / "exits_ck.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "raises_ck.py").write_text("raise RuntimeError('bad\\nmodule')\n")
    for name in ("good", "exits", "raises"):
        module = "cwdmodels_ck" if name == "good" else f"{name}_ck"
        (tmp_path / f"{name}.toml").write_text(BASE.replace('"mlp"', f'"{module}:good"'))
    res = _run(["preset", "check", "good.toml"], tmp_path)
    assert res.returncode == 0 and "preset t is valid" in res.stdout, res.stderr
    res = _run(["preset", "check", "exits.toml"], tmp_path)
    assert res.returncode == 1 and res.stderr == (
        "calibkit preset: error: exits.toml: model 'exits_ck:good': importing exits_ck called sys.exit(3); a model "
        "module must not exit when imported (guard script code with `if __name__ == \"__main__\":`)\n")
    res = _run(["preset", "check", "raises.toml"], tmp_path)
    assert res.returncode == 1 and res.stderr == ("calibkit preset: error: raises.toml: model 'raises_ck:good': "
                                                  "importing raises_ck failed (RuntimeError: bad module)\n")
    # the bench imports the factory, builds it on the data and checks the contract before it writes anything
    (tmp_path / "headless.toml").write_text(BASE.replace('"mlp"', '"cwdmodels_ck:headless"'))
    res = _run(["bench", "--preset", "headless.toml", "--methods", "ce", "--out", "out"], tmp_path)
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "model 'cwdmodels_ck:headless' misses calibkit's model contract: no forward_features(x) method" in res.stderr
    assert not (tmp_path / "out").exists()


def test_the_bench_command_refuses_a_bad_value_and_writes_nothing(tmp_path):
    (tmp_path / "p.toml").write_text("robust_n = -1\n" + BASE)
    res = _run(["bench", "--preset", "p.toml", "--out", "out"], tmp_path)
    assert res.returncode == 1 and res.stderr == ("calibkit bench: error: preset t: robust_n: must be an integer >= 0 "
                                                  "(test images corrupted; 0: all), got -1\n")
    assert not (tmp_path / "out").exists()


def test_a_validation_split_too_small_to_separate_typical_differences_is_warned(tmp_path):
    import math
    import warnings

    from calibkit.bench.presetpower import detectable_nll

    # by hand: (1.959964 + 0.841621) x 0.12 / sqrt(500) = 0.015035; rows for 0.01: (0.336190 / 0.01)^2 = 1130.24
    assert detectable_nll(500) == pytest.approx(2.801585 * 0.12 / math.sqrt(500), rel=1e-6)
    preset, path = _preset(tmp_path, BASE + "[train]\nval_size = 500\n")
    with pytest.warns(UserWarning) as seen:
        check_preset(preset, source=path)
    assert [str(w.message) for w in seen] == [
        f"{path}: val_size 500: the validation split detects NLL differences of about 0.015 or more (two-sided 5%, "
        "power 80%, per-row sd 0.12); typical differences between calibrators or methods are about 0.01: "
        "validation cannot separate them (too little data to tell). Use val_size >= 1131 for that, or rely on the "
        "report's confirmatory test-split comparisons."]
    preset, path = _preset(tmp_path, BASE + "[train]\nval_size = 2000\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_preset(preset, source=path)  # 0.0075 < 0.01: no warning


def test_a_preset_made_in_python_with_another_report_figures_is_refused():
    """A preset file's report_figures is checked when it is read; one made in Python, here."""
    from dataclasses import replace

    from calibkit.bench.grid import PRESETS
    from calibkit.bench.presetcheck import check_values
    from calibkit.errors import UserError

    for figures in ("all", "ce-and-chosen"):
        check_values(replace(PRESETS["smoke"], report_figures=figures), "preset smoke: ", methods=["ce"])
    with pytest.raises(UserError, match=r"^preset smoke: report_figures: one of all, ce-and-chosen, got 'some'$"):
        check_values(replace(PRESETS["smoke"], report_figures="some"), "preset smoke: ", methods=["ce"])
