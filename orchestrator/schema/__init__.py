"""A source table's shape and its types: column info, the MySQL -> Arrow mapping, value conversion.

The snapshot path and the binlog path both convert through here, so values agree.
"""
