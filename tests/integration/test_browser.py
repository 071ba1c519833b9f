"""The operator's page in a real browser: headless Chromium (Debian's `chromium` and its `chromedriver`, driven by
Selenium; nothing downloads a browser) opens `dagster dev`, loads the `run_report` asset page and a completions
partition page, and reads what a person would see there.

`run_report` is materialized with a plan and a price, one shard is generated, assembled and exported (the
`shard_job`), and `run_report` is materialized again, all through the Dagster CLI on the instance `dagster dev`
serves. The test asserts that the asset's overview shows, in place and without opening a dialog, the six answers,
the per-server table, cost and the chart of the run (an inline SVG image with axes); that at 1,600 px nothing of
the page needs sideways scrolling; screenshots and the pages' text are saved under `test-artifacts/browser/`
(gitignored; CI keeps them).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

from dagster_project.ops.plan import Plan, write_plan
from dagster_project.store.storage import LocalStore
from tests.support.dagster_helpers import (
    DAGSTER,
    FAST_ANSWERS,
    DagsterDev,
    dagster_home,
    pipeline_env,
    publish_conversations,
    run_cli,
)
from tests.support.paths import PROJECT_ROOT
from tests.support.sglang_fixtures import wait_until

CHROMIUM = Path(os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("CHROMEDRIVER_BIN", "/usr/bin/chromedriver"))
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR", PROJECT_ROOT / "test-artifacts")) / "browser"
SIX_ANSWERS = (
    "1. Progress vs plan",
    "2. MTP (speculative decoding)",
    "3. Concurrency per server",
    "4. Storage",
    "5. Coverage",
    "6. Multi-turn",
)
PAGE_TIMEOUT_S = 60
# An operator's screen: the page must read without sideways scrolling at this width (and up to 1,920 px).
WINDOW_WIDTH = 1600
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def browser() -> Iterator:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        if os.environ.get("REQUIRE_BROWSER"):
            pytest.fail(f"no {CHROMIUM} or {CHROMEDRIVER}: apt-get install -y chromium chromium-driver")
        pytest.skip(f"no {CHROMIUM} or {CHROMEDRIVER} (apt-get install -y chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={WINDOW_WIDTH},4400"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _wait_for(driver, expected: str) -> None:
    """Until `expected` is on the page: the UI fetches its data after the page loads."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, PAGE_TIMEOUT_S, poll_frequency=0.5).until(
        lambda d: expected in d.find_element(By.TAG_NAME, "body").text
    )


def _click(driver, text: str) -> None:
    """Click the first element whose own text is `text` (a button or link)."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.XPATH, f"//*[normalize-space(text())='{text}']").click()


def _save(driver, name: str) -> str:
    """Screenshot and text of the page as test artifacts; returns the text."""
    from selenium.webdriver.common.by import By

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))
    text = driver.find_element(By.TAG_NAME, "body").text
    (ARTIFACTS / f"{name}.txt").write_text(text)
    return text


def _save_element(driver, element, name: str) -> None:
    """Screenshot of one element (the README's picture of the operator page)."""
    element.screenshot(str(ARTIFACTS / f"{name}.png"))


def _metadata_table(driver):
    """The table of the latest materialization's metadata on the asset's overview."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.XPATH, f"//table[.//*[normalize-space(text())='{SIX_ANSWERS[0]}']]")


def _wait_for_inline_chart(driver) -> None:
    """Until the chart (an SVG data: URI in a Markdown entry) is drawn in place: loaded, with a size."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, PAGE_TIMEOUT_S, poll_frequency=0.5).until(
        lambda d: any(
            d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", image)
            for image in d.find_elements(By.CSS_SELECTOR, "img[src^='data:image/svg+xml']")
        )
    )


def _clipped(driver, table) -> list[str]:
    """What of the metadata table is cut off at the right: the table's scrolling container, or any element inside it,
    whose content is wider than its box (scrollWidth > clientWidth), named by its row's key."""
    return driver.execute_script(
        """
        const table = arguments[0], out = [];
        const container = table.parentElement;
        if (container.scrollWidth > container.clientWidth + 1)
            out.push(`the metadata table: ${container.scrollWidth} px in ${container.clientWidth} px`);
        for (const row of table.querySelectorAll(':scope > tbody > tr')) {
            const key = row.children[0].innerText.trim();
            for (const el of row.querySelectorAll('*'))
                if (el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1)
                    out.push(`${key}: <${el.tagName.toLowerCase()}> ${el.scrollWidth} px in ${el.clientWidth} px`);
        }
        return out;
        """,
        table,
    )


def _chart(driver, alt: str) -> ET.Element:
    """The inline chart's SVG, from its data: URI."""
    from selenium.webdriver.common.by import By

    source = driver.find_element(By.CSS_SELECTOR, f"img[alt='{alt}']").get_attribute("src")
    return ET.fromstring(unquote(source.removeprefix("data:image/svg+xml,")))


def _runs_with_purpose(dev: DagsterDev, purpose: str, count: int) -> list[dict] | None:
    """The runs tagged `dflash/purpose: <purpose>`, once there are `count` of them."""
    result = dev.query("{ runsOrError { ... on Runs { results { runId jobName tags { key value } } } } }")
    runs = [
        run for run in result["runsOrError"]["results"] if {"key": "dflash/purpose", "value": purpose} in run["tags"]
    ]
    return runs if len(runs) >= count else None


