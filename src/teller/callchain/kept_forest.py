"""A file's built forest kept on disk between the two passes over a run's files.

A run's files are needed twice: once for every file's steps, which tell the engines apart
(`split.file_steps`), and again to build each engine's tree, or the whole run's
(`teller.analysis`). Parsing a rank file is most of that reading, and the forest it is built
into is a few plain arrays, so the first pass writes each forest to disk and the second loads
it instead of parsing the file again.

The arrays go to an Arrow IPC file compressed with zstd (much smaller than the `.json.gz`, and
read back far faster than it parses), and what is not an array to JSON beside it: nothing of it
is ever unpickled, and it is only read from the temporary directory this process made.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from teller.callchain.tree import CommRoots, FileForest, RankForest
from teller.ingest.schema import SourceInfo

#: The forest's per-node arrays (`RankForest`), one column each.
NODE_COLUMNS = (
    "row",
    "parent",
    "edge",
    "layer",
    "name",
    "rank",
    "pid",
    "tid",
    "stream",
    "start",
    "dur",
)
_NODES, _COMM, _FACTS = "nodes.arrow", "comm.arrow", "facts.json"


def keep_forest(kept: FileForest, directory: Path) -> Path:
    """`kept` written under `directory` (which exists), in a folder of its own; its path."""
    folder = Path(tempfile.mkdtemp(prefix="forest-", dir=directory))
    forest = kept.forest
    _write(folder / _NODES, pa.table({c: getattr(forest, c) for c in NODE_COLUMNS}))
    comm = forest.comm
    _write(
        folder / _COMM,
        pa.table(
            {
                "node": comm.node,
                "kind": pa.array(comm.kind, pa.string()),
                "group": pa.array(comm.group, pa.string()),
                "seq": comm.seq,
                "bytes": comm.bytes,
            }
        ),
    )
    facts = {
        "path": str(kept.path),
        "names": forest.names,
        "table_rows": forest.table_rows,
        "overlaps": forest.overlaps,
        "unlaunched": forest.unlaunched,
        "sources": [source.to_json() for source in kept.sources],
        "traced_pids": sorted(kept.traced_pids),
        "span": None if kept.span is None else list(kept.span),
    }
    (folder / _FACTS).write_text(json.dumps(facts))
    return folder


def load_forest(folder: Path) -> FileForest:
    """The forest `keep_forest` wrote to `folder`, as the file's own reading built it."""
    nodes = _read(folder / _NODES)
    comm = _read(folder / _COMM)
    facts = json.loads((folder / _FACTS).read_text())
    forest = RankForest(
        **{c: _array(nodes, c) for c in NODE_COLUMNS},
        names=facts["names"],
        table_rows=facts["table_rows"],
        overlaps=facts["overlaps"],
        unlaunched=facts["unlaunched"],
        comm=CommRoots(
            node=_array(comm, "node"),
            kind=comm.column("kind").to_pylist(),
            group=comm.column("group").to_pylist(),
            seq=_array(comm, "seq"),
            bytes=_array(comm, "bytes"),
        ),
    )
    span = facts["span"]
    return FileForest(
        path=Path(facts["path"]),
        forest=forest,
        sources=[SourceInfo(**source) for source in facts["sources"]],
        traced_pids=frozenset(facts["traced_pids"]),
        span=None if span is None else (int(span[0]), int(span[1])),
    )


def _write(path: Path, table: pa.Table) -> None:
    options = ipc.IpcWriteOptions(compression="zstd")
    with (
        pa.OSFile(str(path), "wb") as sink,
        ipc.new_file(sink, table.schema, options=options) as out,
    ):
        out.write_table(table)


def _read(path: Path) -> pa.Table:
    """The file's table, decompressed into malloc'd buffers: Arrow's own pool would keep them
    once freed, and the analysing process would hold every forest twice (`teller.heap`)."""
    with pa.memory_map(str(path)) as source:
        return ipc.open_file(source, memory_pool=pa.system_memory_pool()).read_all()


def _array(table: pa.Table, column: str) -> np.ndarray:
    """A writable copy: the joining code may sort or shift the arrays it is given."""
    return np.array(table.column(column).to_numpy(), copy=True)
