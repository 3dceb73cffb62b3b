"""`python -m orchestrator`: the `tidemark` command line.

May import: app.
"""

from orchestrator.app.cli import process

process()
