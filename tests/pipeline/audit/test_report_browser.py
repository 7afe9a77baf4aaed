"""The audit report in a real browser: headless Chromium over the DevTools protocol.

Chromium is driven through ``--remote-debugging-pipe`` (JSON messages over
two file descriptors), so the test needs no driver and no websocket client.
It checks what a person would see: the page loads, every <img> decoded
(``naturalWidth > 0``), nothing was requested from outside the file, no
console error or CSP violation, and a screenshot that is not blank.

Chromium is Debian's package (``scripts/install_chromium.sh``); without it
the test is skipped. Set ``AUDIT_SCREENSHOT_DIR`` to keep the screenshots.
"""

import base64
import importlib.util
import json
import os
import select
import shlex
import shutil
import subprocess
import time

import pytest
from PIL import Image

from pipeline.audit import auditor as audit
from tests import images as made

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
TIMEOUT_S = 90.0

# A real browser: CI's integration run. The light twin in the default run is tests/pipeline/audit/test_audit.py,
# which checks the same page's HTML, its policy and every inlined image without rendering it.
pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} absent: run scripts/install_chromium.sh")]


def _fixtures():
    """The stats fixture of test_audit.py, loaded by path (tests/ is not a package)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_audit.py")
    spec = importlib.util.spec_from_file_location("audit_stats_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Chromium:
    """A headless Chromium with a DevTools connection over a pipe."""

    def __init__(self, profile_dir, width=1280, height=900):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        flags = [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
            f"--user-data-dir={profile_dir}", f"--window-size={width},{height}",
            "--remote-debugging-pipe", "about:blank",
        ]
        # Chromium reads commands on fd 3 and writes replies on fd 4 (bash, not
        # dash: dash cannot redirect from descriptors above 9).
        command = " ".join(shlex.quote(a) for a in [CHROMIUM] + flags)
        command = f"exec {command} 3<&{to_chrome_r} 4>&{from_chrome_w}"
        self.process = subprocess.Popen(
            ["/bin/bash", "-c", command], pass_fds=(to_chrome_r, from_chrome_w),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events = []

    def _read_message(self, deadline):
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no reply from chromium")
            ready, _, _ = select.select([self._from_chrome], [], [], remaining)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the pipe: " + self.process.stderr.read().decode(errors="replace")[-2000:])
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method, params=None, session=None, timeout=TIMEOUT_S):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method, session, timeout=TIMEOUT_S):
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method and event.get("sessionId") == session:
                return event
        while True:
            event = self._read_message(deadline)
            self.events.append(event)
            if event.get("method") == method and event.get("sessionId") == session:
                return event

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stderr.close()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


def open_page(url, profile_dir, full_page_path=None, top_path=None):
    """Loads ``url``; returns (image states, events, page height)."""
    browser = Chromium(profile_dir)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Page.navigate", {"url": url}, session=session)
        browser.wait_for("Page.loadEventFired", session)
        images = browser.send(
            "Runtime.evaluate",
            {"expression": "Array.from(document.images).map(i => ({src: i.currentSrc.slice(0, 40), "
                           "complete: i.complete, width: i.naturalWidth, height: i.naturalHeight}))",
             "returnByValue": True},
            session=session,
        )["result"]["value"]
        height = browser.send(
            "Runtime.evaluate", {"expression": "document.documentElement.scrollHeight", "returnByValue": True},
            session=session,
        )["result"]["value"]
        if top_path:
            shot = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)
            with open(top_path, "wb") as handle:
                handle.write(base64.b64decode(shot["data"]))
        if full_page_path:
            clip = {"x": 0, "y": 0, "width": 1280, "height": min(height, 12000), "scale": 0.5}
            shot = browser.send(
                "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}, session=session
            )
            with open(full_page_path, "wb") as handle:
                handle.write(base64.b64decode(shot["data"]))
        return images, [e for e in browser.events if e.get("sessionId") == session], height
    finally:
        browser.close()


def _errors(events):
    errors = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            errors.append(params["exceptionDetails"].get("text"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(json.dumps(params.get("args")))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            errors.append(params["entry"].get("text"))
        elif method == "Network.loadingFailed":
            errors.append(f"load failed: {params.get('errorText')}")
    return errors


def _requested_urls(events):
    return [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"]


def _not_blank(png_path):
    img = Image.open(png_path).convert("L")
    lo, hi = img.getextrema()
    return img.size[0] > 100 and img.size[1] > 100 and hi - lo > 100


@pytest.fixture
def profile_dir(tmp_path):
    path = tmp_path / "chromium-profile"
    path.mkdir()
    return str(path)


def test_report_renders_in_chromium_with_every_image_loaded(tmp_path, profile_dir):
    fixtures = _fixtures()
    fixtures.write_fixture_stats(tmp_path / "corpus")
    report = audit.render_report(str(tmp_path / "corpus"))
    top, full = tmp_path / "report_top.png", tmp_path / "report_full.png"
    images, events, height = open_page("file://" + report, profile_dir, full_page_path=str(full), top_path=str(top))

    samples = fixtures.make_samples()
    expected = 8 + sum(1 for s in samples if s["thumbnail"]) + 2 * len(fixtures.make_near_duplicates())
    assert len(images) == expected
    broken = [i for i in images if not (i["complete"] and i["width"] > 0 and i["height"] > 0)]
    assert broken == []
    assert _errors(events) == []
    outside = [u for u in _requested_urls(events) if not u.startswith(("file://", "data:"))]
    assert outside == []
    assert height > 2000  # all sections laid out, not an error page
    assert _not_blank(top) and _not_blank(full)
    keep = os.environ.get("AUDIT_SCREENSHOT_DIR")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(top, keep)
        shutil.copy(full, keep)


def test_browser_check_catches_a_broken_image(tmp_path, profile_dir):
    # The checks above must be able to fail: a page with an undecodable
    # data: image and an external image reports both.
    page = tmp_path / "broken.html"
    good = "data:image/png;base64," + base64.b64encode(made.solid((4, 3), (10, 200, 30), "PNG")).decode()
    page.write_text(
        f'<!DOCTYPE html><html><body><img src="{good}"><img src="data:image/jpeg;base64,AAAA">'
        '<img src="http://127.0.0.1:9/nothing.png"></body></html>'
    )
    images, events, _ = open_page("file://" + str(page), profile_dir)
    assert [i["width"] > 0 for i in images] == [True, False, False]
    assert any(u.startswith("http://127.0.0.1") for u in _requested_urls(events))


def test_the_threshold_explorer_renders_in_chromium(sample_build, tmp_path, profile_dir):
    """The explorer of a real build: one decoded curve per threshold, inside the whole report and on its own."""
    output, _ = sample_build
    stats = tmp_path / "stats"
    shutil.copytree(output / "stats", stats)
    report = audit.render_report(str(stats))
    page = open(report).read()
    curves = page.count('alt="written vs ')
    assert curves == 10, curves  # every threshold the sample's build answers
    images, events, _ = open_page("file://" + report, profile_dir)
    assert len(images) == page.count("<img ") and all(i["complete"] and i["width"] > 0 for i in images)
    assert _errors(events) == []
    start = page.index('<h2 id="thresholds">')
    alone = tmp_path / "explorer.html"
    alone.write_text(page[:page.index("<body>") + 6] + page[start:page.index("<h2", start + 4)] + "</body></html>")
    shot = tmp_path / "explorer.png"
    images, events, _ = open_page("file://" + str(alone), profile_dir, top_path=str(shot))
    assert len(images) == curves and all(i["complete"] and i["width"] > 300 for i in images)
    assert _errors(events) == [] and _not_blank(shot)
    keep = os.environ.get("AUDIT_SCREENSHOT_DIR")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(shot, keep)


BLUR_STATES = ("Array.from(document.querySelectorAll('label.reveal img')).map("
               "i => getComputedStyle(i).filter)")


def test_nsfw_thumbnails_are_blurred_until_clicked(tmp_path, profile_dir):
    from tests.pipeline.audit.test_nsfw_section import make_nsfw_gallery

    fixtures = _fixtures()
    stats = fixtures.write_fixture_stats(tmp_path / "corpus", omit=fixtures.NO_PLOTS)
    with open(os.path.join(stats, "nsfw_gallery.jsonl"), "w") as handle:
        handle.write("".join(json.dumps(row) + "\n" for row in make_nsfw_gallery()))
    report = audit.render_report(str(tmp_path / "corpus"))
    browser = Chromium(profile_dir)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        browser.send("Page.enable", session=session)
        browser.send("Page.navigate", {"url": "file://" + report}, session=session)
        browser.wait_for("Page.loadEventFired", session)

        def states(expression=BLUR_STATES):
            return browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                session=session)["result"].get("value")

        before = states()
        assert len(before) >= 6 and all(f.startswith("blur(") for f in before), before
        states("document.querySelectorAll('label.reveal')[1].click()")
        after = states()
        assert after[1] == "none" and after[:1] + after[2:] == before[:1] + before[2:]  # only the clicked one
        states("document.querySelectorAll('label.reveal')[1].click()")
        assert states() == before  # a second click blurs it again
    finally:
        browser.close()
