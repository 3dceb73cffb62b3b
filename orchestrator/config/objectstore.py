"""The object store of ``s3://`` and ``s3a://`` staging and output (``output.s3``, docs/config.md).

One set of settings - endpoint, region, path-style addressing, credentials - reaches every client
that touches the store, each through its function here, so they cannot disagree:

- pyarrow's ``S3FileSystem`` (`pyarrow_options`; `orchestrator.lake.storage` builds it);
- pyiceberg's FileIO (`iceberg_properties`; `orchestrator.lake.iceberg.catalog_properties`);
- Spark's ``fs.s3a.*`` (`spark_conf`; `orchestrator.pipeline.context.session_settings`).

Credentials are never written in the YAML: without ``access_key_env`` the clients use the AWS
default chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, a profile, web identity, an
instance role); with it, the variables it and ``secret_key_env`` name are read when a client is
made (`credentials`). `validate` refuses a literal key in ``output.s3``, in ``spark.conf``
(``fs.s3a.secret.key``...) and in ``output.catalog`` (``s3.secret-access-key``...).

An endpoint or region ``output.s3`` leaves out comes from the AWS SDKs' variables
(`endpoint`, `region`), read when a client is made, like the keys.

Storage functions take only a URI: a loaded config names its buckets (`register`), and
`settings_for` finds a bucket's settings (the defaults for a bucket no config named; a bucket two
loaded configs name takes the last one's).

>>> s3 = S3Config(endpoint="http://127.0.0.1:9000", region="us-east-1", path_style=True)
>>> sorted(pyarrow_options(s3, None).items())  # doctest: +NORMALIZE_WHITESPACE
[('allow_delayed_open', True), ('endpoint_override', '127.0.0.1:9000'), ('region', 'us-east-1'),
 ('scheme', 'http')]
>>> iceberg_properties(s3, None)["s3.force-virtual-addressing"]
'false'
>>> spark_conf(s3, None)["spark.hadoop.fs.s3a.path.style.access"]
'true'
>>> bucket("s3a://lake/warehouse/x"), is_s3("s3://b/k"), is_s3("/var/lake")
('lake', True, False)
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from orchestrator.config.credentials import Secret
from orchestrator.config.sections import OutputConfig, Reader, S3Config, field_default, section_keys
from orchestrator.errors import ConfigError

#: Keys that would hold a literal secret, refused wherever they are written (lower case).
_LITERAL_KEYS = {
    "output.s3": {
        "access_key",
        "access_key_id",
        "secret_key",
        "secret_access_key",
        "session_token",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
    },
    "output.catalog": {
        "s3.access-key-id",
        "s3.secret-access-key",
        "s3.session-token",
        "client.access-key-id",
        "client.secret-access-key",
        "client.session-token",
    },
}
#: ``spark.conf`` keys of Hadoop's S3 credentials (a per-bucket ``fs.s3a.bucket.B.secret.key``
#: too).
_SPARK_SECRET = re.compile(r"fs\.s3a\.(bucket\.[^.]+\.)?(access\.key|secret\.key|session\.token)$")
_ENDPOINT = re.compile(r"https?://[^/\s:]+(:\d+)?/?")
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
#: The AWS SDK v2's default chain (environment, system properties, web identity, profile,
#: container and instance roles), as Spark's s3a credential provider.
DEFAULT_CHAIN = "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"


@dataclass(frozen=True, slots=True)
class Credentials:
    """Keys read from the variables ``output.s3`` names; the secret parts never print."""

    access_key: str
    secret_key: Secret
    session_token: Secret | None = None


def is_s3(uri: str) -> bool:
    """Whether ``uri`` is on an S3-compatible store (``s3://`` or ``s3a://``)."""
    return uri.split("://", 1)[0].lower() in ("s3", "s3a") if "://" in uri else False


def bucket(uri: str) -> str:
    """The bucket of an ``s3://``/``s3a://`` URI."""
    return urlsplit(uri).netloc


def literal_secret_problems(r: Reader, section: str, data: Any) -> None:
    """Add a problem for each key of ``data`` (the mapping at ``section``) that would hold a
    literal secret; the value is never shown."""
    if not isinstance(data, dict):
        return
    for key in data:
        name = str(key).lower()
        if section == "spark.conf":
            secret = bool(_SPARK_SECRET.search(name))
        else:
            secret = name in _LITERAL_KEYS.get(section, set())
        if secret:
            r.problem(
                f"{section}.{key}",
                "a literal credential is refused (the value is not shown); export it and name "
                "the variable in output.s3.access_key_env / secret_key_env, or leave them out "
                "for the AWS default chain (environment, profile, web identity)",
            )


def read_s3(r: Reader, data: Any, uris: list[str], check_env: bool) -> S3Config:
    """``output.s3`` checked: keys, an ``http(s)://host[:port]`` endpoint, the variables named
    (set, when ``check_env``), only with ``s3://``/``s3a://`` staging or output."""
    if data is None:
        return S3Config()
    literal_secret_problems(r, "output.s3", data)
    allowed = section_keys(S3Config) | _LITERAL_KEYS["output.s3"]
    m = {k: v for k, v in r.mapping(data, "output.s3", allowed, set()).items()}
    for key in _LITERAL_KEYS["output.s3"]:
        m.pop(key, None)
    if isinstance(data, dict) and not any(is_s3(u) for u in uris if u):
        r.problem(
            "output.s3",
            "is given but neither output.path nor output.staging is an s3:// or s3a:// URI; "
            "remove it or put the lake on the object store",
        )
    endpoint = r.value(
        m,
        "endpoint",
        "output.s3.endpoint",
        str,
        None,
        lambda v: (
            None
            if _ENDPOINT.fullmatch(v)
            else f"expected http://host[:port] or https://host[:port], found {v!r}"
        ),
    )
    names = {}
    for key in ("access_key_env", "secret_key_env", "session_token_env"):
        names[key] = r.value(m, key, f"output.s3.{key}", str)
        if names[key] and check_env and names[key] not in os.environ:
            r.problem(
                f"output.s3.{key}",
                f"environment variable {names[key]} is not set; export it before running",
            )
    if bool(names["access_key_env"]) != bool(names["secret_key_env"]):
        r.problem(
            "output.s3",
            "give both access_key_env and secret_key_env, or neither (the AWS default chain)",
        )
    return S3Config(
        endpoint=endpoint.rstrip("/") if endpoint else None,
        region=r.value(
            m, "region", "output.s3.region", str, None, lambda v: None if v.strip() else "empty"
        ),
        path_style=r.value(
            m, "path_style", "output.s3.path_style", bool, field_default(S3Config, "path_style")
        ),
        **names,
    )


def credentials(s3: S3Config) -> Credentials | None:
    """The keys of the variables ``s3`` names, or None for the AWS default chain.

    Raises:
        ConfigError: when a named variable is not set.
    """
    if not s3.access_key_env or not s3.secret_key_env:
        return None
    values = {}
    for key in ("access_key_env", "secret_key_env", "session_token_env"):
        name = getattr(s3, key)
        if name is None:
            continue
        if name not in os.environ:
            raise ConfigError(
                f"output.s3.{key}: environment variable {name} is not set; export it before running"
            )
        values[key] = os.environ[name]
    token = values.get("session_token_env")
    return Credentials(
        values["access_key_env"],
        Secret(values["secret_key_env"]),
        Secret(token) if token is not None else None,
    )


def endpoint(s3: S3Config) -> str | None:
    """The endpoint: ``output.s3.endpoint``, else ``$AWS_ENDPOINT_URL_S3`` or
    ``$AWS_ENDPOINT_URL`` (as the AWS SDKs read them), else None (AWS's own)."""
    found = (
        s3.endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    )
    return found.rstrip("/") if found else None


def region(s3: S3Config) -> str:
    """The region: ``output.s3.region``, else ``$AWS_REGION`` or ``$AWS_DEFAULT_REGION``, else
    ``us-east-1``; always given to every client, which would otherwise look the bucket's region
    up at AWS."""
    return (
        s3.region
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or ("us-east-1")
    )


def _endpoint_parts(endpoint: str) -> tuple[str, str]:
    """(scheme, host[:port]) of an endpoint URL."""
    parts = urlsplit(endpoint)
    return parts.scheme, parts.netloc


def pyarrow_options(s3: S3Config, creds: Credentials | None) -> dict[str, Any]:
    """Keyword arguments of ``pyarrow.fs.S3FileSystem`` (the region always given: pyarrow would
    otherwise look it up at AWS). ``allow_delayed_open``: a file is sent when it is closed, in
    one PUT when it fits in one part, instead of a multipart upload opened first (three requests
    for each of the many small files a run writes: plans, manifests, segments); an error such as
    a missing bucket is then raised when the file is written or closed, not opened."""
    options: dict[str, Any] = {"region": region(s3), "allow_delayed_open": True}
    url = endpoint(s3)
    if url:
        scheme, host = _endpoint_parts(url)
        options.update(endpoint_override=host, scheme=scheme)
        if not s3.path_style:  # pyarrow addresses an overridden endpoint path-style by default
            options["force_virtual_addressing"] = True
    if creds is not None:
        options.update(access_key=creds.access_key, secret_key=creds.secret_key.reveal())
        if creds.session_token is not None:
            options["session_token"] = creds.session_token.reveal()
    return options


def iceberg_properties(s3: S3Config, creds: Credentials | None) -> dict[str, str]:
    """pyiceberg FileIO properties (``s3.*``) of the same store."""
    props = {
        "s3.region": region(s3),
        "s3.force-virtual-addressing": "false" if s3.path_style else "true",
    }
    url = endpoint(s3)
    if url:
        props["s3.endpoint"] = url
    if creds is not None:
        props["s3.access-key-id"] = creds.access_key
        props["s3.secret-access-key"] = creds.secret_key.reveal()
        if creds.session_token is not None:
            props["s3.session-token"] = creds.session_token.reveal()
    return props


def spark_conf(s3: S3Config, creds: Credentials | None) -> dict[str, str]:
    """Spark settings (``spark.hadoop.fs.s3a.*``) of the same store; ``s3://`` is read and
    written by the s3a filesystem too (an Iceberg table's ``s3://`` locations)."""
    h = "spark.hadoop.fs."
    conf = {
        f"{h}s3.impl": S3A_FILESYSTEM,
        f"{h}s3a.impl": S3A_FILESYSTEM,
        f"{h}s3a.endpoint.region": region(s3),
        f"{h}s3a.path.style.access": "true" if s3.path_style else "false",
    }
    url = endpoint(s3)
    if url:
        scheme, _ = _endpoint_parts(url)
        conf[f"{h}s3a.endpoint"] = url
        conf[f"{h}s3a.connection.ssl.enabled"] = "true" if scheme == "https" else "false"
    if creds is None:
        conf[f"{h}s3a.aws.credentials.provider"] = DEFAULT_CHAIN
        return conf
    conf[f"{h}s3a.access.key"] = creds.access_key
    conf[f"{h}s3a.secret.key"] = creds.secret_key.reveal()
    if creds.session_token is not None:
        conf[f"{h}s3a.session.token"] = creds.session_token.reveal()
        conf[f"{h}s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        )
    else:
        conf[f"{h}s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        )
    return conf


_BUCKETS: dict[str, S3Config] = {}
_BUCKETS_LOCK = threading.Lock()


def register(output: OutputConfig) -> None:
    """Remember ``output.s3`` for the buckets of ``output.path`` and ``output.staging``."""
    with _BUCKETS_LOCK:
        for uri in (output.path, output.staging):
            if uri and is_s3(uri):
                _BUCKETS[bucket(uri)] = output.s3


def settings_for(uri: str) -> S3Config:
    """The settings of the bucket of ``uri`` (a loaded config's ``output.s3``), or the defaults."""
    with _BUCKETS_LOCK:
        return _BUCKETS.get(bucket(uri), S3Config())
