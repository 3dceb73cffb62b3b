"""The run's steps, one module each: plan, read, capture, reconcile, publish.

`orchestrator.steps` is the facade the CLI and the Airflow DAG call.
"""
