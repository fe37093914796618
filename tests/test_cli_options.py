"""The command line as a user types it: global options anywhere, every choice explained, and one
error style whether the tool is `bbox` or a train/ script."""

from __future__ import annotations

import argparse

import pytest

from bbox_sae.cli import build_parser
from helpers.cli import assert_one_line_error, bbox
from helpers.repo import load_script

PARSER = build_parser()
SUBCOMMANDS = PARSER._subparsers._group_actions[0].choices


def minimal_args(command: str) -> list[str]:
    """The fewest words each subcommand parses with."""
    if command == "findings":
        return [command, "runs/x"]
    return [command, *(["planted"] if command == "eval" else []), "-c", "x.yaml"]


def all_actions(parser: argparse.ArgumentParser, where: str = "bbox"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from all_actions(sub, f"{where} {name}")
        else:
            yield where, action


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_verbose_is_accepted_before_or_after_the_subcommand(command):
    args = minimal_args(command)
    assert build_parser().parse_args(args).verbose is False
    for placed in (["-v", *args], [*args, "-v"], [args[0], "--verbose", *args[1:]]):
        assert build_parser().parse_args(placed).verbose is True, placed


def test_every_choice_is_named_and_explained_in_its_help():
    with_choices = [(where, a) for where, a in all_actions(PARSER) if a.choices]
    assert {(where, a.dest) for where, a in with_choices} >= {("bbox eval", "what"), ("bbox features", "baseline"), ("bbox run", "force")}
    for where, action in with_choices:
        for choice in action.choices:
            assert action.help and str(choice) in action.help, (where, action.dest, choice)
    # Each subcommand is a choice too: each has its help line.
    assert all(PARSER._subparsers._group_actions[0]._choices_actions[i].help for i in range(len(SUBCOMMANDS)))


@pytest.mark.parametrize("script, command", [("train_sae", "train"), ("sweep", "sweep")])
def test_train_scripts_report_errors_as_bbox_does(tmp_path, capsys, script, command):
    main = load_script(f"train/{script}.py").main
    missing = str(tmp_path / "missing.yaml")
    capsys.readouterr()
    code, err = main(["-c", missing]), capsys.readouterr().err
    line = assert_one_line_error(code, err, missing, "config file not found")
    assert (code, err) == bbox(capsys, command, "-c", missing) and line.startswith("bbox: error: ")
    # A usage mistake: the same one line, naming the command, after its usage.
    errors = []
    for call in (lambda: main(["--bogus-only"]), lambda: bbox(capsys, command, "--bogus-only")):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            call()
        errors.append((exit_.value.code, capsys.readouterr().err))
    assert errors[0] == errors[1]
    # `bbox train` may take its config from --output-dir (a run made before); a sweep file is always named.
    mistake = "unrecognized arguments: --bogus-only" if command == "train" else f"{command}: the following arguments are required: --config/-c"
    assert_one_line_error(*errors[0], f"bbox: error: {mistake}")


def test_eval_help_sets_the_planted_only_options_apart():
    help_text = SUBCOMMANDS["eval"].format_help()
    common, planted = help_text.split("options:", 1)[1].split("eval planted only:", 1)  # after the usage line
    assert all(option in planted and option not in common for option in ("--rules", "--null-seeds", "--ablations"))
    assert "--config" in common and "--config" not in planted
