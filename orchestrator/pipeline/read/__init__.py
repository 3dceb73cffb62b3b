"""Read: each batch of chunks between its low and high binlog positions, by a Spark JDBC job
(`jdbc`) or, for small tables, by the driver itself (`local`), with the same SQL (`sql`)."""
