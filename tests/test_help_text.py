"""Every command's ``--help``: each option says what it does, and says its default once."""

from __future__ import annotations

import argparse

from parsearch.cli import build_parser


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def test_every_option_of_every_command_has_help():
    """Each option says what it does; one whose choices are listed (``--format``) may let
    them speak, but a bare flag (``scaling --weak``) may not."""
    missing = [
        f"{name} {'/'.join(action.option_strings)}"
        for name, parser in _subcommands().items()
        for action in parser._actions
        if action.option_strings and not action.help and not action.choices
    ]
    assert not missing, missing


def test_no_help_text_states_its_default_twice():
    doubled = [
        f"{name} {'/'.join(action.option_strings)}: {action.help}"
        for name, parser in _subcommands().items()
        for action in parser._actions
        if action.help and action.help.count("(default") > 1
    ]
    assert not doubled, doubled
