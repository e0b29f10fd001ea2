"""Every bullet of the README's command-line section names the tests that check it, and those tests exist.

The section's behaviour is checked by those tests; this keeps the README and them from drifting apart.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION = re.search(r"^## The command line\n(.*?)^## ", (ROOT / "README.md").read_text(encoding="utf-8"), re.S | re.M)


def bullets() -> list[str]:
    return re.findall(r"^- (.*?)(?=^- |\Z)", SECTION.group(1), flags=re.S | re.M)


def defined_tests() -> set[str]:
    names = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names |= {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    return names


def test_the_section_has_bullets() -> None:
    assert len(bullets()) >= 8


@pytest.mark.parametrize("bullet", bullets(), ids=lambda text: re.sub(r"\W+", "-", text[:40]).strip("-").lower())
def test_each_bullet_names_tests_that_exist(bullet: str) -> None:
    named = re.search(r"<!-- tests: (.*?) -->", bullet, flags=re.S)
    assert named, f"this bullet names no tests: {bullet[:80]!r}"
    names = [name.strip() for name in named.group(1).split(",")]
    missing = sorted(set(names) - defined_tests())
    assert names, f"this bullet's test list is empty: {bullet[:80]!r}"
    assert not missing, f"tests named in the README that do not exist: {missing}"
