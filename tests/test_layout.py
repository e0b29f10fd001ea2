"""The package's architecture: the library never imports the application, and no module imports itself back.

Every import counts, those inside functions included, since a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "src" / "multihead"
ENTRY_POINT = "multihead.__main__"  # `python -m multihead`: the command line's shim, part of the application


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str) -> set[str]:
    """The multihead modules ``name`` imports, anywhere in its code."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # `from multihead.torch import attention` is the package
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imports(name) for name in MODULES}


def is_application(name: str) -> bool:
    return name == "multihead.app" or name.startswith("multihead.app.") or name == ENTRY_POINT


@pytest.mark.parametrize("name", [name for name in MODULES if not is_application(name)])
def test_the_library_never_imports_the_application(name: str) -> None:
    assert not [target for target in GRAPH[name] if is_application(target)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk of ``graph`` meets, as ``[a, b, ..., a]``."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        for target in sorted(graph[name]):
            if target in path:
                found.append([*path[path.index(target) :], target])
            elif target not in done:
                visit(target, [*path, target])
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    return found


def test_there_are_no_import_cycles() -> None:
    assert not cycles(GRAPH), "\n".join(" -> ".join(cycle) for cycle in cycles(GRAPH))


def test_the_cycle_check_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_lazy_imports() -> None:
    """The check reads imports inside functions too (the application imports its trainers lazily)."""
    assert "multihead.app.train_torch" in GRAPH["multihead.app.training"]
    assert "multihead.keras.state" in GRAPH["multihead.io"]
