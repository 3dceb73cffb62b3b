"""Tidemark's own binlog reading: the replication stream, event framing and row decoding.

The modules, from the wire up:

* `stream` - a replica connection (``COM_BINLOG_DUMP``) handing over raw events;
* `events` - event headers and the few event bodies the capture needs (rotate,
  query, MariaDB GTID, table map, rows-event header), parsed from bytes;
* `rowdecode` - rows-event bodies to row tuples of raw values, by a reader
  compiled per image layout (one ``struct.Struct`` per run of fixed-width columns);
* `columns` (and `temporal` for dates and times) - columns of raw values to Arrow
  arrays in staging types, equal value for value to what `orchestrator.schema.values`
  makes of the library's values;
* `compressed` - MariaDB's compressed events and MySQL's TRANSACTION_PAYLOAD turned back
  into the plain events they stand for;
* `statements` - what a QUERY event's statement does to a table (sqlglot's MySQL parser);
* `metadata`, `shape` - a TABLE_MAP's types and optional metadata (names, signedness,
  charsets, ENUM/SET labels) compared with the planned columns;
* `jsonb` - MySQL's binary JSON printed as the server prints it;
* `reader` - the framing: positions, transaction boundaries, rotation, stop,
  TABLE_MAPs checked against the planned shape, rows events of chosen tables, the changes
  that need a re-read (`TableChange`) and the steps of XA transactions (`XaEvent`);
* `batch` - the capture's decoding strategy per table (`FastDecoding`);
* `failover`, `topology` - positions another server recorded: following them by GTID, and
  doctor's lines on the server's identity.

`orchestrator.binlog.reference` keeps python-mysql-replication's decoding on the same
framing, as the reference the fast decoder is tested against.

May import: orchestrator, errors, positions, services, schema, chunking, config, state,
lake, source.
"""
