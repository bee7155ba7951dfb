"""Preset files (calibkit.bench.presetfile), flags on top of a preset (calibkit.bench.overrides),
search spaces from a preset (Preset.space_for) and the effective preset in the report."""

import dataclasses

import pytest

from calibkit.bench.grid import BENCH_METHODS, PRESETS, Axis, Preset, default_ood, grid_methods
from calibkit.bench.overrides import scaled_milestones, with_flags
from calibkit.bench.presetfile import dump_preset, load_preset, parse_preset, read_effective, write_effective
from calibkit.bench.runner import train_config
from calibkit.bench.space import candidates, current_values

BASE = 'name = "mine"\ndataset = "imagefolder"\nmodel = "mlp"\nseeds = [0]\n'


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_shipped_preset_round_trips_with_the_same_run_configs(name):
    p = PRESETS[name]
    q = parse_preset(dump_preset(p), name)
    assert q == p
    assert dump_preset(q) == dump_preset(p)
    for m in grid_methods(p)[0]:  # the resolved run configs are identical field by field
        for seed in p.seeds:
            assert train_config(q, m, seed, csm_data="x").to_dict() == train_config(p, m, seed, csm_data="x").to_dict()
        assert current_values(q, m) == current_values(p, m) and candidates(m, q) == candidates(m, p)


def test_shipped_ood_defaults_unchanged_and_user_data_has_none():
    # Preset.ood now resolves from the data set; the shipped presets keep the sets they had
    assert {n: p.ood for n, p in PRESETS.items()} == {
        "smoke": "digits", "default": "digits", "full": "digits", "cifar10": "svhn", "cifar100": "svhn",
        "tinyimagenet": "svhn", "seg-smoke": "digits", "seg": "digits", "voc": "digits",
        "text-smoke": "debian-heldout", "text": "debian-heldout", "20newsgroups": "debian-heldout",
        "text-pretrained-smoke": "debian-heldout", "text-pretrained": "debian-heldout",
        "fmnist-pretrained": "digits", "fmnist-pretrained-full": "digits",
        "fmnist-pretrained-smoke": "none"}  # the smoke twin runs on digits itself
    assert default_ood("tensors") == default_ood("imagefolder") == "none" and default_ood("svhn") == "digits"
    assert parse_preset(BASE).ood == "none"
    assert parse_preset(BASE.replace("imagefolder", "fmnist")).ood == "digits"


def test_a_file_with_every_table():
    text = BASE.replace("seeds = [0]", "seeds = [3, 4]") + """
methods = ["ls", "mixup", "maccal"]
data_dir = "some/folder"
ood = "noise"
note = "mine"

[train]
epochs = 7
val_size = "none"
milestones = [3, 5]

[losses]
ls = "ls:alpha=0.2"

[train_by_method.mixup]
mix_alpha = 0.3

[maccal]
eta = 3.0

[space.ls]
"loss.alpha" = [0.1, 0.003, 0.05]

[space.maccal]
"maccal.eta" = {values = [1, 5], default = 5}
"""
    p = parse_preset(text, "f.toml")
    assert ((p.seeds, p.methods, p.data_dir, p.ood, p.note)
            == ((3, 4), ("ls", "mixup", "maccal"), "some/folder", "noise", "mine"))
    assert p.train == {"epochs": 7, "val_size": None, "milestones": [3, 5]}
    assert p.train_by_method == {"mixup": {"mix_alpha": 0.3}} and p.maccal == {"eta": 3.0}
    # sorted ascending; the published value of an address the method has is the method's own (LS: 0.05)
    assert p.space_for("ls") == {"loss.alpha": Axis((0.003, 0.05, 0.1), 0.05)}
    assert p.space_for("maccal") == {"maccal.eta": Axis((1.0, 5.0), 5.0)}
    assert p.space_for("mbls") is BENCH_METHODS["mbls"].space  # no entry: the method's own grid
    assert [c["loss.alpha"] for c in candidates("ls", p)] == [0.003, 0.05, 0.1]
    assert current_values(p, "ls") == {"loss.alpha": 0.2}
    assert parse_preset(dump_preset(p)) == p


