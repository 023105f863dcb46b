"""Open a Snakemake HTML report in headless Chromium and list the figures a user can display
in it: for every category and subcategory of the report's menu, click each result's view
button and record the image shown (decoded, non-zero size)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest


def _driver():
    required = bool(os.environ.get("DCHAG_REQUIRE_BROWSER"))  # set by .ci/run: CI must not skip this
    if required:
        from selenium import webdriver
    else:
        webdriver = pytest.importorskip("selenium.webdriver")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    chromedriver = shutil.which("chromedriver")
    if not (chromium and chromedriver):
        if required:
            raise AssertionError("DCHAG_REQUIRE_BROWSER is set but chromium/chromedriver are not installed")
        pytest.skip("no headless browser (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1600,1000",
    ):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(chromedriver), options=opts)


def _wait(fn, timeout=30.0):
    end = time.time() + timeout
    while time.time() < end:
        value = fn()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("timed out waiting for the report to render")


def figures_shown(report: Path) -> list[str]:
    from selenium.webdriver.common.by import By

    driver = _driver()
    shown = []
    try:
        driver.get(Path(report).resolve().as_uri())
        _wait(
            lambda: driver.execute_script(
                "return document.querySelector('#app') && document.querySelector('#app').children.length > 0"
            )
        )
        categories = driver.execute_script(
            "return Object.fromEntries(Object.entries(categories).map(([c, s]) => [c, Object.keys(s)]))"
        )
        for category, subcategories in categories.items():
            for sub in subcategories:
                # The menu: category, then subcategory (a single-subcategory category opens directly).
                driver.execute_script("app.setView({navbarMode: 'menu'})")
                top = _wait(
                    lambda: driver.find_elements(
                        By.XPATH, f"//a[normalize-space()='{category}' or normalize-space()='Results']"
                    )
                )
                if all(a.text.strip() == "Results" for a in top):  # a report with one category lists it under "Results"
                    top[0].click()
                _wait(lambda: driver.find_elements(By.XPATH, f"//a[normalize-space()='{category}']"))[0].click()
                if len(subcategories) > 1:
                    link = _wait(lambda: driver.find_elements(By.XPATH, f"//a[normalize-space()='{sub}']"))
                    link[0].click()
                rows = _wait(lambda: driver.find_elements(By.XPATH, "//table//tr[td]"))
                for i in range(len(rows)):
                    row = driver.find_elements(By.XPATH, "//table//tr[td]")[i]
                    if ".png" not in row.text:
                        continue
                    row.find_element(By.TAG_NAME, "a").click()
                    img = _wait(
                        lambda: [
                            im
                            for im in driver.find_elements(By.TAG_NAME, "img")
                            if driver.execute_script(
                                "return arguments[0].complete && arguments[0].naturalWidth > 0"
                                " && arguments[0].src.startsWith('data:image/png')",
                                im,
                            )
                        ]
                    )
                    if img:
                        name = driver.execute_script("return results[app.state.resultPath].name")
                        shown.append(name)
                    driver.execute_script("app.setView({content: 'rulegraph'})")
    finally:
        driver.quit()
    return shown
