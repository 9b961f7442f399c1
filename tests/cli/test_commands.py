"""The subcommand registry: one ``Command`` per subcommand, one parser built from the list."""

from __future__ import annotations

import argparse
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
