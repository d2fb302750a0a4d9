"""The options every `diode` command takes (`-v`) are taken before the command's name and after
it, anywhere among its own options, with the same meaning."""

import argparse
import logging

import pytest

from diode import cli


def _commands(parser: argparse.ArgumentParser, path: tuple = ()):
    """(names, parser) of every command and subcommand under `parser`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


def test_every_command_takes_verbose_after_its_name():
    parser = cli.build_parser()
    commands = list(_commands(parser))
    assert len(commands) >= len(cli.commands(parser))
    for names, sub in commands:
        verbose = [a for a in sub._actions if "-v" in a.option_strings]
        assert [a.option_strings for a in verbose] == [["-v", "--verbose"]], names
        # left out after the name, it keeps what was given before it
        assert verbose[0].default is argparse.SUPPRESS, names


@pytest.mark.parametrize("argv,verbose", [
    (["status", "--json"], False),
    (["-v", "status", "--json"], True),
    (["status", "-v", "--json"], True),
    (["status", "--json", "--verbose"], True),
    (["-v", "status", "--json", "-v"], True),
    (["verify", "--bootstrap", "localhost:9092", "-v", "--prefix", "high."], True),
    (["verify", "--bootstrap", "localhost:9092", "--prefix", "high."], False),
    (["check", "topology.yaml", "--side", "receiver", "-v"], True),
])
def test_verbose_means_the_same_before_and_after_the_command(argv, verbose):
    assert cli.build_parser().parse_args(argv).verbose is verbose


def test_verbose_after_the_command_turns_on_debug_logging(monkeypatch):
    levels = []
    monkeypatch.setattr(cli, "configure_logging", levels.append)
    assert cli.main(["docs", "-v"]) == 0
    assert cli.main(["docs"]) == 0
    assert levels == [logging.DEBUG, logging.INFO]
