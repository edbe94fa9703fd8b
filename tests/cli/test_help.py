"""The command line documents itself: ``help=`` on every command and subcommand,
``cosigner --version``, ``python -m cosigner --help``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import version

from cosigner.cli.main import COMMANDS, build_parser
from tests.conftest import ROOT


def _subcommands(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction]:  # type: ignore[type-arg]
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def test_every_command_and_subcommand_has_help() -> None:
    seen: list[str] = []

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in _subcommands(parser):
            for choice in action._choices_actions:
                assert choice.help, f"{prefix}{choice.dest} has no help"
                seen.append(prefix + choice.dest)
            for name, sub in action.choices.items():
                for arg in sub._actions:
                    if arg.option_strings and arg.dest != "help":
                        assert arg.help, f"{prefix}{name} {arg.option_strings} has no help"
                walk(sub, f"{prefix}{name} ")

    walk(build_parser(), "")
    assert set(COMMANDS) <= set(seen)
    assert {"principals", "keys", "policy", "audit"} <= set(seen)


def test_version_prints_the_package_version() -> None:
    done = subprocess.run([sys.executable, "-m", "cosigner", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"cosigner {version('cosigner')}"


def test_python_m_cosigner_help_lists_the_commands() -> None:
    done = subprocess.run([sys.executable, "-m", "cosigner", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for command in ("serve", "migrate", "principals", "keys", "policy", "audit", "demo"):
        assert command in done.stdout
    group = subprocess.run([sys.executable, "-m", "cosigner", "audit", "--help"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert group.returncode == 0 and "verify" in group.stdout