def test_report_calibrators_read_written_and_typed():
    p = parse_preset(BASE + 'report_calibrators = ["temperature", "histogram"]\n')
    assert p.report_calibrators == ("temperature", "histogram")
    assert 'report_calibrators = ["temperature", "histogram"]' in dump_preset(p)
    assert parse_preset(dump_preset(p)) == p
    assert parse_preset(BASE).report_calibrators is None and "report_calibrators" not in dump_preset(parse_preset(BASE))
    with pytest.raises(ValueError, match=r"report_calibrators: expected a list of calibrator names, got \[1\]"):
        parse_preset(BASE + "report_calibrators = [1]\n")


def test_a_new_address_takes_the_middle_value_as_its_published_one():
    p = parse_preset(BASE + '[space.mbls]\n"loss.lam" = [0.4, 0.1, 0.2, 0.3]\n')
    assert p.space_for("mbls") == {"loss.lam": Axis((0.1, 0.2, 0.3, 0.4), 0.2)}  # (len-1)//2 = index 1
    # the method's own default (LS: 0.05) where the list does not hold it: the middle value too
    p = parse_preset(BASE + '[space.ls]\n"loss.alpha" = [0.1, 0.003, 0.01]\n')
    assert p.space_for("ls") == {"loss.alpha": Axis((0.003, 0.01, 0.1), 0.01)}


@pytest.mark.parametrize("extra, message", [
    ("seds = [0]\n", "unknown key 'seds' (nearest valid name: seeds)"),
    ("[trian]\nepochs = 1\n", "unknown table '[trian]' (nearest valid name: [train])"),
    ("[train]\nepoch = 1\n", "unknown TrainConfig field 'epoch' (nearest valid name: epochs)"),
    ("[train]\nloss = 'ls'\n", "'loss' is set per run; use [losses]"),
    ("[train]\nepochs = 'five'\n", "epochs: expected int"),
    ("methods = ['ce', 'mlbs']\n", "unknown method 'mlbs' (nearest valid name: mbls)"),
    ("[losses]\nlss = 'ls'\n", "unknown method 'lss' (nearest valid name: ls)"),
    ("[losses]\nls = 'ls:alhpa=0.1'\n", "unknown parameter of loss ls 'alhpa' (nearest valid name: alpha)"),
    ("[losses]\nls = 'lsx'\n", "unknown loss 'lsx'"),
    ("[maccal]\netta = 1.0\n", "unknown [maccal] keyword 'etta' (nearest valid name: eta)"),
    ("[csm]\nsharpnes = 1.0\n", "unknown [csm] setting 'sharpnes' (nearest valid name: sharpness)"),
    ("[space.ls]\n'loss.alhpa' = [0.1]\n", "unknown loss setting 'alhpa' (nearest valid name: alpha)"),
    ("[space.ls]\n'los.alpha' = [0.1]\n",
     "bad search-space address 'los.alpha'; expected <loss|train|maccal|csm>.<name> "
                                          "(nearest valid name: loss.alpha)"),
    ("[space.ls]\n'loss.alpha' = [0.1, 0.1]\n", "repeats a value"),
    ("[space.ls]\n'loss.alpha' = []\n", "non-empty list of numbers"),
    ("[space.maccal]\n'maccal.eeta' = [1]\n", "unknown maccal setting 'eeta' (nearest valid name: eta)"),
    ("[train_by_method.mixup]\nmix_alpa = 1.0\n",
     "unknown TrainConfig field 'mix_alpa' (nearest valid name: mix_alpha)"),
    ("seeds = [0, true]\n", "seeds: expected a list of integers"),
    ("modality = 'txt'\n", "unknown modality 'txt' (nearest valid name: text)"),
])
def test_one_clear_error_naming_the_bad_name(extra, message):
    text = BASE.replace("seeds = [0]\n", "") if extra.startswith("seeds = [0, ") else BASE
    with pytest.raises(ValueError) as err:
        parse_preset(text + extra, "f.toml")
    assert message in str(err.value) and str(err.value).startswith("f.toml")
    assert "\n" not in str(err.value)


