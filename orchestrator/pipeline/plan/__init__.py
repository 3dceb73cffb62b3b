"""Plan: record the start position, choose each table's chunk key and split it into chunks, or
plan an incremental from its published position; batches of chunks for the reads."""
