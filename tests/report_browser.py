"""Open Snakemake's HTML report in headless Chromium and check what a reader sees.

The report is a React app that renders from data embedded in the page, so the raw file says little: this drives a
real browser over the DevTools protocol (through `--remote-debugging-pipe`, so no extra package is needed), clicks
through the menu the way a reader does, and checks the rendered DOM: the page's title and categories, every chart
displayed and decoded by the browser, and every href/src of every view resolving (data: URIs decode, relative links
exist beside the report, in-app javascript: links name a category or result that exists).

`python3 tests/report_browser.py REPORT.html SHOT.png` checks a report and writes a screenshot of its Charts view.
"""
from __future__ import annotations

import base64
import binascii
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

BROWSERS = ("chromium", "chromium-browser", "google-chrome")

# Helpers installed in the page: what a reader can see and click, found by the text the app renders.
PAGE_HELPERS = """window.__report = {
    links: () => [...document.querySelectorAll('[href], [src]')].map(el => el.getAttribute(
        el.hasAttribute('src') ? 'src' : 'href')),
    menuItem: (text) => {
        const a = [...document.querySelectorAll('#app nav li a')].find(a => a.innerText.trim() === text);
        if (a) a.click();
        return Boolean(a);
    },
    home: () => document.querySelector('#app nav nav ol li a').click(),
    rows: () => [...document.querySelectorAll('#app nav table tbody tr')].map(tr => ({
        labels: [...tr.querySelectorAll('td')].slice(0, -1).map(td => td.innerText.trim()),
        view: tr.querySelector('td:last-child a').getAttribute('href')})),
    view: (row) => document.querySelectorAll('#app nav table tbody tr')[row].querySelector('td:last-child a').click(),
    info: (row) => document.querySelectorAll('#app nav table tbody tr')[row].querySelectorAll('td:last-child a')[1]
        .click(),
    caption: () => [...document.querySelectorAll('#app nav .prose')].map(el => el.innerText).join('\\n'),
    toggleValues: () => [...document.querySelectorAll('#app nav fieldset input[type=radio]')].map(i => i.value),
    toggle: (value) => [...document.querySelectorAll('#app nav fieldset input[type=radio]')]
        .find(i => i.value === value).click(),
    shownImage: () => {
        const img = [...document.querySelectorAll('#app img')].find(img => !img.closest('nav'));
        return img && img.complete ? {src: img.getAttribute('src'), width: img.naturalWidth,
                                      height: img.naturalHeight} : null;
    },
};
true"""


def find_chromium() -> str | None:
    """The headless browser on PATH (Debian's `chromium` first), or None."""
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


class BrowserError(RuntimeError):
    pass


