"""Collection: run the target with the profiler injected from outside it (DESIGN.md §3).

`collect(command, out_dir)` is the whole API; `teller collect -- CMD` is the same from a shell.
Output layout: `traces/rank{R}.pt.trace.json.gz`, `logs/*.log` (format in `teller.collect.logs`),
`manifest.json` (format in `teller.collect.manifest`), and `procs/` (the agents' raw records).
"""

from teller.collect.runner import CollectError, CollectResult, collect, nsys_command

__all__ = ["CollectError", "CollectResult", "collect", "nsys_command"]
