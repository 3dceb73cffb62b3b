"""Tidemark: consistent, lock-free MySQL snapshots into a data lake."""

__version__ = "0.1.0"