def test_bad_names_and_syntax():
    with pytest.raises(ValueError, match="missing key.*model"):
        parse_preset('name = "a"\ndataset = "fmnist"\nseeds = [0]\n')
    for bad in ("a/b", ""):  # the file is named, as in every other preset-file error
        with pytest.raises(ValueError) as err:
            parse_preset(BASE.replace('"mine"', f'"{bad}"'), "f.toml")
        assert str(err.value) == (f"f.toml: preset name {bad!r}: use letters, digits and ._+=,- only (it names the "
                                  "run directories)")
    with pytest.raises(ValueError, match="f.toml: invalid TOML"):
        parse_preset("name = ", "f.toml")
    with pytest.raises(ValueError, match="unknown preset 'smoek' \\(nearest valid name: smoke\\)"):
        load_preset("smoek")
    with pytest.raises(FileNotFoundError, match="preset file nothere.toml not found"):
        load_preset("nothere.toml")


def test_flags_name_the_change_and_scale_explicit_milestones():
    p = PRESETS["cifar10"]  # 350 epochs, milestones as fractions (epochs 150 and 250)
    q = with_flags(p, epochs=35, lr=0.01)
    assert q.name == "cifar10+epochs=35,lr=0.01"
    assert q.train["milestones"] == p.train["milestones"] and q.train["epochs"] == 35 and q.train["lr"] == 0.01
    assert train_config(q, "ce", 0).milestones == [15, 25]  # floor(0.4286 * 35), floor(0.7143 * 35)
    assert train_config(p, "ce", 0).milestones == [150, 250]  # the shipped preset is not touched
    e = with_flags(dataclasses.replace(p, train={**p.train, "milestones": [150, 250]}), epochs=35)
    assert e.train["milestones"] == [15, 25]  # given in epochs: scaled as fractions of the old epochs
    assert scaled_milestones([150, 250], 350, 3) == [1, 2]  # round(1.29), round(2.14)
    assert scaled_milestones([150, 250], 350, 1) == []  # both would fall outside (0, 1)
    assert with_flags(p) is p and with_flags(p, lr=0.1) is p  # nothing changed: the same preset
    d = with_flags(PRESETS["default"], dataset="imagefolder", model="mymod:net", augment=True)
    assert d.name == "default+data=imagefolder,model=mymod-net,augment=on" and d.ood == "none"
    assert d.model == "mymod:net" and d.train["augment"] is True
    assert "milestones" not in d.train  # default milestones (50%/75% of the epochs) scale by themselves
    assert "train_subset" not in d.train and "val_size" not in d.train  # sized for Fashion-MNIST: dropped
    assert with_flags(PRESETS["default"], dataset="tensors", val_size=0.3).train["val_size"] == 0.3
    assert with_flags(PRESETS["default"], dataset="digits").train["train_subset"] == 10000
    assert with_flags(PRESETS["default"], dataset="imagefolder", ood="/x/my ood/").ood == "/x/my ood/"
    assert with_flags(PRESETS["default"], dataset="imagefolder", ood="/x/my_ood").name.endswith("ood=my_ood")
    assert with_flags(PRESETS["default"], epochs=3, name="quick").name == "quick"
    with pytest.raises(ValueError, match="give one with --name"):
        with_flags(PRESETS["default"], model="a" * 120 + ":f")


