"""The runtime's import rules, read from the source (every import, lazy ones inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path

import hne_edge

PACKAGE = Path(hne_edge.__file__).parent


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import statement in ``path``."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            found += [(node.lineno, f"{name}.{a.name}" if node.module is None else name) for a in node.names]
    return found


def test_the_scan_sees_relative_and_lazy_imports():
    src = PACKAGE / "runtime" / "backends" / "tensorrt.py"
    names = {m for _, m in imported_modules(src)}
    assert {"hne_edge.tensorrt_compat", "hne_edge.runtime.backends.cuda", "hne_edge.bundle"} <= names


def test_the_runtime_never_imports_the_exporters():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
        for path in sorted((PACKAGE / "runtime").rglob("*.py"))
        for line, module in imported_modules(path)
        if module == "hne_edge.exporters" or module.startswith("hne_edge.exporters.")
    ]
    assert not offenders, "the runtime must not import the exporters: " + "; ".join(offenders)


def test_tensorrt_compat_imports_neither_torch_nor_tensorrt_at_module_level():
    body = ast.parse((PACKAGE / "tensorrt_compat.py").read_text()).body  # top-level statements only
    top = {a.name.split(".")[0] for n in body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in body if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    assert top <= {"__future__", "os", "re", "subprocess", "typing"}, top  # the standard library only
