"""Capture: the binlog of the run's window decoded into change files per table (`buffer`), with
the table's filter applied (`filtering`), XA transactions at their commit (`xa`), and a re-read of
a table whose change cannot be applied from the binlog (`reread`)."""
