"""Debian's headless Chromium driven through Debian's chromedriver, for the console's tests.

Nothing here downloads: the driver and browser paths are given to Selenium explicitly, so its
Selenium Manager (which would fetch a browser build of its own) is never consulted, and
``SE_OFFLINE`` tells it to stay offline should anything still call it. The two binaries come
from the distribution's ``chromium`` and ``chromium-driver`` packages, installed by
``scripts/ensure-chromium.sh`` (``make chromium``, part of ``make test``). A missing binary is
an error naming it, never a skip.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM_ENV, CHROMEDRIVER_ENV = "CHROMIUM_BINARY", "CHROMEDRIVER"
DEFAULT_CHROMIUM, DEFAULT_CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# Generous: two cores shared with Cassandra JVMs and other suites. A wait returns as soon as
# its condition holds; only a page that never gets there uses it all.
WAIT_SECONDS = 60.0
WINDOW = (1366, 900)
# A full-page screenshot grows the window to the page's height, up to this.
MAX_SHOT_HEIGHT = 6000


class BrowserSetupError(RuntimeError):
    """Chromium or chromedriver is missing or unusable; the message says which and how to fix."""


def binaries() -> tuple[Path, Path]:
    """(chromium, chromedriver), checked to exist and be executable."""
    found = []
    for env, default in (
        (CHROMIUM_ENV, DEFAULT_CHROMIUM),
        (CHROMEDRIVER_ENV, DEFAULT_CHROMEDRIVER),
    ):
        path = Path(os.environ.get(env) or default)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BrowserSetupError(
                f"{path} ({env}) is missing or not executable: run `make chromium` "
                "(scripts/ensure-chromium.sh installs Debian's chromium and chromium-driver)"
            )
        found.append(path)
    return found[0], found[1]


def major_version(binary: Path) -> int:
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    match = re.search(r"\b(\d+)\.\d+\.\d+", out)
    if match is None:
        raise BrowserSetupError(f"{binary} --version printed no version: {out!r}")
    return int(match.group(1))


def chrome_options(binary: Path, user_data_dir: Path) -> webdriver.ChromeOptions:
    options = webdriver.ChromeOptions()
    options.binary_location = str(binary)
    options.add_argument("--headless=new")
    # The tests run as root (CI too), where Chromium's sandbox refuses to start.
    options.add_argument("--no-sandbox")
    # /dev/shm is small in containers; Chromium then crashes tabs on larger pages.
    options.add_argument("--disable-dev-shm-usage")
    options.add_argument(f"--user-data-dir={user_data_dir}")
    options.add_argument(f"--window-size={WINDOW[0]},{WINDOW[1]}")
    # Nothing but the page under test may reach the network: no sync, updates, phoning home.
    for flag in (
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--metrics-recording-only",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return options


@contextmanager
def chromium(log_path: Path) -> Iterator[webdriver.Chrome]:
    """A headless Chromium session with its own temporary profile; quit afterwards."""
    browser_binary, driver_binary = binaries()
    browser_major, driver_major = major_version(browser_binary), major_version(driver_binary)
    if browser_major != driver_major:
        raise BrowserSetupError(
            f"{browser_binary} is version {browser_major} but {driver_binary} is "
            f"{driver_major}: install matching chromium and chromium-driver"
        )
    os.environ["SE_OFFLINE"] = "true"
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        service = Service(executable_path=str(driver_binary), log_output=str(log_path))
        driver = webdriver.Chrome(
            service=service, options=chrome_options(browser_binary, Path(profile))
        )
        try:
            driver.set_page_load_timeout(WAIT_SECONDS)
            yield driver
        finally:
            driver.quit()


@dataclass
class Page:
    """The browser plus where its screenshots go, with the waits the tests use."""

    driver: webdriver.Chrome
    base_url: str
    shots_dir: Path
    shots: list[Path] = field(default_factory=list)

    def open(self, path: str) -> None:
        self.driver.get(self.base_url + path)
        self.wait(lambda d: d.execute_script("return document.readyState") == "complete")

    def wait(self, condition: Callable[[Any], Any], timeout: float = WAIT_SECONDS) -> Any:
        return WebDriverWait(self.driver, timeout, poll_frequency=0.2).until(condition)

    def find(self, css: str, timeout: float = WAIT_SECONDS) -> WebElement:
        """The visible element matching ``css``, waited for."""
        element: WebElement = self.wait(
            ec.visibility_of_element_located((By.CSS_SELECTOR, css)), timeout
        )
        return element

    def present(self, css: str, timeout: float = WAIT_SECONDS) -> WebElement:
        """The element matching ``css`` once it is in the DOM (for parts of an inline SVG,
        which Selenium's visibility check does not judge)."""
        element: WebElement = self.wait(
            ec.presence_of_element_located((By.CSS_SELECTOR, css)), timeout
        )
        return element

    def find_all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def by_testid(self, testid: str, timeout: float = WAIT_SECONDS) -> WebElement:
        return self.find(f'[data-testid="{testid}"]', timeout)

    def text_of(self, css: str) -> str:
        return str(self.find(css).text)

    def wait_text(
        self, css: str, predicate: Callable[[str], bool], timeout: float = WAIT_SECONDS
    ) -> str:
        """Wait until the element's text satisfies ``predicate``; that text."""

        def check(driver: Any) -> str | bool:
            elements = driver.find_elements(By.CSS_SELECTOR, css)
            if not elements:
                return False
            text = str(elements[0].text)
            return text if predicate(text) else False

        result: str = self.wait(check, timeout)
        return result

    def severe_console_errors(self) -> list[str]:
        """SEVERE entries of the page's JavaScript console since the last call (a failed
        request for any resource, the icon included, is one)."""
        return [
            str(entry["message"])
            for entry in self.driver.get_log("browser")
            if entry.get("level") == "SEVERE"
        ]

    def screenshot(self, name: str) -> Path:
        """The whole page (not only the viewport) as ``NN-name.png`` in the test's folder."""
        metrics = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
        size = metrics["cssContentSize"]
        height = min(max(float(size["height"]), float(WINDOW[1])), float(MAX_SHOT_HEIGHT))
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {
                    "x": 0,
                    "y": 0,
                    "width": float(size["width"]),
                    "height": height,
                    "scale": 1,
                },
            },
        )
        path = self.shots_dir / f"{len(self.shots) + 1:02d}-{name}.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        self.shots.append(path)
        return path
