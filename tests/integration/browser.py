"""Headless chromium for the playground's tests (Debian's chromium and chromedriver, driven by Selenium): the
browser with its background networking off, waiting on the page's own state, and the origins it loaded.

CI (CI=true) must have chromium and chromedriver (`.ci/run` installs Debian's `chromium` and `chromium-driver`):
there the tests fail instead of skipping."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time

import pytest

FLAGS = (
    '--headless=new',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-dev-shm-usage',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--disable-default-apps',
    '--disable-extensions',
    '--window-size=1280,900',
)


def browser_or_skip():
    chromium = shutil.which('chromium') or shutil.which('chromium-browser')
    driver = shutil.which('chromedriver')
    try:
        from selenium import webdriver
    except ImportError:
        webdriver = None
    if not (chromium and driver and webdriver):
        message = (
            'the browser test needs chromium and chromedriver (apt-get install -y chromium chromium-driver) '
            "and selenium (the 'test' extra)"
        )
        if os.environ.get('CI', '').lower() == 'true':
            pytest.fail(f'{message}; CI must run it, see .ci/run')
        pytest.skip(message)
    return chromium, driver, webdriver


@contextlib.contextmanager
def headless_chromium(profile):
    """A headless chromium with its own profile folder, logging its network requests and console."""
    chromium, driver, webdriver = browser_or_skip()
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*FLAGS, f'--user-data-dir={profile}'):
        options.add_argument(flag)
    options.set_capability('goog:loggingPrefs', {'performance': 'ALL', 'browser': 'ALL'})
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield chrome
    finally:
        chrome.quit()


def wait(browser, condition, seconds=60, what='the page', error_id='error'):
    """Polls the page's own state (a script's value) until it is truthy: the page says when it is done."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = browser.execute_script(condition)
        if value:
            return value
        time.sleep(0.1)
    shown = browser.find_element('id', error_id).text
    raise AssertionError(f'timed out waiting for {what}; page error: {shown!r}')


def origins_loaded(browser) -> set[str]:
    """The origins of every network request the page made (data:, blob: and chrome's own pages left out)."""
    origins = set()
    for entry in browser.get_log('performance'):
        message = json.loads(entry['message'])['message']
        if message['method'] == 'Network.requestWillBeSent':
            url = message['params']['request']['url']
            if url.startswith(('http:', 'https:', 'ws:', 'wss:')):
                origins.add('/'.join(url.split('/')[:3]))
    return origins


def severe_console_errors(browser) -> list:
    """The console's errors, but for the failed /v1 requests a test provokes on purpose."""
    return [e for e in browser.get_log('browser') if e['level'] == 'SEVERE' and '/v1/' not in e['message']]
