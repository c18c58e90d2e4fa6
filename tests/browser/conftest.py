"""Browser fixtures: Debian's headless Chromium (tests/browser/browser.py) and a per-test
output folder for its screenshots.

Screenshots go to ``test-output/browser/<test name>/NN-<page>.png`` under the repository root
(ignored by git), or under ``$ACCORD_TEST_OUTPUT`` when that is set; each test's folder is
emptied when the test starts, so what is there is what the last run saw. A failing test also
leaves ``failure.png`` and ``failure.html`` (the DOM at the moment of failure) and the folder
always has ``chromedriver.log``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.selenium_manager import SeleniumManager

from accord_cassandra.launcher import CassandraHandle
from tests.browser._console import ConsoleUnderTest, console_subprocess
from tests.browser.browser import Page, chromium

OUTPUT_ENV = "ACCORD_TEST_OUTPUT"

_failed = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    if getattr(report, "when", None) == "call" and getattr(report, "failed", False):
        item.stash[_failed] = True
    return report


@pytest.fixture
def output_dir(request: pytest.FixtureRequest) -> Path:
    """This test's own output folder, emptied at its start."""
    base = Path(os.environ.get(OUTPUT_ENV) or request.config.rootpath / "test-output")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    folder = base / "browser" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def no_selenium_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Selenium Manager fetches browsers and drivers of its own; calling it is a test error."""

    def refuse(self: SeleniumManager, args: list[str]) -> dict[str, str]:
        raise AssertionError(f"Selenium Manager was called ({args}); the paths must be explicit")

    monkeypatch.setattr(SeleniumManager, "binary_paths", refuse)


@pytest.fixture
def open_page(
    request: pytest.FixtureRequest, output_dir: Path, no_selenium_manager: None
) -> Iterator[Callable[[str], Page]]:
    """``page = open_page(base_url)``: a fresh headless Chromium pointed at a server."""
    with chromium(output_dir / "chromedriver.log") as driver:
        pages: list[Page] = []

        def make(base_url: str) -> Page:
            page = Page(driver, base_url.rstrip("/"), output_dir)
            pages.append(page)
            return page

        yield make
        if request.node.stash.get(_failed, False):
            driver.save_screenshot(str(output_dir / "failure.png"))
            (output_dir / "failure.html").write_text(driver.page_source, encoding="utf-8")


@pytest.fixture(scope="module")
def console(
    cassandra_node: CassandraHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsoleUnderTest]:
    """``stacksaga-store console`` as a subprocess on port 0 over freshly seeded sagas; its
    output is in ``<tmp>/console*/console.log``."""
    with console_subprocess(cassandra_node, tmp_path_factory.mktemp("console")) as running:
        yield running
