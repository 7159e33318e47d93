"""`python -m gpujitter` is the console script."""

from gpujitter.cli import entry

entry()
