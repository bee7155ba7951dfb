"""Misspelt subcommands and options get the nearest valid name before argparse's own checks."""

import pytest

from calibkit.cli import build_parser, main
from calibkit.commands.typos import Typo, check_argv


@pytest.mark.parametrize("argv, line", [
    (["calibarte"], "calibkit: error: unknown command 'calibarte'; did you mean calibrate? (`calibkit --help` lists "
                    "them)"),
    (["calibrate", "--valid", "x"], "calibkit calibrate: error: unknown option --valid; did you mean --val? "
                                    "(`calibkit calibrate --help` lists the options)"),
    (["calibrate", "--val", "v.npz", "--tset=t.npz"], "calibkit calibrate: error: unknown option --tset; did you "
                                                      "mean --test? (`calibkit calibrate --help` lists the options)"),
    (["preset", "shwo", "smoke"], "calibkit preset: error: unknown action 'shwo'; did you mean show? (`calibkit "
                                  "preset --help` lists them)"),
    (["bench", "--preset", "smoke", "--epoks", "3"], "calibkit bench: error: unknown option --epoks; did you mean "
                                                     "--epochs? (`calibkit bench --help` lists the options)"),
])
def test_a_typo_is_one_line_with_the_nearest_name_and_exit_status_2(capsys, argv, line):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == line + "\n" and captured.out == ""


def test_nothing_close_lists_the_valid_commands(capsys):
    assert main(["xyzzy"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("calibkit: error: unknown command 'xyzzy'; valid: train, eval, plot, bench, ")


@pytest.mark.parametrize("argv", [
    ["calibrate", "--val", "a.npz", "--test", "b.npz"],
    ["calibrate", "--val=a.npz", "--calib", "temperature"],  # a prefix argparse resolves itself
    ["calibrate", "--from", "f.npz", "--save"],
    ["preset", "show", "smoke"],
    ["bench", "--preset", "smoke", "--out", "--looks-like-an-option", "--", "--anything"],
    ["--version"],
])
def test_valid_command_lines_pass_untouched(argv):
    if "--looks-like-an-option" in argv:  # a value starting with -- reads as an option, as argparse reads it
        with pytest.raises(Typo, match="unknown option --looks-like-an-option"):
            check_argv(build_parser(), argv)
        return
    check_argv(build_parser(), argv)


def test_an_option_value_with_a_space_is_a_value_as_argparse_reads_it(capsys):
    """``--sbatch-arg "--constraint=a100 x"``: argparse takes a token holding a space as a value, so the
    typo check does too (SLURM's own check then refuses the value, naming --sbatch-arg)."""
    from calibkit.cli import build_parser
    from calibkit.commands.typos import Typo, check_argv

    check_argv(build_parser(), ["bench", "--sbatch-arg", "--constraint=a100 x"])  # no Typo
    with pytest.raises(Typo, match="unknown option --constraint"):
        check_argv(build_parser(), ["bench", "--sbatch-arg", "--constraint=a100"])
