"""The Trace Window in a real headless Chromium (Debian's), against ``stacksaga-store console``
running as a subprocess over a real Cassandra seeded with sagas in every state.

Each test saves a screenshot of every page it visits under ``test-output/browser/<test>/``.
Everything waits for what the page shows (WebDriverWait, generous deadlines); nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from selenium.webdriver.support.ui import Select

from tests.browser._console import FROZEN, ConsoleUnderTest
from tests.browser.browser import Page

pytestmark = pytest.mark.cassandra

NAV = [
    ("nav-search", "/sagas", "search-form", "search"),
    ("nav-frozen", "/frozen", "frozen-table", "frozen"),
    ("nav-directory", "/directory", "page-title", "directory"),
    ("nav-sidecars", "/sidecars", "page-title", "sidecars"),
    ("nav-live", "/live", "live-status", "live"),
]


@pytest.fixture
def page(console: ConsoleUnderTest, open_page: Callable[[str], Page]) -> Page:
    return open_page(console.url)


def status_of(page: Page) -> str:
    return str(page.by_testid("saga-status").get_attribute("data-status"))


def test_every_page_opens_from_the_navigation(page: Page, console: ConsoleUnderTest) -> None:
    page.open("/sagas")
    for nav, path, marker, name in NAV:
        page.by_testid(nav).click()
        page.wait(lambda d, p=path: d.current_url.split("?")[0].endswith(p))
        page.by_testid(marker)
        assert page.by_testid("page-title").text.strip() != ""
        if name == "frozen":
            rows = page.find_all('[data-testid="frozen-row"]')
            ids = {r.get_attribute("data-transaction-id") for r in rows}
            assert str(console.ids["frozen"]) in ids
        if name == "live":
            page.wait_text('[data-testid="live-status"]', lambda t: t == "connected")
        page.screenshot(name)
        assert page.severe_console_errors() == [], name
    # One saga's page: the timeline picture of a completed saga.
    page.open(f"/sagas/{console.ids['completed']}")
    assert status_of(page) == "PROCESS_COMPLETED"
    page.by_testid("saga-timeline")
    page.screenshot("saga-completed")
    assert page.severe_console_errors() == []


def test_search_by_id_then_follow_to_the_timeline(page: Page, console: ConsoleUnderTest) -> None:
    target = console.ids["reverted"]
    page.open("/sagas")
    field = page.by_testid("search-transaction-id")
    field.clear()
    field.send_keys(str(target))
    # With a service too, the id is a filter and the result list shows (an id alone goes
    # straight to the saga's page; the end of this test checks that).
    service = page.by_testid("search-service")
    service.clear()
    service.send_keys(console.service)
    page.by_testid("search-submit").click()
    page.wait(lambda d: "service=" in d.current_url)
    page.wait_text('[data-testid="result-count"]', lambda t: t.strip() != "")
    rows = page.find_all('[data-testid="result-row"]')
    assert [r.get_attribute("data-transaction-id") for r in rows] == [str(target)]
    assert page.by_testid("result-count").get_attribute("data-total") == "1"
    page.screenshot("search-by-id")
    rows[0].find_element("css selector", '[data-testid="result-link"]').click()
    page.wait(lambda d: str(target) in d.current_url)
    assert page.by_testid("saga-id").text.strip() == str(target)
    assert status_of(page) == "REVERT_COMPLETED"
    # The timeline picture: shipping failed permanently, so tryouts of both directions show.
    timeline = page.by_testid("saga-timeline")
    assert timeline.tag_name.lower() == "svg"
    # One mark per tryout in the picture.
    for row in page.find_all('[data-testid="tryout-row"]'):
        page.present(f'[data-testid="timeline-tryout-{row.get_attribute("data-index")}"]')
    outcomes = [
        r.get_attribute("data-outcome") for r in page.find_all('[data-testid="tryout-row"]')
    ]
    assert "NON_RETRYABLE_ERROR" in outcomes, outcomes
    assert page.by_testid("compensation-path").text.strip() != "none"
    page.screenshot("timeline")
    # An id alone is a jump to that saga.
    page.open("/sagas")
    page.by_testid("search-transaction-id").send_keys(str(console.ids["retrying"]))
    page.by_testid("search-submit").click()
    page.wait(lambda d: str(console.ids["retrying"]) in d.current_url)
    assert status_of(page) == "FAILED_WITH_RETRYABLE_ERROR"
    page.present('[data-testid^="timeline-retry-"]')
    page.screenshot("timeline-retrying")


def test_search_by_status_lists_only_that_status(page: Page, console: ConsoleUnderTest) -> None:
    page.open("/sagas")
    Select(page.by_testid("search-status")).select_by_value("COMPENSATING")
    service = page.by_testid("search-service")
    service.clear()
    service.send_keys(console.service)
    page.by_testid("search-submit").click()
    page.wait(lambda d: "status=COMPENSATING" in d.current_url)
    rows = page.find_all('[data-testid="result-row"]')
    assert {r.get_attribute("data-status") for r in rows} == {"COMPENSATING"}
    assert str(console.ids["compensating"]) in {
        r.get_attribute("data-transaction-id") for r in rows
    }
    page.screenshot("search-by-status")


def test_restore_a_frozen_saga_with_the_token_and_see_it_run(
    page: Page, console: ConsoleUnderTest
) -> None:
    target = str(console.ids["frozen"])
    page.open("/frozen")
    row = page.find(f'[data-testid="frozen-row"][data-transaction-id="{target}"]')
    assert "refund" in row.find_element("css selector", '[data-testid="frozen-reason"]').text
    row.find_element("css selector", '[data-testid="frozen-restore"]').click()
    page.by_testid("restore-form")
    page.by_testid("restore-token").send_keys(console.token)
    page.by_testid("restore-confirm").click()
    page.screenshot("restore-confirm")
    page.by_testid("restore-submit").click()
    # The answer is the saga's page with the restore's result: the refund, which works again
    # in the console's saga definition, ran and the compensation finished.
    result = page.by_testid("restore-result")
    assert result.get_attribute("data-ok") == "true", result.text
    page.wait(lambda d: status_of(page) == "REVERT_COMPLETED")
    outcomes = [
        r.get_attribute("data-outcome") for r in page.find_all('[data-testid="tryout-row"]')
    ]
    assert "RESTORED" in outcomes, outcomes
    page.screenshot("restored")
    # No longer parked.
    page.open("/frozen")
    page.by_testid("frozen-table")
    ids = {
        r.get_attribute("data-transaction-id") for r in page.find_all('[data-testid="frozen-row"]')
    }
    assert target not in ids
    assert str(console.ids["frozen-2"]) in ids


def test_a_wrong_token_shows_the_refusal_and_changes_nothing(
    page: Page, console: ConsoleUnderTest
) -> None:
    target = console.ids["frozen-2"]
    page.open(f"/sagas/{target}/restore")
    page.by_testid("restore-token").send_keys("not-the-admin-token-at-all")
    page.by_testid("restore-confirm").click()
    page.by_testid("restore-submit").click()
    title = page.by_testid("error-title").text.lower()
    assert any(word in title for word in ("401", "403", "unauthorized", "forbidden")), title
    assert "token" in page.by_testid("error-message").text.lower()
    page.screenshot("refused")
    page.open(f"/sagas/{target}")
    assert status_of(page) == "FROZEN"


def test_the_live_counter_changes_after_starting_sagas(
    page: Page, console: ConsoleUnderTest
) -> None:
    page.open("/live")
    page.wait_text('[data-testid="live-status"]', lambda t: t == "connected")
    # Starts the console has seen since it began counting (the seeded sagas came earlier).
    before = int(page.text_of('[data-testid="live-starts"]'))
    page.screenshot("live-before")
    started = console.start_sagas(3)
    assert len(started) == 3
    # Pushed by the server (SSE) into the open page: no reload.
    after = page.wait_text('[data-testid="live-starts"]', lambda t: int(t) >= before + 3)
    assert int(after) >= before + 3
    page.screenshot("live-after")


def test_frozen_count_matches_the_seeded_sagas_before_any_restore(
    console: ConsoleUnderTest,
) -> None:
    """Guard for the tests above: the seed froze FROZEN sagas (checked via the JSON API)."""
    import json
    import urllib.request

    with urllib.request.urlopen(console.url + "/api/frozen", timeout=60) as response:
        body = json.load(response)
    ids = {r["transaction_id"] for r in body["results"]}
    assert {str(console.ids[k]) for k in ("frozen-2", "frozen-3")} <= ids
    assert FROZEN == 3
