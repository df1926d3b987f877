"""The console script's target before the cli package (`nmt = nmt.entry:main`): an install made then
(`pip install -e .` not rerun after an update) still runs `nmt`, instead of failing with a traceback."""

from nmt.cli.entry import main

__all__ = ["main"]
