"""The package's shape: no import cycles, and no pipeline stage importing a later one.

Every `teller` import is read from the source (module level, inside functions and under
TYPE_CHECKING alike: a lazy import is still a dependency), so the check holds for code paths no
test happens to run. docs/architecture.md draws the same order.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: The pipeline's stages in the order the method runs them (docs/architecture.md); a stage may
#: import its own rank or lower. `common` holds vocabulary every stage shares.
STAGE_RANK = {
    "common": 0,
    "ingest": 1,
    "callchain": 2,
    "align": 3,
    "localize": 3,
    "slices": 4,
    "tpe": 5,
    "rca": 6,
    "report": 7,
    "analysis": 8,
}
COMMON = {"errors", "atomic", "heap", "faults", "labels", "layout"}
#: Beside the pipeline: they may import it, it never imports them.
BESIDE = {"collect", "lab", "eval", "watch", "cli", "__init__", "__main__"}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in (SRC / "teller").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module → the teller modules it imports (a `from pkg import name` counts as pkg.name
    where that is a module, else as pkg)."""

    def known(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in modules else ""

    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([node.module] if node.module else []))
                if base.startswith("teller"):
                    targets |= {known(f"{base}.{a.name}") or known(base) for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {known(a.name) for a in node.names if a.name.startswith("teller")}
        edges[name] = {t for t in targets if t and t != name}
    return edges


def _stage(module: str) -> str:
    top = module.split(".")[1] if "." in module else "__init__"
    return "common" if top in COMMON else top


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return _imports(_modules())


def test_no_import_cycles(edges: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_no_stage_imports_a_later_one(edges: dict[str, set[str]]) -> None:
    wrong = []
    for module, targets in sorted(edges.items()):
        stage = _stage(module)
        for target in sorted(targets):
            other = _stage(target)
            if stage in BESIDE or other == stage:
                continue
            if other in BESIDE or STAGE_RANK[other] > STAGE_RANK[stage]:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_every_module_has_a_stage(edges: dict[str, set[str]]) -> None:
    unplaced = sorted(m for m in edges if _stage(m) not in STAGE_RANK and _stage(m) not in BESIDE)
    assert unplaced == []
