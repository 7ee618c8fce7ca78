"""Trees deeper than Python's recursion limit: the readers, the tree builder and the HTML
report's tree walk handle thousands of nested frames (hostile or real: deep Python stacks)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from teller.callchain.tree import build_tree
from teller.ingest import read_trace
from teller.ingest.schema import LAYERS
from teller.report.html import _tree_html, _visible_children

DEPTH = 3000


def nested_trace(path: Path, category: str) -> Path:
    """One root operator over DEPTH nested frames of `category`, then one kernel launch."""
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "root",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 2 * DEPTH + 10,
        }
    ]
    for level in range(1, DEPTH + 1):
        events.append(
            {
                "ph": "X",
                "cat": category,
                "name": f"frame{level}",
                "pid": 1,
                "tid": 1,
                "ts": level,
                "dur": 2 * (DEPTH - level) + 8,
            }
        )
    events.append(
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 1,
            "ts": DEPTH + 1,
            "dur": 2,
        }
    )
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_python_frames_deeper_than_the_recursion_limit_fold_away(tmp_path: Path) -> None:
    tree = build_tree(read_trace(nested_trace(tmp_path / "rank0.json", "python_function")))
    root = int(tree.roots()[0])
    (visible,) = _visible_children(tree, root, path=set())
    assert tree.node_name(visible) == "aten::mm"


def test_the_html_tree_of_thousands_of_nested_operators_renders(tmp_path: Path) -> None:
    tree = build_tree(read_trace(nested_trace(tmp_path / "rank0.json", "cpu_op")))
    root = int(tree.roots()[0])
    chain = [root]
    while len(children := tree.children(chain[-1])):
        chain.append(int(children[0]))
    assert len(chain) == DEPTH + 2
    assert tree.layer[chain[-1]] == LAYERS.index("cpu_op")
    no_evidence = SimpleNamespace(evidence=[])
    html = _tree_html(tree, root, set(chain), chain[-1], no_evidence)
    assert html.count("<details") == DEPTH + 1 and "aten::mm" in html
