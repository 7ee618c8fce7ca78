"""Copy a process's stdout/stderr to where they were going and to a timestamped log file.

Stand-alone on purpose (standard library only, no `teller` import): the collector's agent runs it as
`python -S -E _teller_collect_tee.py LOG IN_FD:OUT_FD ...` from inside the target's interpreter,
which may not have teller installed, and the runner imports it for the launcher's own stream.

Log format (also documented for readers in `teller.collect.logs`): every line the process wrote
becomes one log line, ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (UTC, microseconds, 27 bytes), one space,
then the line's bytes exactly as written, newline included. The timestamp is the wall-clock time
the line's first byte was read from the pipe.
"""

from __future__ import annotations

import os
import selectors
import signal
import sys
import time

#: A line longer than this is cut into several log lines so memory stays bounded.
MAX_LINE_BYTES = 1 << 20
_READ_BYTES = 1 << 16


def timestamp_prefix(wall_ns: int) -> bytes:
    """`2026-11-30T08:13:37.123456Z ` for a unix-ns wall-clock reading."""
    seconds, rest_ns = divmod(wall_ns, 1_000_000_000)
    parts = time.gmtime(seconds)
    return b"%04d-%02d-%02dT%02d:%02d:%02d.%06dZ " % (
        parts.tm_year,
        parts.tm_mon,
        parts.tm_mday,
        parts.tm_hour,
        parts.tm_min,
        parts.tm_sec,
        rest_ns // 1000,
    )


def _write_all(fd: int, data: bytes) -> bool:
    """Write everything; False once the reader has gone (the console closed), so we stop trying."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return False
        view = view[written:]
    return True


def tee(sources: list[tuple[int, int | None]], log_path: str) -> None:
    """Read every `(in_fd, out_fd)` pair until EOF, forwarding raw bytes and logging lines.

    Bytes are forwarded as soon as they arrive (progress bars keep working); lines are logged
    when complete, and an unterminated last line is logged with a newline added.
    """
    selector = selectors.DefaultSelector()
    pending: dict[int, tuple[int, bytearray]] = {}
    forward: dict[int, int | None] = {}
    for in_fd, out_fd in sources:
        selector.register(in_fd, selectors.EVENT_READ)
        pending[in_fd] = (0, bytearray())
        forward[in_fd] = out_fd
    with open(log_path, "ab", buffering=0) as log:
        while selector.get_map():
            for key, _ in selector.select():
                fd = key.fd
                try:
                    data = os.read(fd, _READ_BYTES)
                except InterruptedError:
                    continue
                except OSError:
                    data = b""
                now_ns = time.time_ns()
                first_ns, buffer = pending[fd]
                if not data:
                    if buffer:
                        log.write(timestamp_prefix(first_ns) + bytes(buffer) + b"\n")
                    selector.unregister(fd)
                    os.close(fd)
                    continue
                out_fd = forward[fd]
                if out_fd is not None and not _write_all(out_fd, data):
                    forward[fd] = None
                out = bytearray()
                start = 0
                while True:
                    end = data.find(b"\n", start)
                    if end < 0:
                        break
                    stamp_ns = first_ns if buffer else now_ns
                    out += timestamp_prefix(stamp_ns) + buffer + data[start : end + 1]
                    buffer.clear()
                    start = end + 1
                if start < len(data):
                    if not buffer:
                        first_ns = now_ns
                    buffer += data[start:]
                    if len(buffer) >= MAX_LINE_BYTES:
                        out += timestamp_prefix(first_ns) + buffer + b"\n"
                        buffer.clear()
                pending[fd] = (first_ns, buffer)
                if out:
                    log.write(bytes(out))


def main(argv: list[str]) -> int:
    """`LOG IN_FD:OUT_FD ...`; survives the Ctrl-C / SIGTERM sent to its group so no tail is lost."""
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN)
    log_path, *pairs = argv
    sources: list[tuple[int, int | None]] = []
    for pair in pairs:
        in_fd, out_fd = pair.split(":")
        sources.append((int(in_fd), int(out_fd) if out_fd != "-" else None))
    tee(sources, log_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