class Chromium:
    """A headless Chromium driven over the DevTools protocol on a pipe (fd 3: commands in, fd 4: replies out)."""

    def __init__(self, binary: str, width: int = 1280, height: int = 800, timeout_s: float = 30.0):
        self.binary, self.width, self.height, self.timeout_s = binary, width, height, timeout_s
        self.events: list[dict] = []
        self._replies: queue.Queue = queue.Queue()
        self._next_id = 0
        self.session = None

    def __enter__(self) -> Chromium:
        self._profile = tempfile.TemporaryDirectory(prefix="report-browser-")
        self._log = open(Path(self._profile.name) / "chromium.log", "w+b")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_pipe():
            # Through fresh copies: dup2 onto the same number would keep the close-on-exec flag.
            commands, replies = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(commands, 3)
            os.dup2(replies, 4)

        # --no-sandbox: Chromium's sandbox refuses to start as root, which CI containers often are.
        self.proc = subprocess.Popen(
            [self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
             "--remote-debugging-pipe", f"--user-data-dir={self._profile.name}",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log, close_fds=False,
            preexec_fn=wire_pipe, start_new_session=True)
        os.close(to_browser_r)
        os.close(from_browser_w)
        threading.Thread(target=self._read, daemon=True).start()
        try:
            target = self.call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self.call(f"{domain}.enable")
            self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                      deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.call("Browser.close", session=False)
        except BrowserError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the browser and its renderers: the session it leads
            self.proc.wait()
        os.close(self._to_browser)
        self._log.close()
        self._profile.cleanup()

    def stderr_tail(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:]

    def _read(self) -> None:
        buffer = b""
        with os.fdopen(self._from_browser, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for raw in messages:
                    message = json.loads(raw)
                    (self._replies.put if "id" in message else self.events.append)(message)
        self._replies.put(None)

    def call(self, method: str, session: bool = True, **params) -> dict:
        """Send one protocol command (to the page's session unless session=False) and return its result."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session and self.session:
            message["sessionId"] = self.session
        try:
            os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        except BrokenPipeError:
            raise BrowserError(f"{method}: the browser exited: {self.stderr_tail()}") from None
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                reply = self._replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise BrowserError(f"{method}: no reply within {self.timeout_s} s") from None
            if reply is None:
                raise BrowserError(f"{method}: the browser exited: {self.stderr_tail()}")
            if reply["id"] == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, what: str):
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.05)
        raise BrowserError(f"timed out after {self.timeout_s} s waiting for {what}")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", f"{url} to load")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def errors(self) -> list[str]:
        """Uncaught exceptions and console or browser errors the page produced so far."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(details.get("exception", {}).get("description") or details.get("text", ""))
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                found.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(params["entry"]["text"])
        return found


def decode_data_uri(uri: str) -> tuple[str, bytes]:
    """(media type, bytes) of a data: URI; ValueError when it does not decode."""
    m = re.fullmatch(r"data:([^,]*?),(.*)", uri, re.S)
    if not m:
        raise ValueError("no ',' separating the header from the data")
    header, payload = m.group(1).split(";"), m.group(2)
    if header[-1] == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except binascii.Error as err:
            raise ValueError(f"bad base64: {err}") from None
    else:
        data = unquote(payload).encode()
    return header[0] or "text/plain", data


MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff", "application/pdf": b"%PDF"}


def link_problem(url: str, base: Path, app_names: dict[str, set[str]]) -> str | None:
    """Why a link of the rendered report does not resolve, or None when it does. `app_names` holds the report's
    categories and result paths, which its in-app javascript: links must name."""
    if url in ("", "#"):
        return None  # a button handled by the app's click handler
    if url.startswith("data:"):
        try:
            mime, data = decode_data_uri(url)
        except ValueError as err:
            return f"data URI does not decode: {err}"
        if not data:
            return "data URI is empty"
        if mime in MAGIC and not data.startswith(MAGIC[mime]):
            return f"data URI says {mime} but holds {data[:8]!r}"
        if mime == "image/svg+xml" and b"<svg" not in data[:2000]:
            return "data URI says image/svg+xml but holds no <svg"
        return None
    if url.startswith("javascript:"):
        m = re.fullmatch(r"javascript:(?:app\.)?(\w+)\('([^']*)'\)", url)
        if not m:
            return "unrecognised javascript: link"
        kind, name = {"showCategory": "categories", "showResultInfo": "results",
                      "show_panel": "panels"}.get(m.group(1), m.group(1)), unquote(m.group(2))
        if kind == "panels":
            return "show_panel is not defined by the report app"
        if name not in app_names.get(kind, set()):
            return f"names {kind[:-1]} {name!r}, which the report does not have"
        return None
    parsed = urlparse(url)
    if parsed.scheme in ("http", "https"):
        return None if parsed.netloc else "web link without a host"
    if parsed.scheme not in ("", "file"):
        return f"unsupported scheme {parsed.scheme!r}"
    target = Path(unquote(parsed.path)) if parsed.scheme == "file" else base / unquote(parsed.path)
    return None if target.exists() else f"{target} does not exist"


@dataclass
class RenderedReport:
    """What the browser showed: title, workflow text, categories and their items, chart images as decoded by the
    browser, every link seen in any view with what is wrong with it, and the page's errors."""
    title: str = ""
    workflow_text: str = ""
    menu_text: str = ""
    categories: dict[str, list[str]] = field(default_factory=dict)
    embedded: dict[str, dict] = field(default_factory=dict)
    images_shown: dict[str, dict] = field(default_factory=dict)
    links: dict[str, str | None] = field(default_factory=dict)
    web_links: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    @property
    def broken_links(self) -> dict[str, str]:
        return {url[:120]: why for url, why in self.links.items() if why}


def render_report(html: Path, browser: str, screenshot: Path | None = None,
                  screenshot_result: str | None = None) -> RenderedReport:
    """Open `html` in headless Chromium and do what a reader does: open every category (and subcategory) from the
    menu, flip every toggle (PNG/SVG), and press every item's view button; images are shown and must decode in the
    browser, other items link to their data URI. The screenshot, when asked for, shows `screenshot_result` (a
    result path) open in its category."""
    html = html.resolve()
    seen = RenderedReport()
    with Chromium(browser) as page:
        page.open(html.as_uri())
        page.wait_for("document.querySelector('#app nav li a') !== null", "the report app to render its menu")
        page.evaluate(PAGE_HELPERS)
        seen.title = page.evaluate("document.title")
        seen.menu_text = page.evaluate("document.querySelector('#app nav').innerText")
        seen.workflow_text = page.wait_for("document.querySelector('#app .prose') && "
                                           "document.querySelector('#app .prose').innerText", "the workflow text")
        seen.embedded = page.evaluate("""Object.fromEntries(Object.entries(results).map(([path, r]) =>
            [path, {name: r.name, mime: r.mime_type, caption: r.caption, labels: r.labels, data_uri: r.data_uri}]))""")
        by_uri = {r["data_uri"]: path for path, r in seen.embedded.items()}
        category_items = page.evaluate("categories")
        app_names = {"categories": set(category_items), "results": set(seen.embedded)}

        def collect_links():
            for url in page.evaluate("__report.links()"):
                if url not in seen.links:
                    seen.links[url] = link_problem(url, html.parent, app_names)
                    if urlparse(url).scheme in ("http", "https"):
                        seen.web_links.add(url)

        def visit_rows(category):
            for toggle in page.evaluate("__report.toggleValues()") or [None]:
                if toggle:
                    page.evaluate(f"__report.toggle({json.dumps(toggle)})")
                for index, row in enumerate(page.evaluate("__report.rows()")):
                    collect_links()
                    if row["view"] != "#":  # not an image: the button links to the item's data URI
                        path = by_uri.get(row["view"])
                        if path is None:
                            raise BrowserError(f"{category}: row {row['labels']} links to no embedded result")
                        seen.categories[category].append(path)
                        continue
                    before = page.evaluate("__report.shownImage()")
                    page.evaluate(f"__report.view({index})")
                    shown = page.wait_for(
                        "(() => { const now = __report.shownImage(); return now && (" + json.dumps(before) +
                        " === null || now.src !== " + json.dumps((before or {}).get("src")) + ") ? now : null; })()",
                        f"{category}: the image of row {row['labels']}")
                    path = by_uri.get(shown.pop("src"))
                    if path is None:
                        raise BrowserError(f"{category}: row {row['labels']} shows an image that is no result")
                    seen.images_shown[path] = shown
                    seen.categories[category].append(path)
                    collect_links()
                    if screenshot and path == screenshot_result:
                        page.evaluate(f"__report.info({index})")  # the item's caption beside it
                        page.wait_for("__report.caption()", f"the caption of {path}")
                        time.sleep(0.3)
                        page.screenshot(screenshot)
                        page.evaluate("__report.home()")
                        page.wait_for(f"__report.menuItem({json.dumps(category)})", f"{category} again")
                        page.wait_for("__report.rows().length > 0", f"the items of {category}")
                        if toggle:
                            page.evaluate(f"__report.toggle({json.dumps(toggle)})")

        collect_links()
        for item in ("Statistics", "About"):  # the other views a reader can open from the menu
            if not page.evaluate(f"__report.menuItem({json.dumps(item)})"):
                raise BrowserError(f"the menu has no item {item!r}")
            time.sleep(0.3)
            collect_links()
            page.evaluate("__report.home()")
            page.wait_for("document.querySelector('#app nav li a') !== null", "the menu again")
        for category, subcategories in sorted(category_items.items()):
            seen.categories[category] = []
            for sub in sorted(subcategories):
                if not page.evaluate(f"__report.menuItem({json.dumps(category)})"):
                    raise BrowserError(f"the menu has no item {category!r}")
                if len(subcategories) > 1:
                    page.wait_for(f"__report.menuItem({json.dumps(sub)})", f"subcategory {category}/{sub}")
                page.wait_for("__report.rows().length > 0", f"the items of {category}/{sub}")
                visit_rows(category)
                page.evaluate("__report.home()")
                page.wait_for(f"__report.links() && [...document.querySelectorAll('#app nav li a')]"
                              f".some(a => a.innerText.trim() === {json.dumps(category)})", "the menu again")
        seen.errors = page.errors()
    return seen


if __name__ == "__main__":
    report, shot = Path(sys.argv[1]), Path(sys.argv[2])
    browser = find_chromium()
    if not browser:
        sys.exit("no chromium on PATH")
    chart = sys.argv[3] if len(sys.argv) > 3 else "results/report/throughput_vs_concurrency.png"
    rendered = render_report(report, browser, shot, chart)
    print(json.dumps({"title": rendered.title, "categories": rendered.categories,
                      "images": rendered.images_shown, "broken": rendered.broken_links,
                      "web_links": sorted(rendered.web_links), "errors": rendered.errors}, indent=1))