def test_the_effective_preset_is_recorded(tmp_path):
    p = dataclasses.replace(with_flags(PRESETS["smoke"], epochs=1), note="n")
    path = write_effective(p, tmp_path)
    assert path == tmp_path / "presets" / "smoke+epochs=1.toml" and read_effective(tmp_path, p.name) == p
    write_effective(dataclasses.replace(p, note="other"), tmp_path, overwrite=False)
    assert read_effective(tmp_path, p.name).note == "n"
    assert read_effective(tmp_path, "smoke") is None
    assert isinstance(load_preset(str(path)), Preset)


def test_hosts_recording_the_same_preset_at_once_do_not_collide(tmp_path):
    # Benches on two hosts sharing OUT write OUT/presets/<name>.toml together; one fixed temporary
    # name let one writer move the other's file away ("No such file or directory").
    import threading

    p, errors = PRESETS["smoke"], []

    def write():
        try:
            for _ in range(60):
                write_effective(p, tmp_path)
        except OSError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and read_effective(tmp_path, "smoke") == p
    assert [f.name for f in (tmp_path / "presets").iterdir()] == ["smoke.toml"]  # no temporary file left
    assert (tmp_path / "presets" / "smoke.toml").stat().st_mode & 0o777 == 0o644


def test_the_extra_workers_build_the_same_preset(tmp_path):
    from calibkit.cli import build_parser
    from calibkit.commands import bench as bench_cmd
    from calibkit.commands.presetargs import preset_from_args, spec_from_args
    from calibkit.pipeline.executor import worker_argv

    parser = build_parser()
    args = parser.parse_args(["bench", "--preset", "cifar10", "--epochs", "35", "--no-augment", "--val-size", "0.2",
                              "--lr", "0.0125", "--data", "imagefolder", "--ood", "my ood", "--out", str(tmp_path),
                              "--workers", "2"])
    mine = preset_from_args(args)
    assert mine.name == "cifar10+data=imagefolder,epochs=35,lr=0.0125,val_size=0.2,augment=off,ood=my-ood"
    spec = spec_from_args(args, "bench", lambda: bench_cmd.options_from_args(args))
    spec.write()
    again = parser.parse_args(worker_argv(spec))
    assert again.await_start and spec_from_args(again, "bench", None).load() == mine


def test_a_changed_preset_under_a_recorded_name_is_refused(tmp_path):
    from calibkit.bench.presetfile import check_recorded

    p = PRESETS["smoke"]
    check_recorded(p, tmp_path)  # nothing recorded: nothing to compare
    write_effective(p, tmp_path)
    check_recorded(dataclasses.replace(p, note="other", seeds=(0, 1, 2), losses={"ls": "ls:alpha=0.2"}), tmp_path)
    changed = with_flags(p, epochs=3, name="smoke")
    with pytest.raises(ValueError, match=r"smoke.toml: the runs of preset smoke here were made with other settings "
                                         r"\(train.epochs 2 -> 3\); choose another --out"):
        check_recorded(changed, tmp_path)
    with pytest.raises(ValueError, match=r"ood 'digits' -> 'noise'"):
        check_recorded(dataclasses.replace(p, ood="noise"), tmp_path)


def test_report_figures_read_written_and_refused():
    p = parse_preset(BASE + 'report_figures = "ce-and-chosen"\n')
    assert p.report_figures == "ce-and-chosen"
    assert 'report_figures = "ce-and-chosen"' in dump_preset(p) and parse_preset(dump_preset(p)) == p
    # the default, "all", is left out of the file (every preset's file but smoke's is unchanged)
    assert parse_preset(BASE).report_figures == "all" and "report_figures" not in dump_preset(parse_preset(BASE))
    assert 'report_figures = "ce-and-chosen"' in dump_preset(PRESETS["smoke"])
    with pytest.raises(ValueError, match=r"unknown report_figures value 'ce-and-chosn' \(nearest valid name: "
                                         r"ce-and-chosen\); valid: all, ce-and-chosen"):
        parse_preset(BASE + 'report_figures = "ce-and-chosn"\n')
