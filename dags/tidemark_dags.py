"""Airflow DAG file: one DAG ``tidemark_<pipeline>`` per pipeline YAML in the configs folder.

The folder is ``$TIDEMARK_CONFIG_DIR``, else ``configs/`` next to this dags folder.
Configs are read with the CLI's own validation and no database or network access.
A broken config never breaks this file: it is left out here and reported, naming
its file and key, as the import error of ``tidemark_config_errors.py`` (Airflow
attributes import errors to a whole file and hides every DAG of a file that has
one, so the good DAGs and the errors live in different files; see docs/airflow.md).

May import: errors, app.
"""

from __future__ import annotations

from airflow.sdk import get_parsing_context

from orchestrator.app.airflow_dags import collect
from orchestrator.app.airflow_support import config_dir

# When Airflow runs a task it parses this file for one DAG only: build just that one.
globals().update(collect(config_dir(__file__), only=get_parsing_context().dag_id).dags)
