"""Reconcile: base files plus the run's changes become the table's data files at ``H``
(`rewrite`), in the driver (`local`) or in Spark (`spark`); tables without a change keep their
files (`kept`)."""
