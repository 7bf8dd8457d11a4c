"""Dispatch goes through the registries (popgrpo.registry): no module tests a kind by its name.

A comparison of anything called ``kind`` (``config.env.kind``, ``policy.kind``, a local
``kind``) with a string, or membership of it in strings, is a branch that a plugin's kind
never takes; the registered object (PolicyKind, EnvKind, StudyKind, a mutation's type) or a
registry trait answers instead.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "popgrpo"
ALLOWED = {"registry.py"}  # the registries' own module


def _named_kind(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "kind") or (
        isinstance(node, ast.Name) and node.id == "kind"
    )


def _strings(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_strings(e) for e in node.elts)
    return False


def kind_tests(source: str) -> list[int]:
    """Line numbers of ``<x>.kind == "name"`` (also ``!=``, ``in``, ``not in``, either side)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        if any(_named_kind(o) for o in operands) and any(_strings(o) for o in operands):
            lines.append(node.lineno)
    return lines


def test_the_rule_finds_a_kind_test_and_passes_others():
    assert kind_tests('if config.env.kind == "code":\n    pass\n') == [1]
    assert kind_tests('x = kind in ("text", "code")\n') == [1]
    assert kind_tests('if "svd" != mutation.kind:\n    pass\n') == [1]
    assert kind_tests('if tag == "score":\n    pass\nfor key, kind in pairs:\n    pass\n') == []


def test_no_module_dispatches_on_a_kind_name():
    found = {
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in PACKAGE.rglob("*.py")
        if path.name not in ALLOWED
        for line in kind_tests(path.read_text())
    }
    assert found == set()
