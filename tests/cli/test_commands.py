"""The subcommand registry: one ``Command`` per subcommand, one parser built from the list."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from rollout_trace._cli import main as cli
from rollout_trace._cli.command import Command

EXAMPLE = str(Path(__file__).parents[1] / "data" / "example")
# Arguments each subcommand accepts, so that only the wrong flag is wrong.
VALID = {
    "cost": [EXAMPLE],
    "summary": [EXAMPLE],
    "validate": [EXAMPLE],
    "timeline": [EXAMPLE, "-o", "t.html"],
    "report": [EXAMPLE],
    "attempts": [EXAMPLE, "-o", "a.csv"],
    "sql": [EXAMPLE, "select 1"],
    "watch": [EXAMPLE, "--once"],
    "demo": [],
}


def test_every_subcommand_is_in_the_registry_and_the_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert [c.name for c in cli.COMMANDS] == list(VALID)
    assert cli.main(["--help"]) == 0
    out = "".join(capsys.readouterr().out.split())  # however argparse wraps the lines
    for command in cli.COMMANDS:
        assert command.name + "".join(command.help.split()) in out


@pytest.mark.parametrize("name", list(VALID))
def test_a_wrong_flag_prints_the_usage_of_its_subcommand(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main([name, *VALID[name], "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: rollout-trace {name} ")
    assert f"rollout-trace {name}: error: unrecognized arguments: --bogus" in err
    assert list(tmp_path.iterdir()) == []  # nothing ran


def test_a_wrong_flag_before_the_subcommand_is_the_top_level_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--bogus", "cost", EXAMPLE]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: rollout-trace [-h]")
    assert "rollout-trace: error: unrecognized arguments: --bogus" in err


def test_a_subcommand_is_one_entry(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--status", type=int, default=0)

    echo = Command(
        name="echo",
        help="exit with a status",
        description="Exit with the status given.",
        epilog="examples:\n  rollout-trace echo --status 3\n",
        add_arguments=add_arguments,
        run=lambda args: int(args.status),
    )
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, echo))
    assert cli.main(["echo", "--status", "3"]) == 3
    assert cli.main(["echo", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: rollout-trace echo [-h] [--status STATUS]")
    assert "examples:\n  rollout-trace echo --status 3\n" in out  # laid out as written


# Each: the words, whose usage is printed, and the error it names.
WRONG_WORDS = [
    # An unknown flag before the paths, after them, and between two of them.
    (["cost", "--bogus", EXAMPLE], "cost", "unrecognized arguments: --bogus"),
    (["cost", EXAMPLE, "--bogus"], "cost", "unrecognized arguments: --bogus"),
    # (argparse cannot tell whether the path is the unknown flag's value.)
    (
        ["summary", EXAMPLE, "--bogus", EXAMPLE],
        "summary",
        f"unrecognized arguments: --bogus {EXAMPLE}",
    ),
    # An option without its value, at the end and before a path.
    (["timeline", EXAMPLE, "-o"], "timeline", "argument -o/--output: expected one argument"),
    (["timeline", "-o"], "timeline", "argument -o/--output: expected one argument"),
    # A flag of another subcommand.
    (["validate", "--json", EXAMPLE], "validate", "unrecognized arguments: --json"),
    (["validate", EXAMPLE, "--json"], "validate", "unrecognized arguments: --json"),
    # A value of the wrong type.
    (["demo", "--seed", "x"], "demo", "argument --seed: invalid int value: 'x'"),
    # The same unknown flag on both sides of the subcommand: the first one
    # is the top level's, and only it is charged there.
    (["--bogus", "cost", EXAMPLE, "--bogus"], None, "unrecognized arguments: --bogus"),
    # A subcommand that does not exist.
    (
        ["costs", EXAMPLE],
        None,
        "argument COMMAND: invalid choice: 'costs' (choose from 'cost', 'summary', 'validate', "
        "'timeline', 'report', 'attempts', 'sql', 'watch', 'demo')",
    ),
]


@pytest.mark.parametrize(("argv", "owner", "error"), WRONG_WORDS)
def test_wrong_words_print_the_usage_of_the_parser_they_were_given_to(
    argv: list[str],
    owner: str | None,
    error: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    prog = "rollout-trace" if owner is None else f"rollout-trace {owner}"
    usage, *_, last = captured.err.splitlines()
    assert usage.startswith(f"usage: {prog} ["), usage
    assert last == f"{prog}: error: {error}"
    assert list(tmp_path.iterdir()) == []  # nothing ran


def test_options_and_paths_mix_in_any_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    # An option between paths, as shells expand globs: both paths are read.
    assert cli.main(["summary", EXAMPLE, "--json", str(Path(EXAMPLE) / "*.jsonl")]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 2
    assert cli.main(["timeline", EXAMPLE, "-o", "t.html", EXAMPLE]) == 0
    assert (tmp_path / "t.html").is_file()
    # A file named like a flag, after `--`.
    shutil.copy(next(Path(EXAMPLE).glob("*.jsonl")), tmp_path / "--json")
    assert cli.main(["summary", "--json", "--", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 1
