"""A source table's shape and its types: column info, the type families, the MySQL -> Arrow
mapping, value conversion, the table filters (`where`) and their collations.

The snapshot path and the binlog path both convert through here, so values agree.

May import: orchestrator, errors, positions, services.
"""
