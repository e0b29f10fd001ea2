"""The package's architecture: the library never imports the application, and no module imports itself back.

Every import counts, those inside functions included, since a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import re
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
    assert "multihead.keras.state" in GRAPH["multihead.io"]  # chosen when saving or loading a Keras layer


# --- one place for each rule ----------------------------------------------------------------------------------


def functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def front_end_checks(front_end: str) -> set[str]:
    """The functions and methods of a front end whose name says they check something."""
    return {
        node.name
        for path in sorted((PACKAGE / front_end).rglob("*.py"))
        for node in functions(path)
        if "check" in node.name
    }


def test_no_check_is_written_in_both_front_ends() -> None:
    """Argument checks live once, in framework-free modules (multihead.checks, validation, cache), over what each
    front end says of its tensors; a front end keeps only checks of its own framework's peculiarities."""
    assert front_end_checks("torch") & front_end_checks("keras") == set()


def test_the_front_end_check_search_finds_checks() -> None:
    assert "_check_backend" in front_end_checks("keras")  # which paths a Keras backend has


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines, its docstring left out."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


MAX_FUNCTION_LINES = 60


def test_every_function_fits_on_a_screen() -> None:
    long = [
        f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({body_lines(node)} lines)"
        for path in MODULES.values()
        for node in functions(path)
        if body_lines(node) > MAX_FUNCTION_LINES
    ]
    assert long == []


APPLICATION = PACKAGE / "app"


def test_only_the_run_module_names_the_run_format_files() -> None:
    # pretrained.py, families.py and hf_checkpoints.py read Hugging Face checkpoints, whose config.json is another
    # format of the same name.
    for path in sorted(APPLICATION.glob("*.py")):
        if path.name not in ("runs.py", "pretrained.py", "hf_checkpoints.py", "families.py"):
            text = path.read_text(encoding="utf-8")
            assert "trainer.json" not in text, path.name
            assert "config.json" not in text, path.name


def flag_definitions(path: Path, flags: set[str]) -> list[str]:
    """Where a module defines options rather than uses them: a flag given to ``add_argument`` or ``Option``, a flag
    in a list, tuple, set or dict display (a table of flags), or a text listing three flags or more, comma-separated
    (a list typed by hand)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        called = getattr(node.func, "attr", None) or getattr(node.func, "id", "") if isinstance(node, ast.Call) else ""
        if called in ("add_argument", "Option", "option"):
            found += [arg.value for arg in node.args if isinstance(arg, ast.Constant) and arg.value in flags]
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
            items = node.values if isinstance(node, ast.Dict) else node.elts
            found += [item.value for item in items if isinstance(item, ast.Constant) and item.value in flags]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for listing in re.findall(r"--[a-z-]+(?:, --[a-z-]+){2,}", node.value):
                listed = [flag for flag in listing.split(", ") if flag in flags]
                found += [listing] if len(listed) >= 3 else []
    return found


def test_training_flags_are_defined_only_in_the_options_table() -> None:
    """A flag of ``train`` alone (not also another command's) is defined in the options table only: the parser, the
    recipes, the resume refusals and their epilog all take it from there (messages may name it)."""
    from multihead.app.cli import build_parser

    (commands,) = [action for action in build_parser()._actions if action.dest == "command"]
    flags = {name: {flag for action in parser._actions for flag in action.option_strings}
             for name, parser in commands.choices.items()}  # fmt: skip
    train_only = flags["train"] - set().union(*(found for name, found in flags.items() if name != "train"))
    assert {"--d-model", "--joint-vocab", "--warmup"} <= train_only  # (--resume: translate --resume too)
    assert flag_definitions(APPLICATION / "options.py", train_only)  # the check finds the table
    for path in sorted(APPLICATION.glob("*.py")):
        if path.name != "options.py":
            assert flag_definitions(path, train_only) == [], path.name
