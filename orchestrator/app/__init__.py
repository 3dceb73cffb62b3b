"""The application: what users start. The CLI (`cli`) and its verbs — a run with progress
(`run`, `early`), the `--every` loop (`every`), `status`/`reset`, `plan`'s output, `doctor` and the
run's preflight (`doctor`, `preflight`), the run's log file (`logs`), `demo` — and the Airflow DAG
factory (`airflow_dags`, `airflow_support`). `steps` is the facade both the CLI and the DAG call:
one function per pipeline step.

May import: orchestrator, errors, positions, services, schema, chunking, config, state, lake,
source, binlog, pipeline.
"""
