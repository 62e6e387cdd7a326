"""The README and docs/ are what newcomers follow: their commands exist, their links resolve and the CLI
reference is current. (tests/test_quickstart.py runs the README's quickstart itself.)"""

from __future__ import annotations

import re

import pytest

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# [text](target) outside code; images too. External links (http:, mailto:) are not checked: no internet here.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def test_readme_shows_the_two_commands_and_ci_runs_the_test_one():
    readme = (REPO / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (REPO / ".ci" / "run").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_readme_is_a_front_door():
    # issue 20: a newcomer reads it in ten minutes; the rest lives in docs/
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in ("guide", "cli", "guarantees", "gpu", "architecture", "results"):
        assert f"(docs/{page}.md" in readme, f"README does not link docs/{page}.md"
    assert "source .venv/bin/activate" in readme  # hne-edge lives in .venv/bin, not on PATH
    assert "from hne_edge.runtime import AnytimeRunner, Agreement" in readme


def test_cli_reference_is_generated_from_click():
    from hne_edge.cli.reference import CLI_DOC, render

    text = CLI_DOC.read_text()
    assert render(text) == text, "docs/cli.md's CLI reference is stale: run python -m hne_edge.cli.reference --write"


def test_every_command_is_listed_with_a_description():
    from hne_edge.cli import COMMANDS

    expected = {"train", "eval", "info", "export", "verify", "inspect", "profile", "bench", "run", "bench-streams", "demo", "doctor"}
    assert set(COMMANDS) == expected
    assert all(help_ for _, _, help_ in COMMANDS.values())


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped (but - and _), spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc):
    text = FENCE.sub("", doc.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        if not resolved.exists():
            broken.append(f"{target} (no file {resolved})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading #{anchor} in {resolved.name})")
    assert not broken, f"{doc.relative_to(REPO)}: broken links: {broken}"


def test_every_test_the_guarantees_name_exists():
    """docs/guarantees.md backs its sentences with test names (`file.py::test_x`, `test_x`, `test_x_*`):
    each must be a test function in that file (or, without a file, in some test file)."""
    import fnmatch

    defined: dict[str, set[str]] = {}
    for path in (REPO / "tests").rglob("*.py"):
        defined[path.name] = set(re.findall(r"^def (test_\w+)", path.read_text(), re.M))
    named = re.findall(r"`(?:(\w+\.py)::)?(test_\w+\*?)`", (REPO / "docs" / "guarantees.md").read_text())
    assert len(named) >= 10
    for file, name in named:
        pool = defined.get(file, set()) if file else set().union(*defined.values())
        assert fnmatch.filter(pool, name), f"docs/guarantees.md names {file + '::' if file else ''}{name}: no such test"


def test_the_guide_says_what_every_stopped_by_of_a_stream_frame_means():
    """Issue 42: the guide listed `stopped_by: complete, deadline, cancelled, rejected` and was silent that "deadline"
    also means a frame answered early because no further step could end by its deadline or add anything
    (StreamResult's docstring, the home of the vocabulary; stream_policy.py item 6)."""
    from hne_edge.runtime.streams import StreamResult

    doc = " ".join(StreamResult.__doc__.split())
    meanings = dict(re.findall(r'"(\w+)" \(([^)]*)\)', doc.split("``stopped_by``:")[1].split("``met_deadline``")[0]))
    assert set(meanings) == {"complete", "deadline", "rejected"} and "or add anything" in meanings["deadline"], meanings
    guide = " ".join(FENCE.sub("", (REPO / "docs" / "guide.md").read_text()).split())
    said = guide[guide.index("why it stopped (`stopped_by`)"):][:900]
    for value in (*meanings, "cancelled"):
        assert f"`{value}`" in said, (value, said)
    assert "no further step of it can end by its deadline" in said and "its next step adds nothing" in said, said
