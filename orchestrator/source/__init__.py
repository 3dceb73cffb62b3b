"""The source MySQL/MariaDB: connections, retry policy, dialect, listing tables, the
checks of grants and of the binlog a pipeline still needs (`kept`).

Everything Tidemark asks the source outside Spark JDBC reads and the binlog stream goes through
here.

May import: orchestrator, errors, positions, services, schema, chunking, config, state,
lake.
"""
