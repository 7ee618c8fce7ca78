"""`python -m teller`: the same command line as the `teller` script."""

from teller.cli import run

run()
