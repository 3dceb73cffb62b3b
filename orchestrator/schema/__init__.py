"""A source table's shape and its types: column info, the type families, the MySQL -> Arrow
mapping, value conversion, the chunk-key choice.

The snapshot path and the binlog path both convert through here, so values agree.
"""
