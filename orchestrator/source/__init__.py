"""The source MySQL/MariaDB: connection, retry policy, preflight checks (doctor), dialect.

Everything Tidemark asks the source outside Spark JDBC reads and the binlog stream goes through
here.
"""
