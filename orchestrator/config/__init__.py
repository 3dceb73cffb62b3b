"""The pipeline config: YAML in, validated frozen dataclasses out (docs/config.md).

`pipeline` reads a file and holds `PipelineConfig`; `sections` the dataclass of each section and
the reader that collects every problem with its file and key path; `patterns` the table entries
and their globs; `credentials` where the source password comes from; `objectstore` the
S3-compatible store of ``s3://`` paths (``output.s3``) as each client takes it. The names most
code needs are re-exported here.

May import: orchestrator, errors, positions, services, schema, chunking.
"""

from __future__ import annotations

from orchestrator.config.credentials import Secret
from orchestrator.config.pipeline import (
    DAG_ID_PREFIX,
    TIME_ZONE,
    PipelineConfig,
    load_config,
    parse_config,
)
from orchestrator.config.sections import (
    DEFAULT_JDBC_JAR,
    AirflowConfig,
    CatalogConfig,
    Defaults,
    OutputConfig,
    S3Config,
    SourceConfig,
    SparkConfig,
    StateConfig,
    TableConfig,
    TlsConfig,
)

__all__ = [
    "DAG_ID_PREFIX",
    "DEFAULT_JDBC_JAR",
    "TIME_ZONE",
    "AirflowConfig",
    "CatalogConfig",
    "Defaults",
    "OutputConfig",
    "PipelineConfig",
    "S3Config",
    "Secret",
    "SourceConfig",
    "SparkConfig",
    "StateConfig",
    "TableConfig",
    "TlsConfig",
    "load_config",
    "parse_config",
]
