"""The demo and its helpers: a private MariaDB launcher, sample data, the verify oracle.

Used by `tidemark demo`, the tests and the benchmarks.
"""
