"""No function in src/ is over 80 lines (a function that long holds several steps that want names)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 80


def long_functions(root: Path, limit: int = MAX_LINES) -> list[str]:
    """`path:line name length` of every def / async def (nested ones included) longer than `limit` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} {length}")
    return found


def test_no_function_in_src_is_over_80_lines() -> None:
    too_long = long_functions(SRC)
    assert not too_long, f"functions over {MAX_LINES} lines (split them into named steps):\n" + "\n".join(too_long)


def test_the_check_finds_a_long_nested_function(tmp_path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"def outer():\n    async def inner():\n{body}\n    return inner\n")
    assert long_functions(tmp_path) == [f"m.py:1 outer {MAX_LINES + 3}", f"m.py:2 inner {MAX_LINES + 1}"]
