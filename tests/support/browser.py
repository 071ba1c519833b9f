"""Reading a page of the Dagster UI as a person sees it: headless Chromium (Debian's `chromium` and its
`chromedriver`, driven by Selenium; nothing downloads a browser). Screenshots and the pages' text are saved under
`test-artifacts/browser/` (gitignored; CI keeps them).
"""

from __future__ import annotations

import contextlib
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

from tests.support.paths import PROJECT_ROOT
from tests.support.required_tools import BROWSER, CHROMEDRIVER, CHROMIUM, require

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
# The narrowest screen it must read on without sideways scrolling.
NARROW_WIDTH = 1440
# The height of a laptop's first screen at that width (1,440 x 900): the alerts must show within it.
FIRST_SCREEN_HEIGHT = 900
SVG = "{http://www.w3.org/2000/svg}"


@contextlib.contextmanager
def headless_chromium() -> Iterator:
    """A Selenium driver of headless Chromium, its window WINDOW_WIDTH wide; without Chromium the test fails naming
    how to install it (`make test-fast` alone lets it skip: tests.support.required_tools)."""
    require(BROWSER)
    with chromium_driver(WINDOW_WIDTH, 4400) as driver:
        yield driver


@contextlib.contextmanager
def chromium_driver(width: int, height: int) -> Iterator:
    """A Selenium driver of headless Chromium with a window of width x height px, quit on leaving."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, expected: str) -> None:
    """Until `expected` is on the page: the UI fetches its data after the page loads."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, PAGE_TIMEOUT_S, poll_frequency=0.5).until(
        lambda d: expected in d.find_element(By.TAG_NAME, "body").text
    )


def click(driver, text: str) -> None:
    """Click the first element whose own text is `text` (a button or link)."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.XPATH, f"//*[normalize-space(text())='{text}']").click()


def click_materialize_all(driver, base_url: str, selection: str, assets: int, partitions: int) -> None:
    """As an operator launches a backfill in the UI: the global asset lineage, `selection` typed into its asset
    filter, **Materialize all…**, **Confirm** where Dagster warns that an upstream asset is not materialized (the
    pilot, where it is skipped), and in the partitions dialog **All**, then **Launch backfill**. The dialog must say
    `assets` assets and `partitions` partitions; it is saved as the `materialize_all_dialog` artifact."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, PAGE_TIMEOUT_S, poll_frequency=0.5)

    def button(xpath_test: str):
        return wait.until(ready.element_to_be_clickable((By.XPATH, f"//button[{xpath_test}]")))

    def body(d) -> str:
        return d.find_element(By.TAG_NAME, "body").text

    driver.get(f"{base_url}/asset-groups")
    wait.until(ready.element_to_be_clickable((By.CSS_SELECTOR, ".CodeMirror"))).click()  # the asset filter
    ActionChains(driver).send_keys(selection).send_keys(Keys.ENTER).perform()
    wait.until(lambda d: unquote(d.current_url).endswith(f"~{selection}/"))  # applied: the lineage's path names it
    button("starts-with(normalize-space(.), 'Materialize all')").click()
    dialog_title = f"Launch runs to materialize {assets} assets"
    wait.until(lambda d: dialog_title in body(d) or "Confirm" in body(d))
    if dialog_title not in body(driver):
        button("normalize-space(.)='Confirm'").click()
    button("normalize-space(.)='All'").click()
    wait_for(driver, f"{partitions} partitions selected")
    assert dialog_title in save(driver, "materialize_all_dialog")
    button("normalize-space(.)='Launch backfill'").click()
    wait.until(lambda d: dialog_title not in body(d))


def park(driver) -> None:
    """Leave the Dagster UI for a blank page while the test waits on something else: a UI page left open keeps
    asking the webserver for live data (every 2 s) and redrawing, ~4 CPU-s a minute of Chromium and `dagster dev`
    together (measured on the asset lineage of an empty instance), taken from the processes under test."""
    driver.get("about:blank")


def save(driver, name: str) -> str:
    """Screenshot and text of the page as test artifacts; returns the text."""
    from selenium.webdriver.common.by import By

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))
    text = driver.find_element(By.TAG_NAME, "body").text
    (ARTIFACTS / f"{name}.txt").write_text(text)
    return text


