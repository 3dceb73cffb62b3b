"""The JVM jars a Spark deployment of Tidemark uses, pinned: the one place their coordinates live.

pyspark ships Spark and Hadoop's client, not Hadoop's S3 connector nor Iceberg's Spark runtime.
`.ci/setup` fetches these artifacts into Maven's local repository (``~/.m2/repository``, or
``$TIDEMARK_MAVEN_REPO``), and Tidemark finds them there by their coordinates: nothing is
downloaded while a run or a test runs. A cluster gets the same coordinates as
``spark.jars.packages`` (docs/spark.md, "Object storage").

- `S3A`: Hadoop's ``s3a://`` filesystem of the Hadoop version pyspark bundles
  (``hadoop-client-api`` in pyspark's ``jars/``), with the AWS SDK v2 bundle and the analytics
  accelerator its POM names; a session adds them for ``s3://``/``s3a://`` staging or output.
- `ICEBERG_SPARK`: Iceberg's Spark runtime for pyspark's Spark and Scala versions, for reading
  the published tables as Iceberg tables in Spark.
- `MYSQL_CONNECTOR_J`: MySQL's JDBC driver, beside MariaDB's (Debian's libmariadb-java).
- `POSTGRESQL_JDBC`: PostgreSQL's, for Iceberg's ``JdbcCatalog`` over a state store there.

>>> HADOOP_AWS.coordinate
'org.apache.hadoop:hadoop-aws:3.5.0'
>>> HADOOP_AWS.relative_path
'org/apache/hadoop/hadoop-aws/3.5.0/hadoop-aws-3.5.0.jar'
>>> packages(S3A).count(",")
2
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigError

#: Where Maven's local repository is, when not ``~/.m2/repository``.
REPO_ENV = "TIDEMARK_MAVEN_REPO"


@dataclass(frozen=True, slots=True)
class Artifact:
    """A jar on Maven Central, by its coordinates."""

    group: str
    name: str
    version: str

    @property
    def coordinate(self) -> str:
        """``group:name:version``, as ``spark.jars.packages`` and ``mvn dependency:get`` take."""
        return f"{self.group}:{self.name}:{self.version}"

    @property
    def relative_path(self) -> str:
        """The jar's path inside a Maven repository."""
        return (
            f"{self.group.replace('.', '/')}/{self.name}/{self.version}/"
            f"{self.name}-{self.version}.jar"
        )


#: Hadoop's S3 connector for pyspark 4.3's bundled Hadoop 3.5.0, and what its POM needs at
#: run time (hadoop-project 3.5.0: aws-java-sdk-v2 2.35.4, analyticsaccelerator-s3 1.3.1).
HADOOP_AWS = Artifact("org.apache.hadoop", "hadoop-aws", "3.5.0")
AWS_SDK_BUNDLE = Artifact("software.amazon.awssdk", "bundle", "2.35.4")
ANALYTICS_ACCELERATOR = Artifact(
    "software.amazon.s3.analyticsaccelerator", "analyticsaccelerator-s3", "1.3.1"
)
S3A: tuple[Artifact, ...] = (HADOOP_AWS, AWS_SDK_BUNDLE, ANALYTICS_ACCELERATOR)

#: Iceberg's Spark runtime for Spark 4.x, Scala 2.13 (the newest Spark line Iceberg builds for).
ICEBERG_SPARK = Artifact("org.apache.iceberg", "iceberg-spark-runtime-4.1_2.13", "1.12.0")
MYSQL_CONNECTOR_J = Artifact("com.mysql", "mysql-connector-j", "9.5.0")
#: MariaDB's JDBC driver as Maven Central serves it, newer than Debian's 2.7 (the default
#: ``source.jdbc_driver_jar``): the tests read with both.
MARIADB_CONNECTOR_J = Artifact("org.mariadb.jdbc", "mariadb-java-client", "4.0.0")
#: PostgreSQL's JDBC driver: Iceberg's ``JdbcCatalog`` over a state store on PostgreSQL.
POSTGRESQL_JDBC = Artifact("org.postgresql", "postgresql", "42.7.14")

#: Everything `.ci/setup` fetches (`python -m orchestrator.services.jars` lists them).
ALL: tuple[Artifact, ...] = (
    *S3A,
    ICEBERG_SPARK,
    MYSQL_CONNECTOR_J,
    MARIADB_CONNECTOR_J,
    POSTGRESQL_JDBC,
)


def repository() -> Path:
    """Maven's local repository: ``$TIDEMARK_MAVEN_REPO`` or ``~/.m2/repository``."""
    configured = os.environ.get(REPO_ENV)
    return Path(configured) if configured else Path.home() / ".m2" / "repository"


def jar_path(artifact: Artifact) -> str:
    """The local file of ``artifact``.

    Raises:
        ConfigError: when the jar is not in the local repository, naming how to fetch it.
    """
    path = repository() / artifact.relative_path
    if not path.is_file():
        raise ConfigError(
            f"the jar {artifact.coordinate} is not in {repository()} (${REPO_ENV} or "
            f"~/.m2/repository); fetch it with `mvn dependency:get -Dtransitive=false "
            f"-Dartifact={artifact.coordinate}` (.ci/setup does), or give the coordinates in "
            "spark.conf's spark.jars.packages (docs/spark.md)"
        )
    return str(path)


def jar_paths(artifacts: tuple[Artifact, ...]) -> tuple[str, ...]:
    """The local files of ``artifacts`` (`jar_path` of each)."""
    return tuple(jar_path(a) for a in artifacts)


def packages(artifacts: tuple[Artifact, ...]) -> str:
    """``artifacts`` as one ``spark.jars.packages`` value."""
    return ",".join(a.coordinate for a in artifacts)


if __name__ == "__main__":  # .ci/setup: one coordinate a line
    print("\n".join(a.coordinate for a in ALL))
