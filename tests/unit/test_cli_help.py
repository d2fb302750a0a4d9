"""Every `diode` command and option says what it is for in `--help`."""

import argparse

from diode import cli


def _undocumented(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """Each command, option and positional under `parser` that has no help text."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            helped = {choice.dest for choice in action._choices_actions if choice.help}
            for name, sub in action.choices.items():
                if name not in helped:
                    out.append(f"{path} {name}")
                out += _undocumented(sub, f"{path} {name}")
        elif not action.help or action.help == argparse.SUPPRESS:
            out.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return out


def test_every_command_option_and_positional_has_help():
    assert _undocumented(cli.build_parser(), "diode") == []
