"""Make the small lab fixture: `python trim_lab_case.py CASE_DIR OUT_DIR`.

Copies a real `teller lab run` case's logs and ground truth unchanged and keeps, from each rank's
trace, only the events alignment reads: step annotations and gloo ranges (`user_annotation`),
collective host ops (`c10d::…`, `record_param_comms`), metadata and the profiler span. The kept
events are byte-for-byte the recorded ones; the file header is kept whole.
"""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

import orjson

KEEP_CATEGORIES = {"user_annotation", "gpu_user_annotation", "Trace"}
KEEP_PREFIXES = ("c10d::", "record_param_comms")


def keep(event: dict) -> bool:
    return (
        event.get("ph") in ("M", "i")
        or event.get("cat") in KEEP_CATEGORIES
        or str(event.get("name", "")).startswith(KEEP_PREFIXES)
    )


def main(case: Path, out: Path) -> None:
    (out / "traces").mkdir(parents=True, exist_ok=True)
    for trace in sorted((case / "traces").glob("rank*.pt.trace.json.gz")):
        document = orjson.loads(gzip.decompress(trace.read_bytes()))
        document["traceEvents"] = [e for e in document["traceEvents"] if keep(e)]
        target = out / "traces" / trace.name.replace(".pt.trace", "")
        target.write_bytes(gzip.compress(orjson.dumps(document), mtime=0))
    for folder in ("logs", "ground_truth"):
        shutil.copytree(case / folder, out / folder, dirs_exist_ok=True)
    shutil.copy(case / "labels.json", out / "labels.json")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
