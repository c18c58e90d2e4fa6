"""A console started without an admin token is read-only: no restore button, and a restore
with any token is 403 (there is nothing to compare it with), the saga stays FROZEN."""

from __future__ import annotations

import httpx
import pytest

from accord_cassandra.launcher import CassandraHandle
from tests.console._server import running_console

pytestmark = pytest.mark.cassandra


def test_without_an_admin_token_nothing_can_be_restored(
    cassandra_node: CassandraHandle, console_keyspace: str
) -> None:
    with (
        running_console(cassandra_node, console_keyspace, admin_token=None, frozen=1) as console,
        httpx.Client(base_url=console.url, timeout=30) as client,
    ):
        tid = console.ids["frozen"]
        page = client.get(f"/sagas/{tid}").text
        assert 'id="restore-button"' not in page and 'id="restore-unavailable"' in page
        assert "read-only" in page
        confirm = client.get(f"/sagas/{tid}/restore").text
        assert 'id="restore-form"' not in confirm
        api = client.post(
            f"/api/sagas/{tid}/restore", headers={"Authorization": "Bearer any-token-at-all-123"}
        )
        assert api.status_code == 403 and "no admin token" in api.json()["message"]
        assert client.get(f"/api/sagas/{tid}").json()["status"] == "FROZEN"
