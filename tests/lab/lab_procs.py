"""Process-tree helpers the lab's signal tests share: which processes a run started, and whether
one is still alive (a zombie counts as gone: its parent has not reaped it yet, but it runs
nothing)."""

from __future__ import annotations

from pathlib import Path


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def describe(pids: set[int]) -> str:
    """One line per live process: pid, state, kernel wait channel and command line, so a run
    that does not exit in time shows which of its processes is stuck, and where."""
    lines = []
    for pid in sorted(pids):
        proc = Path(f"/proc/{pid}")
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (proc / "wchan").read_text().strip() or "-"
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
        except OSError:
            continue
        lines.append(f"{pid} {state} {wchan} {command}")
    return "\n".join(lines) or "(none alive)"
