"""The source password: a `Secret` that never prints, and where it is resolved from.

Imports nothing from Tidemark but `errors` (`config` uses it).
"""

from __future__ import annotations

import os

from orchestrator.errors import ConfigError


class Secret:
    """A password that never prints. ``reveal()`` is the only way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def resolve_password(
    password: Secret | None, password_env: str | None, airflow_conn_id: str | None
) -> str:
    """The source password: given in the config, from an env var or from an Airflow connection."""
    if password is not None:
        return password.reveal()
    if password_env is not None:
        value = os.environ.get(password_env)
        if value is None:
            raise ConfigError(
                f"source.password_env: environment variable {password_env} is not set; "
                "export it before running"
            )
        return value
    if airflow_conn_id is not None:
        return _airflow_password(airflow_conn_id)
    return ""


def _airflow_password(conn_id: str) -> str:
    try:
        from airflow.sdk import BaseHook
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(
            f"source.airflow_conn_id `{conn_id}` needs Airflow; "
            "outside Airflow use source.password_env instead"
        ) from exc
    return BaseHook.get_connection(conn_id).password or ""
