"""``serve``'s package keeps its shape: modules that fit in a sitting, no import cycle among them, typed jobs (no
``callable()`` dispatch, no queue of ``Any``), HTTP errors raised at the edge only, and the worker's side free of the
web framework."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import multihead.app.serve
from test_layout import GRAPH, cycles

PACKAGE = Path(multihead.app.serve.__file__).parent
MODULES = {path.stem: path for path in sorted(PACKAGE.glob("*.py"))}
NAME = "multihead.app.serve"
MAX_LINES = 400
ANY_QUEUE = re.compile(r"Queue\[\s*Any\s*\]")
EDGE = {"http", "parse", "limits", "metrics"}
"""The modules that speak HTTP: the event loop's."""


def source(name: str) -> str:
    return MODULES[name].read_text(encoding="utf-8")


def names_used(name: str) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(source(name))) if isinstance(node, ast.Name)}


def test_the_package_holds_its_threads_modules() -> None:
    assert {"http", "worker", "loader", "command", "routing", "jobs"} <= set(MODULES)


@pytest.mark.parametrize("name", list(MODULES))
def test_no_module_is_over_400_lines(name: str) -> None:
    assert len(source(name).splitlines()) <= MAX_LINES


@pytest.mark.parametrize("name", list(MODULES))
def test_jobs_are_typed(name: str) -> None:
    assert "callable" not in names_used(name)  # no callable() telling jobs apart
    assert not ANY_QUEUE.search(source(name))


def test_no_import_cycle_among_the_modules() -> None:
    graph = {
        module: {target for target in targets if target.startswith(f"{NAME}.")}
        for module, targets in GRAPH.items()
        if module.startswith(f"{NAME}.")
    }
    assert len(graph) == len(MODULES) - 1  # every module but the package's own __init__
    assert cycles(graph) == []
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]  # the check finds one


@pytest.mark.parametrize("name", sorted(set(MODULES) - EDGE - {"__init__"}))
def test_http_errors_are_raised_at_the_edge_only(name: str) -> None:
    assert "ApiError" not in names_used(name)
    assert "starlette" not in source(name)


def test_the_checks_find_what_they_look_for() -> None:
    assert "ApiError" in names_used("http")
    assert "starlette" in source("http")
    assert ANY_QUEUE.search("self.jobs: queue.Queue[Any] = queue.Queue()")
    assert "callable" in {node.id for node in ast.walk(ast.parse("callable(work)")) if isinstance(node, ast.Name)}
