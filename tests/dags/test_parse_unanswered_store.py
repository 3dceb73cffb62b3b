"""Parsing the DAGs while a pipeline's state store does not answer.

The trigger form of a pipeline with a pattern entry lists the tables its patterns matched,
read from the state store when the DAG file is parsed (`peek_table_set`). A store that
accepts connections but never answers (a hung server, a half-open connection) must only cost
that pipeline's form its matched tables: without a bound on the wait, the file's import ran
past Airflow's ``dagbag_import_timeout`` and every pipeline's DAG disappeared.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.dags.test_parsing import config, parse, write

pytestmark = pytest.mark.usefixtures("airflow_home")


def test_a_state_store_that_never_answers_degrades_only_its_own_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel completes the TCP handshake; nothing ever answers
    port = silent.getsockname()[1]
    folder = tmp_path / "configs"
    write(
        folder,
        "hung.yaml",
        config(
            "hung",
            tmp_path,
            tables=[{"name": "crm.*"}, {"name": "shop.orders"}],
            state={"url": f"postgresql+psycopg://tm:pw@127.0.0.1:{port}/tm"},
        ),
    )
    write(folder, "plain.yaml", config("plain", tmp_path))
    # Airflow's own bound on the import (default 30 s): the old peek waited past any of them.
    monkeypatch.setenv("AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT", "20")
    try:
        bag = parse(monkeypatch, folder)
    finally:
        silent.close()

    assert bag.import_errors == {}
    assert set(bag.dags) == {"tidemark_hung", "tidemark_plain"}
    tables = bag.dags["tidemark_hung"].params.get_param("tables").schema
    assert tables["items"]["enum"] == ["crm.*", "shop.orders"]  # the config's entries alone
