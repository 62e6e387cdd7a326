"""The README and docs/ are what newcomers follow: their commands exist, their links resolve and the CLI
reference is current. (tests/test_quickstart.py runs the README's quickstart itself.)"""

from __future__ import annotations

import re

import pytest

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PAGES = [REPO / name for name in ("BENCHMARKS.md", "RESULTS.md", "CHANGELOG.md")]  # the figures and their history
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


@pytest.mark.parametrize("doc", DOCS + PAGES, ids=lambda p: str(p.relative_to(REPO)))
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


# -- the figures' pages (issue 43): today's figures with how each was made, the history one link away ---------------


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of every section at any depth, code blocks kept."""
    parts = re.split(r"^(#+ .*)$", text, flags=re.M)
    return [(parts[k], parts[k + 1]) for k in range(1, len(parts) - 1, 2)]


@pytest.mark.parametrize("page", ["BENCHMARKS.md", "RESULTS.md"])
def test_every_table_says_its_command_machine_and_date(page):
    """A figure without the command, the machine and the date that made it cannot be rerun or weighed; each section
    holding a table says all three (``*Command:*``, ``*Machine:*``, ``*Date:*`` with a commit)."""
    bare = []
    for heading, body in sections((REPO / page).read_text()):
        if re.search(r"^\|[-|: ]+\|$", body, re.M):
            date = re.search(r"\*Date:\*[^·]*?\b20\d\d-\d\d-\d\d\b[^·]*?\b[0-9a-f]{7}\b", body)
            if not ("*Command:*" in body and "*Machine:*" in body and date):
                bare.append(heading)
    assert not bare, f"{page}: sections with a table but no *Command:* / *Machine:* / *Date:* (with a commit): {bare}"


def test_the_figures_pages_name_only_scripts_that_exist_and_link_their_history():
    """Today's pages run today's tools (a retired script lives in CHANGELOG.md, with the commit to get it back), and
    the history is one link away."""
    missing = {}
    for doc in [*DOCS, *PAGES[:2]]:
        for name in set(re.findall(r"benchmarks/(\w+\.py)\b", doc.read_text())):
            if not (REPO / "benchmarks" / name).is_file():
                missing.setdefault(doc.name, []).append(name)
    assert not missing, f"retired or unknown scripts named outside CHANGELOG.md (name them with their commit there): {missing}"
    for page in ("BENCHMARKS.md", "RESULTS.md"):
        assert "(CHANGELOG.md" in (REPO / page).read_text(), f"{page} does not link CHANGELOG.md"


def test_docs_results_holds_no_figures_of_its_own():
    """One home per figure: speed in BENCHMARKS.md, accuracy in RESULTS.md; docs/results.md says what ran where and
    what is open, and links to them."""
    text = (REPO / "docs" / "results.md").read_text()
    assert not re.search(r"^\|[-|: ]+\|$", text, re.M) and "```text" not in text, "docs/results.md holds a table"
    assert "(../BENCHMARKS.md" in text and "(../RESULTS.md" in text
