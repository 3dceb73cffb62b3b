"""The state store: records, schema and migrations, the pipeline lock.

SQLAlchemy Core over SQLite by default, any URL in production.

May import: orchestrator, errors, positions, services.
"""