def save_element(driver, element, name: str) -> None:
    """Screenshot of one element (the README's picture of the operator page)."""
    element.screenshot(str(ARTIFACTS / f"{name}.png"))


def metadata_table(driver):
    """The table of the latest materialization's metadata on the asset's overview."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.XPATH, f"//table[.//*[normalize-space(text())='{SIX_ANSWERS[0]}']]")


def wait_for_inline_chart(driver) -> None:
    """Until the chart (an SVG data: URI in a Markdown entry) is drawn in place: loaded, with a size."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def drawn(d) -> bool:
        try:
            return any(
                d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", image)
                for image in d.find_elements(By.CSS_SELECTOR, "img[src^='data:image/svg+xml']")
            )
        except StaleElementReferenceException:  # the UI drew the table again meanwhile: look again
            return False

    WebDriverWait(driver, PAGE_TIMEOUT_S, poll_frequency=0.5).until(drawn)


def clipped(driver, table) -> list[str]:
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


def row_bounds(driver, table, key: str) -> tuple[float, float] | None:
    """Where the metadata table's row `key` begins and ends, in px from the top of the page (its element box)."""
    bounds = driver.execute_script(
        """
        const [table, key] = arguments;
        for (const row of table.querySelectorAll(':scope > tbody > tr'))
            if (row.children[0].innerText.trim() === key) {
                const box = row.getBoundingClientRect();
                return [box.top + window.scrollY, box.bottom + window.scrollY];
            }
        return null;
        """,
        table,
        key,
    )
    return tuple(bounds) if bounds else None


def resize(driver, width: int) -> None:
    """The window to `width` px wide, then until the UI has drawn two frames at that width (it lays out on resize)."""
    driver.set_window_size(width, driver.get_window_size()["height"])
    driver.execute_async_script(
        "const done = arguments[0]; requestAnimationFrame(() => requestAnimationFrame(() => done()));"
    )
    assert driver.execute_script("return window.innerWidth") == width


def column_widths(driver, table) -> str:
    """The metadata table's width and its columns' (from its first row), and each image's and table's inside it with
    its row's key and the narrowest it can be drawn (min-content): the widest of those sets the value column's."""
    lines = driver.execute_script(
        """
        const table = arguments[0];
        const cells = [...table.querySelector(':scope > tbody > tr').children].map(c => c.offsetWidth);
        const narrowest = e => { const was = e.style.width; e.style.width = 'min-content';
                                 const width = e.offsetWidth; e.style.width = was; return width; };
        const rows = [...table.querySelectorAll(':scope > tbody > tr')];
        const keyOf = e => rows.find(row => row.contains(e))?.children[0].innerText.trim() || '';
        // At the table's narrowest each column is as narrow as its widest unbreakable content: the row holding it.
        const was = table.style.width;
        table.style.width = 'min-content';
        const narrow = [...table.querySelector(':scope > tbody > tr').children].map(c => c.offsetWidth);
        const setBy = rows.filter(row => {  // the rows whose value, hidden, lets the value column narrow
            const cell = row.children[2], shown = cell.style.display;
            cell.style.display = 'none';
            const narrower = rows.find(other => other !== row).children[2].offsetWidth < narrow[2];
            cell.style.display = shown;
            return narrower;
        }).map(row => row.children[0].innerText.trim());
        table.style.width = was;
        return [
            `metadata table ${table.offsetWidth} px in ${table.parentElement.clientWidth} px; columns ${cells} px`,
            `at its narrowest: columns ${narrow} px; the value column's width set by: ${setBy.join(', ') || '?'}`,
            ...[...table.querySelectorAll('img, table')].map(
                e => `${e.tagName.toLowerCase()} ${e.getAttribute('alt') || keyOf(e)} ${e.offsetWidth} px ` +
                     `(${narrowest(e)} px at narrowest` + (e.tagName === 'TABLE' ? `; columns ${
                        [...(e.querySelector('tr')?.children || [])].map(c => c.offsetWidth)} px)` : ')')),
        ];
        """,
        table,
    )
    return "\n".join(lines) + "\n"


def chart(driver, alt: str) -> ET.Element:
    """The inline chart's SVG, from its data: URI."""
    from selenium.webdriver.common.by import By

    source = driver.find_element(By.CSS_SELECTOR, f"img[alt='{alt}']").get_attribute("src")
    return ET.fromstring(unquote(source.removeprefix("data:image/svg+xml,")))
