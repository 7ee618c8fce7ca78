"""Every subcommand takes `-q`, and every option and argument of every subcommand says what it is
for in `--help`: the parser is walked, so a new option without help fails here."""

from __future__ import annotations

import argparse

from teller.cli import _parser


def _parsers(
    parser: argparse.ArgumentParser, name: str = "teller"
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found.extend(_parsers(sub, f"{name} {sub_name}"))
    return found


def _is_group(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def test_the_walk_finds_every_subcommand():
    names = {name for name, _ in _parsers(_parser())}
    assert {"teller analyze", "teller diff", "teller info", "teller lab sim"} <= names
    assert {"teller tpe stats", "teller lab run", "teller watch"} <= names


def test_every_option_has_help():
    missing = [
        f"{name}: {'/'.join(action.option_strings) or action.dest}"
        for name, parser in _parsers(_parser())
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
        and (not action.help or action.help == argparse.SUPPRESS)
    ]
    assert missing == []


def test_every_subcommand_takes_quiet():
    parsers = _parsers(_parser())
    lacking = [
        name
        for name, parser in parsers
        if not _is_group(parser)
        and not any("-q" in action.option_strings for action in parser._actions)
    ]
    assert lacking == []
    leaves = [name for name, parser in parsers if not _is_group(parser)]
    assert len(leaves) >= 15


def test_quiet_after_the_subcommand_is_quiet():
    args = _parser().parse_args(["info", "trace.json", "-q"])
    assert args.quiet is True
    assert _parser().parse_args(["-q", "info", "trace.json"]).quiet is True
    assert _parser().parse_args(["info", "trace.json"]).quiet is False