def _dismiss_welcome(driver) -> None:
    """The UI greets a new browser with a newsletter dialog over the page."""
    from selenium.common.exceptions import NoSuchElementException

    try:
        _click(driver, "Skip")
    except NoSuchElementException:
        pass


def test_the_operator_page_renders_the_six_answers_and_the_per_server_table(sim_fleet, browser, tmp_path, request):
    from selenium.webdriver.common.by import By

    fleet = sim_fleet(2, **FAST_ANSWERS, enable_metrics=True)
    home = dagster_home(tmp_path / "dagster_home")
    # A store path as long as a production one (s3://bucket/prefix): pytest's temporary path is twice that, and a
    # path cannot wrap, so it alone would widen the page.
    store = Path(tempfile.mkdtemp(prefix="store-"))
    request.addfinalizer(lambda: shutil.rmtree(store, ignore_errors=True))
    env = pipeline_env(
        home=home,
        store=store,
        work_dir=tmp_path / "work",
        num_shards=2,
        endpoints=fleet.urls,
        extra={"DFLASH_COST_PER_GPU_HOUR": "3.50"},
    )
    publish_conversations(home, store, env)
    write_plan(
        LocalStore(store), Plan(source="browser test", req_per_s=20.0, avg_output_tokens=100, output_tok_per_s=2000)
    )
    materialize_report = [
        DAGSTER,
        "asset",
        "materialize",
        "-m",
        "dagster_project.definitions",
        "--select",
        "run_report",
    ]
    run_cli(materialize_report, env=env, cwd=tmp_path, timeout_s=300)  # before the shard: the inline chart's start
    shard_job = [DAGSTER, "job", "execute", "-m", "dagster_project.definitions", "-j", "shard_job"]
    run_cli([*shard_job, "--tags", '{"dagster/partition": "shard-00000"}'], env=env, cwd=tmp_path, timeout_s=300)
    run_cli(materialize_report, env=env, cwd=tmp_path, timeout_s=300)

    with DagsterDev.running(env, tmp_path) as dev:
        base = f"http://127.0.0.1:{dev.port}"
        browser.get(f"{base}/assets/run_report")
        try:
            _wait_for(browser, SIX_ANSWERS[-1])  # on the asset's overview, in its latest materialization's metadata
            _wait_for_inline_chart(browser)
            _dismiss_welcome(browser)  # it opens a while after the page: now, rather than in the screenshots
        finally:
            report = _save(browser, "run_report")
        table = _metadata_table(browser)
        _save_element(browser, table, "operator_page")
        # At 1,600 px every answer reads without sideways scrolling: no value cut off at the right.
        assert browser.execute_script("return window.innerWidth") == WINDOW_WIDTH
        assert _clipped(browser, table) == []
        # All of it in place, none in a dialog (the UI's newsletter dialog for a new browser may open any time).
        dialogs = browser.find_elements(By.CSS_SELECTOR, "[role='dialog']")
        assert not any(SIX_ANSWERS[0] in dialog.text for dialog in dialogs)
        for answer in SIX_ANSWERS:
            assert answer in report, answer
        # The per-server tables, drawn in place: their headers and one row per server of the fleet.
        assert "running/cap" in report and "what limits it now; its cap" in report
        for url in fleet.urls:
            assert url.removeprefix("http://") in report, url
        assert "$7.00" in report  # the fleet's $/hour: 2 servers at $3.50 per GPU-hour
        assert "×plan" in report and " UTC" in report and "{" not in report
        # Only the whole page in one document (the `report` entry, to copy) still opens in a dialog.
        assert report.count("[Show Markdown]") == 1
        assert "Events done (blue)" in report and "dashed: the plan, 20 req/s" in report  # the chart's caption
        # The chart has axes: their lines, round tick labels on both, the time's unit and the values' title.
        chart = _chart(browser, "events done over time")
        labels = [text.text for text in chart.iter(f"{SVG}text")]
        assert chart.find(f"{SVG}path") is not None and labels[0] == "events done" and "0" in labels
        assert any(label.endswith(" min") for label in labels), labels

        browser.get(f"{base}/assets/completions?partition=shard-00000")
        try:
            _wait_for(browser, "output_tok_per_s")
        finally:
            partition = _save(browser, "completions_shard-00000")
        assert "shard-00000" in partition and "spec_accept_length" in partition

        # The asset page's Materialize button: Dagster runs it in its hidden asset job, which the asset tags.
        browser.get(f"{base}/assets/run_report")
        _wait_for(browser, SIX_ANSWERS[-1])
        _dismiss_welcome(browser)  # if it opened late, it would take the click
        _click(browser, "Materialize")
        runs = wait_until(
            lambda: _runs_with_purpose(dev, "materialize run_report", count=3),
            timeout_s=PAGE_TIMEOUT_S * 3,
            interval_s=1.0,
            what="the run launched from the asset page to be tagged",
        )
        assert {run["jobName"] for run in runs} == {"__ASSET_JOB"}  # two from the CLI, one from the button
        assert _runs_with_purpose(dev, "shard", count=1)[0]["jobName"] == "shard_job"
        browser.get(f"{base}/runs")
        try:
            _wait_for(browser, "materialize run_report")
        finally:
            _save(browser, "runs")
    if os.environ.get("UPDATE_README_SCREENSHOT"):  # refresh the README's picture: UPDATE_README_SCREENSHOT=1
        shutil.copyfile(ARTIFACTS / "operator_page.png", PROJECT_ROOT / "docs" / "images" / "operator_page.png")
