from __future__ import annotations

import httpx
import pytest

from tests.console._server import RunningConsole

pytestmark = pytest.mark.cassandra


def test_pages_answer(console: RunningConsole) -> None:
    with httpx.Client(base_url=console.url) as client:
        for path in ("/sagas", "/frozen", "/directory", "/sidecars", "/live"):
            response = client.get(path)
            assert response.status_code == 200, (path, response.text[:2000])
        for label, tid in console.ids.items():
            response = client.get(f"/sagas/{tid}")
            assert response.status_code == 200, (label, response.text[:2000])
