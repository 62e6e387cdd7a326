"""The code's shape, read from the source: files a reader can hold (at most 800 lines), a package and benchmarks/
without import circles, and each plan name spelled in one module (issue 28 §5: one home for the bundle's vocabulary)."""

from __future__ import annotations

import ast
from pathlib import Path

import hne_edge
from hne_edge.bundle import PLAN_GROUPS, PLAN_TABLE

REPO = Path(hne_edge.__file__).resolve().parents[1]
PACKAGE = REPO / "hne_edge"
BENCHMARKS = REPO / "benchmarks"
MAX_LINES = 800
VOCABULARY = "hne_edge.bundle.vocabulary"  # the one home of the plan names


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _top_level(body: list[ast.stmt]):
    """The statements that run when the module is imported: the top level, into if/try/with blocks, but not
    ``if TYPE_CHECKING:`` (never run) nor function bodies (lazy imports, run when called)."""
    for node in body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _top_level(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            if isinstance(node, (ast.If, ast.Try, ast.With, ast.ExceptHandler)) or field == "handlers":
                for child in getattr(node, field, []):
                    yield from _top_level(child.body if isinstance(child, ast.ExceptHandler) else [child])


def module_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The hne_edge modules ``name`` imports at module level (``from . import x`` of a submodule: that submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _top_level(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source)
    resolved = set()
    for target in found:
        while target and target not in known:  # hne_edge.bundle.read_manifest -> hne_edge.bundle
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_python_file_is_longer_than_800_lines():
    files = [p for folder in ("hne_edge", "benchmarks", "examples", "tests") for p in sorted((REPO / folder).rglob("*.py"))]
    assert len(files) > 100 and any(p.parent == BENCHMARKS for p in files)  # the scan sees the checkout, benchmarks/ too
    long = {str(p.relative_to(REPO)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split them along their seams): {long}"


def test_the_package_has_no_import_cycle():
    known = modules()
    graph = {name: module_imports(name, path, set(known)) for name, path in known.items()}
    assert "hne_edge.bundle.schema" in graph["hne_edge.bundle.reading"]  # the scan sees relative imports
    assert "hne_edge.train.evaluation" in graph["hne_edge.train.engine"]
    assert "hne_edge.runtime.profiler" in graph["hne_edge.runtime.runner"]  # `from . import profiler`
    assert "hne_edge.train.engine" not in graph["hne_edge.cli.train"]  # lazy imports inside functions are not module-level
    cycles = import_cycles(graph)
    assert not cycles, f"modules that import each other at module level (move what both need into a third): {cycles}"


def script_imports(folder: Path) -> dict[str, set[str]]:
    """benchmarks/: script -> the sibling scripts it imports (``from bench_gpu import ...``, found by name: each runs
    with its own folder first on ``sys.path``), lazy imports inside functions included - a script that another imports
    is its library either way, and two scripts that are each other's library are one tool cut in two."""
    known = {p.stem for p in folder.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
        graph[path.stem] = (found & known) - {path.stem}
    return graph


def test_benchmarks_have_no_import_cycle(tmp_path):
    graph = script_imports(BENCHMARKS)
    assert "acceptance_stages" in graph["gpu_acceptance"] and "bench_gpu" in graph["bench_kernels"]  # the scan sees them
    cycles = import_cycles(graph)
    assert not cycles, f"benchmark scripts that import each other (move what both need into harness.py): {cycles}"
    (tmp_path / "a.py").write_text("def f():\n    from b import g\n")
    (tmp_path / "b.py").write_text("import a\nimport numpy\n")
    assert import_cycles(script_imports(tmp_path)) == [["a", "b"]]  # a lazy import closes a circle too


def test_the_cycle_finder_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def _key_positions(tree: ast.AST) -> set[int]:
    """ids of the string constants that are JSON keys, not plan names: a dict display's keys, a subscript's index,
    and the key sets handed to the manifest's strict reader (``_take(data, where, {...})``)."""
    keys: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys |= {id(k) for k in node.keys if k is not None}
        elif isinstance(node, ast.Subscript):
            keys.add(id(node.slice))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_take":
            keys |= {id(e) for arg in node.args if isinstance(arg, ast.Set) for e in arg.elts}
    return keys


def plan_literals(path: Path) -> dict[str, list[int]]:
    """Plan name -> the lines where ``path`` spells it as a string literal (prose that mentions one is not)."""
    names = set(PLAN_TABLE) | set(PLAN_GROUPS)
    tree = ast.parse(path.read_text(), str(path))
    keys = _key_positions(tree)
    found: dict[str, list[int]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in keys:
            found.setdefault(node.value, []).append(node.lineno)
    return found


def test_each_plan_name_is_spelled_in_one_module():
    """Every other module names a plan through the vocabulary's constants (``SEGMENTS``, ``MIXED``, ...) or
    derives its list from ``PLAN_TABLE``; a second spelling is a second list to keep in step."""
    homes: dict[str, dict[str, list[int]]] = {}
    for name, path in modules().items():
        for plan, lines in plan_literals(path).items():
            homes.setdefault(plan, {})[name] = lines
    assert set(homes) == set(PLAN_TABLE) | set(PLAN_GROUPS), homes  # the scan sees the vocabulary
    elsewhere = {plan: {m: lines for m, lines in where.items() if m != VOCABULARY} for plan, where in homes.items()}
    elsewhere = {plan: where for plan, where in elsewhere.items() if where}
    assert not elsewhere, f"plan names spelled outside {VOCABULARY} (use its constants): {elsewhere}"
    assert all(len(homes[plan][VOCABULARY]) == 1 for plan in homes), homes[VOCABULARY] if VOCABULARY in homes else homes


def test_the_plan_scan_tells_a_plan_from_a_key(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('d = {"nodes": 1}\nd["nodes"]\n_take(d, "x", {"nodes", "leaf"})\nif plan == "mixed": pass\n'
                      '"""plan "segments" in prose"""\nx = ("fused", "both")\n')  # fmt: skip
    assert plan_literals(source) == {"mixed": [4], "fused": [6], "both": [6]}


def test_no_source_file_is_ignored_by_git():
    """A module git ignores never reaches a clone: the bundle package was once ignored by a `bundle/` line meant for
    an exported bundle, so its commit deleted bundle.py and added nothing (caught only by a clean clone's CI)."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout (an installed package or a source archive): nothing for git to ignore")
    sources = [str(p.relative_to(REPO)) for p in sorted(PACKAGE.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    proc = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, input="\n".join(sources),
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr  # 1: none ignored
    assert proc.stdout.split() == [], f"git ignores these package files: {proc.stdout.split()}"


ROOT_ENTRIES = {".ci", ".gitignore", "BENCHMARKS.md", "CHANGELOG.md", "Makefile", "README.md", "RESULTS.md", "benchmarks",
                "constraints.txt", "docs", "examples", "hne_edge", "pyproject.toml", "tests"}  # fmt: skip


def test_the_repository_root_holds_only_the_project_files():
    """A session's scratch output once reached main (a `train` log at the root, committed with a fix): what a clone
    holds at its root is this list; a new top-level file is added here on purpose, not by `git add -A`."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout (an installed package or a source archive): no tracked files to read")
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    unexpected = sorted({line.split("/")[0] for line in tracked.splitlines()} - ROOT_ENTRIES)
    assert unexpected == [], f"files at the repository root that are not the project's: {unexpected}"
