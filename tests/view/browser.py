"""Headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by Selenium; tests
skip with the reason where either is missing."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

#: where screenshots land (a CI job keeps this folder as its artifacts)
ARTIFACTS = Path(
    os.environ.get("RAG_GYM_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts")
)


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


def missing() -> str | None:
    """Why the browser tests cannot run, or ``None``."""
    if importlib.util.find_spec("selenium") is None:
        return "needs selenium: pip install 'rag-gym[test]'"
    if _chromium() is None:
        return "needs Debian's chromium: apt-get install chromium chromium-driver"
    if shutil.which("chromedriver") is None:
        return "needs Debian's chromium-driver: apt-get install chromium-driver"
    return None


def chrome(width: int = 1400, height: int = 1000):
    """A headless Chromium WebDriver that records the page's console."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _chromium()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-extensions",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


requires_chromium = pytest.mark.skipif(missing() is not None, reason=missing() or "")
