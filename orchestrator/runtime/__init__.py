"""Running Tidemark: the CLI, the run loop with progress, status/reset, the Spark session,
the Airflow DAG factory and its support, failpoints.
"""
