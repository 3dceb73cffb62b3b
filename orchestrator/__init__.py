"""Tidemark: consistent, lock-free MySQL snapshots into a data lake (README.md, docs/).

May import: nothing of Tidemark's.
"""

__version__ = "0.1.0"
