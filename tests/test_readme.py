"""The README is what newcomers follow: its commands exist and its CLI reference is current."""

from __future__ import annotations

import re

from conftest import REPO


def test_readme_shows_the_two_commands_and_ci_runs_the_test_one():
    readme = (REPO / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (REPO / ".ci" / "run").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_cli_reference_is_generated_from_click():
    from hne_edge.cli.reference import README, render

    text = README.read_text()
    assert render(text) == text, "README's CLI reference is stale: run python -m hne_edge.cli.reference --write"


def test_every_command_is_listed_with_a_description():
    from hne_edge.cli import COMMANDS

    expected = {"train", "eval", "info", "export", "verify", "inspect", "profile", "bench", "run", "demo", "doctor"}
    assert set(COMMANDS) == expected
    assert all(help_ for _, _, help_ in COMMANDS.values())
