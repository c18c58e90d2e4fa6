"""The browser harness itself, on a small page served by a real subprocess on port 0: Debian's
Chromium starts headless, runs the page's JavaScript, clicks, waits, and writes screenshots;
a missing browser is an error naming the fix, never a skip."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from selenium.webdriver.common.selenium_manager import SeleniumManager

from tests.browser.browser import WINDOW, BrowserSetupError, binaries, chromium
from tests.browser.servers import ServerStartError, server_process

REPO = Path(__file__).resolve().parents[2]

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>harness</title><link rel="icon" href="data:,"></head>
<body style="font-family: sans-serif">
<h1 id="title">static</h1>
<button id="go" type="button">go</button> <span id="count">0</span>
<div style="height: 2500px; background: linear-gradient(#fff, #36c)"></div>
<p id="bottom">bottom</p>
<script>
  document.getElementById("title").textContent = "rendered by script";
  document.getElementById("go").addEventListener("click", () => {
    // The change lands later, like a live update: the test must wait, not look at once.
    setTimeout(() => {
      const c = document.getElementById("count");
      c.textContent = String(Number(c.textContent) + 1);
    }, 700);
  });
</script>
</body></html>
"""


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise AssertionError(f"{path} is not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_chromium_runs_a_page_served_on_port_0_and_screenshots_it(
    tmp_path: Path, output_dir: Path, open_page
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(PAGE, encoding="utf-8")
    args = [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1", "-d", str(site)]
    with server_process(args, r"port (\d+)", output_dir / "server.log") as server:
        assert server.port != 0
        page = open_page(server.base_url)
        page.open("/index.html")
        assert page.text_of("#title") == "rendered by script"
        page.find("#go").click()
        assert page.wait_text("#count", lambda t: t == "1") == "1"
        shot = page.screenshot("harness")
        assert page.severe_console_errors() == []
    width, height = png_size(shot)
    # The whole page, not only the 900-pixel viewport.
    assert WINDOW[0] - 30 <= width <= WINDOW[0]
    assert height > 2500
    assert shot.parent == output_dir


def test_no_selenium_manager_is_refused_when_called(no_selenium_manager: None) -> None:
    with pytest.raises(AssertionError, match="Selenium Manager was called"):
        SeleniumManager().binary_paths(["--browser", "chrome"])


def test_a_missing_chromium_is_an_error_naming_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CHROMIUM_BINARY", str(tmp_path / "no-chromium"))
    with pytest.raises(BrowserSetupError, match=r"no-chromium .*make chromium"):
        binaries()
    with pytest.raises(BrowserSetupError), chromium(tmp_path / "driver.log"):
        pass


def test_setup_script_fails_loudly_without_apt(tmp_path: Path) -> None:
    """No chromium and no apt-get: the setup step exits non-zero saying so (never a skip)."""
    result = subprocess.run(
        ["/bin/bash", str(REPO / "scripts" / "ensure-chromium.sh")],
        env={"PATH": str(tmp_path), "CHROMIUM_BINARY": str(tmp_path / "no-chromium")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "apt-get is not available" in result.stderr


def test_setup_script_reports_the_installed_pair() -> None:
    result = subprocess.run(
        ["/bin/bash", str(REPO / "scripts" / "ensure-chromium.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Chromium" in result.stdout
    assert "ChromeDriver" in result.stdout


def test_a_server_that_exits_at_once_is_an_error_with_its_output(tmp_path: Path) -> None:
    args = [sys.executable, "-c", "print('cannot bind'); raise SystemExit(3)"]
    with (
        pytest.raises(ServerStartError, match=r"exited with 3(.|\n)*cannot bind"),
        server_process(args, r"port (\d+)", tmp_path / "server.log"),
    ):
        pass
