"""Headless Chromium for the web page's tests (``from app.browser import browser``), driven by Selenium.

Chromium and its driver come from Debian's ``chromium`` and ``chromium-driver`` packages; Selenium is given their
paths, so that its Selenium Manager never looks for (or downloads) a browser. Without them a test is skipped, except
in CI (the ``CI`` environment variable set), which installs them: there it fails.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

PACKAGES = "chromium chromium-driver"


def chromium() -> tuple[str, str] | None:
    """The paths of the Chromium binary and of chromedriver, or None when either is not installed."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    return (binary, driver) if binary and driver else None


@contextmanager
def browser() -> Iterator[webdriver.Chrome]:
    """A headless Chromium of 1200×900 pixels, quit at the end; skips the test without Chromium (fails it in CI)."""
    paths = chromium()
    if paths is None:
        message = f"no Chromium: apt-get install {PACKAGES}"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI installs them)")
        pytest.skip(message)
    binary, driver = paths
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1200,900")
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()
