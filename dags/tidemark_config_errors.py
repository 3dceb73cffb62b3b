"""Airflow DAG file that defines no DAG: it reports broken Tidemark pipeline configs.

It fails to import, with every problem of every broken YAML in the configs folder
(each line naming the file and the key), exactly when there is one; the UI lists
that under "DAG Import Errors". The DAGs of the good configs come from
``tidemark_dags.py`` and keep running.

May import: errors, app.
"""

from __future__ import annotations

from orchestrator.app.airflow_dags import collect
from orchestrator.app.airflow_support import config_dir
from orchestrator.errors import ConfigError

problems = collect(config_dir(__file__)).problems
if problems:
    raise ConfigError(["Tidemark pipeline config problems (their DAGs are not loaded):", *problems])
