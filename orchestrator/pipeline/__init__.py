"""The run's steps, one subpackage each, in the order a run takes them: `plan`, `read`, `capture`,
`reconcile`, `publish`; each step's entry point is ``<step>/step.py``. What every step shares lives
here: `context` (the run's store, source, catalog, lock and directories), `changes` (the change
records' columns), `segments` (the change files capture writes and reconcile reads), `failed` (a
table that fails alone), `workers` (the worker processes of reconcile and publish).

`orchestrator.app.steps` is the facade the CLI and the Airflow DAG call.

May import: orchestrator, errors, positions, services, schema, chunking, config, state, lake,
source, binlog.
"""
