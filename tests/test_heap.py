"""The command line's process gives freed arrays back to the system (`teller.heap`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from teller.heap import give_freed_arrays_back

#: Arrays of 1 to 24 MiB made and dropped in mixed order, a few smaller ones kept among them:
#: what a stage of the analysis does. Prints the MiB the process still holds beyond the kept.
CHURN = """
import sys
import numpy as np
from teller.heap import give_freed_arrays_back

def rss_mib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024

if sys.argv[1] == "fixed":
    give_freed_arrays_back()
rng = np.random.default_rng(0)
first = np.ones(4 << 20)  # a 32 MiB array freed: glibc's threshold would rise to its size
del first
before = rss_mib()
kept, live = [], []
for i in range(300):
    live.append(np.ones(int(rng.integers(1 << 17, 3 << 20))))
    if i % 7 == 0:
        kept.append(np.ones(int(rng.integers(1 << 15, 1 << 17))))
    if len(live) > 20:
        live.pop(int(rng.integers(0, len(live))))
live.clear()
print(rss_mib() - before - sum(array.nbytes for array in kept) / 2**20)
"""


@pytest.mark.skipif(not give_freed_arrays_back(), reason="no glibc mallopt on this system")
def test_freed_arrays_go_back_once_the_threshold_is_fixed() -> None:
    held = float(
        subprocess.run(
            [sys.executable, "-c", CHURN, "fixed"], capture_output=True, text=True, check=True
        ).stdout
    )
    # with glibc's own rising threshold this churn leaves most of its freed arrays held
    assert held < 32
