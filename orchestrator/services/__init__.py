"""Services every layer above may use, knowing nothing of Tidemark's domain: failpoints
(`faults`), reducing a failure to the one line a user can act on (`failures`), the Spark session
(`spark`, the driver JVM's class archive `class_archive`), the pinned JVM jars (`jars`), and
keeping pandas out of a run's imports (`lean`).

May import: orchestrator, errors.
"""
