"""Engine logs → one Arrow log table (DESIGN.md §3, input 2).

`read_logs(paths, year=None)` reads vLLM (V0/V1), SGLang, TensorRT-LLM iteration JSON, PyTorch's
NCCL watchdog and uvicorn lines, with or without `teller collect`'s time prefix, and mines templates
for everything else. Files and directories may be mixed; each file is read independently (a map),
and one template miner is shared so one line shape gets one template id across files. Columns are
documented in `teller.ingest.logs.table`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from teller.errors import TraceError
from teller.ingest.logs.detect import find_log_files, manifest_hosts
from teller.ingest.logs.reader import read_file
from teller.ingest.logs.table import (
    EVENTS,
    LOG_SCHEMA,
    LogRecord,
    LogSource,
    LogTable,
    concat_logs,
    request_key,
    request_keys,
    template_id,
)
from teller.ingest.logs.templates import Templates

__all__ = [
    "EVENTS",
    "LOG_SCHEMA",
    "LogRecord",
    "LogSource",
    "LogTable",
    "read_logs",
    "request_key",
    "template_id",
]


def read_logs(paths: Iterable[str | Path], year: int | None = None, host: str = "") -> LogTable:
    """Read every log file under `paths` into one table (file order within each file).

    `year` is for logs that print dates without one (vLLM); without it the year comes from the
    collector prefix, a dated line, or the file's modification time (which the warnings name).
    `host` names the machine that wrote them all; without it each file's host comes from a
    `teller collect` manifest that lists it, else from the lines (Ray's `ip=`), else "".
    """
    paths = list(paths)
    files, skipped = find_log_files(paths)
    if not files:
        shown = ", ".join(str(p) for p in paths) or "logs"
        raise TraceError(shown, "no log files found (looked for *.log, *.txt, *.out, *.err)")
    miner = Templates()
    hosts = {} if host else manifest_hosts(files)
    per_file = []
    for path in files:
        if not path.is_file():
            raise TraceError(path, "no such log file")
        file_host = host or hosts.get(path.resolve(), "")
        per_file.append((path, *read_file(path, miner, year=year, host=file_host)))
    tables = []
    for path, read, source in per_file:
        texts = read.columns.templates
        clusters = read.columns.cluster.tolist()
        resolved = [
            miner.template(cluster) if cluster >= 0 else text
            for text, cluster in zip(texts, clusters, strict=True)
        ]
        tables.append(LogTable(read.table(resolved, str(path)), [source]))
    logs = concat_logs(tables)
    if len(tables) > 1:  # an engine id in one file joins its API id printed in another
        keys = request_keys(logs.table.column("request_id"))
        index = logs.table.schema.get_field_index("request_key")
        logs.table = logs.table.set_column(index, "request_key", keys)
    for path in skipped:
        logs.sources[0].warnings.append(
            f"skipped {path}: `teller collect`'s console copy repeats the rank logs beside it "
            "(name it explicitly to read it)"
        )
    return logs
