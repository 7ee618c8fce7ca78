"""Large arrays given back to the system when freed, for the command line's one long process.

glibc serves an allocation above its mmap threshold (128 KiB at start) with its own mapping,
which `free` unmaps. But each time such a block is freed, glibc raises the threshold to its size
(up to 32 MiB), so later arrays of that size come from the heap, and a freed block in the
middle of the heap stays with the process. An analysis builds and drops many arrays of a few to
tens of MiB per stage: on 8 ranks x 800 steps the analysing process held about 500 MB it had
freed after building the tree. Setting the threshold once (`mallopt(M_MMAP_THRESHOLD)`) keeps
it where it is, so every large array is its own mapping and goes back when freed.

`teller.cli.run` calls it, and so do the workers teller spawns to read rank files
(`teller.ingest.parallel`); a library imported into someone else's process leaves their
allocator alone. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes

#: glibc's `M_MMAP_THRESHOLD` parameter of `mallopt` (malloc.h).
M_MMAP_THRESHOLD = -3
#: Its value at start; setting it explicitly is what stops it from rising.
MMAP_THRESHOLD_BYTES = 128 * 1024


def give_freed_arrays_back() -> bool:
    """Fix glibc's mmap threshold; False where there is no glibc `mallopt` to call."""
    try:  # the process's own symbols: libc is loaded already, no library search needed
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
