#!/usr/bin/env python3
"""The web console in a real browser: headless Chromium, driven over the DevTools protocol on a pipe (standard
library only), against `dpfusion serve` with `[server] http`. Logs in, types a query, waits for its preview (EXPLAIN
DP: price and accuracy, nothing spent), runs it, reads the table with its intervals and the chart, and sees the
budget move; saves a screenshot of each page (to docs/img/ with DPFUSION_BLESS=1, else to a temporary
directory). Fails (exit 1) when any step's element is missing.

    scripts/console-browser.py [path/to/dpfusion]     # default: $CARGO_TARGET_DIR/debug/dpfusion

Chromium: `chromium` or `chromium-browser` on PATH, or $CHROMIUM.
"""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASSWORD = "correct horse battery"
# A guard against a hung step (a missing element fails after it), never a measurement.
STEP_TIMEOUT = 30.0


class Failure(Exception):
    pass


class Browser:
    """Chromium with --remote-debugging-pipe: CDP messages as NUL-terminated JSON on fds 3 (in) and 4 (out)."""

    def __init__(self, binary, profile):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        import fcntl

        high_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 100)
        high_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 100)

        def fds():
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        args = [binary, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--no-first-run", "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={profile}",
                "--window-size=1280,900", "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        for fd in (to_chrome_r, from_chrome_w, high_r, high_w):
            os.close(fd)
        self.buf = b""
        self.next_id = 0
        self.session = None

    def call(self, method, params=None, session=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self.buf:
                chunk = os.read(self.from_chrome, 1 << 16)
                if not chunk:
                    raise Failure("Chromium closed the DevTools pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise Failure(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open(self):
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})

    def js(self, expression):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise Failure(f"script failed: {expression}: {r['exceptionDetails']}")
        return r.get("result", {}).get("value")

    def wait_for(self, what, expression):
        """Polls `expression` until it is truthy; fails naming `what` when it never is."""
        deadline = time.monotonic() + STEP_TIMEOUT
        while time.monotonic() < deadline:
            try:
                value = self.js(expression)
            except Failure:
                value = None
            if value:
                return value
            time.sleep(0.1)
        url = self.js("location.href")
        raise Failure(f"missing: {what} (on {url})")

    def goto(self, url):
        self.call("Page.navigate", {"url": url})
        self.wait_for(f"page {url}", "document.readyState === 'complete' && location.href !== 'about:blank'")

    def type_into(self, selector, text):
        self.wait_for(f"field {selector}", f"!!document.querySelector({json.dumps(selector)})")
        self.js(f"document.querySelector({json.dumps(selector)}).focus()")
        self.call("Input.insertText", {"text": text})

    def click(self, selector):
        self.wait_for(f"button {selector}", f"!!document.querySelector({json.dumps(selector)})")
        self.js(f"document.querySelector({json.dumps(selector)}).click()")

    def text(self, selector):
        return self.wait_for(f"element {selector}",
                             f"(document.querySelector({json.dumps(selector)}) || {{}}).innerText")

    def screenshot(self, path):
        height = self.js("Math.min(document.documentElement.scrollHeight, 2400)")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": 1280, "height": int(height), "deviceScaleFactor": 1, "mobile": False})
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})

    def close(self):
        try:
            self.call("Browser.close", session=False)
        except Failure:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def config(dir):
    text = f"""
[session]
rho = 1.0
default_query_rho = 0.05
mechanism = "gaussian"
delta = 1e-6

[tables.pums]
path = "{ROOT}/examples/data/pums_dup.csv"
format = "csv"
privacy_unit = "pid"
max_rows_per_unit = 2
max_groups_per_unit = 1

[tables.pums.columns]
pid = {{ type = "int64" }}
age = {{ type = "int64", bounds = [0, 100] }}
income = {{ type = "int64", bounds = [0, 500000] }}
sex = {{ type = "int64", domain = [0, 1] }}
race = {{ type = "int64", domain = [1, 2, 3, 4, 5, 6] }}
married = {{ type = "int64", domain = [0, 1] }}
educ = {{ type = "int64", domain = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16] }}

[ledger]
path = "{dir}/ledger.sqlite"

[server]
listen = "127.0.0.1:0"
http = "127.0.0.1:0"
admins = ["alice"]
"""
    path = os.path.join(dir, "server.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def start_server(dpfusion, cfg):
    """`dpfusion serve`; the console's URL from its log."""
    server = subprocess.Popen([dpfusion, "serve", "-c", cfg], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + STEP_TIMEOUT
    while time.monotonic() < deadline:
        line = server.stderr.readline()
        if not line:
            break
        m = re.search(r"web console on (http\S+)", line)
        if m:
            # Keep reading its log, so that the server never blocks on a full pipe.
            import threading
            threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
            return server, m.group(1).rstrip("/")
    server.kill()
    raise Failure("dpfusion serve did not announce its web console")


def drive(b, url, shots):
    b.open()
    b.goto(f"{url}/login")
    b.type_into("#user", "alice")
    b.type_into("#password", PASSWORD)
    b.screenshot(os.path.join(shots, "console-login.png"))
    b.click("#login-button")
    b.wait_for("the Ask page after login", "!!document.querySelector('#sql')")
    b.goto(f"{url}/budget")
    before = b.text("#rho-spent")
    if before.strip() != "0":
        raise Failure(f"a fresh analyst has spent {before}")
    b.goto(f"{url}/")
    b.text("details.table")  # the tables with their policies
    b.type_into("#sql", "SELECT educ, COUNT(*) AS n, AVG(income) AS avg_income FROM pums GROUP BY educ")
    b.wait_for("the preview (EXPLAIN DP)", "!!document.querySelector('#preview #explain')")
    price = b.text("#price-rho")
    if "ρ = 0.05" not in price:
        raise Failure(f"the preview's price: {price}")
    b.text("#accuracy")
    b.screenshot(os.path.join(shots, "console-ask.png"))
    b.click("#run")
    b.wait_for("the released table", "!!document.querySelector('#release')")
    table = b.text("#release")
    if "[" not in table or "avg_income" not in table:
        raise Failure(f"the table has no intervals: {table[:200]}")
    b.wait_for("the chart", "(() => { const i = document.querySelector('#chart');"
                            " return i && i.complete && i.naturalWidth > 0; })()")
    cost = b.text("#cost")
    if "ρ spent 0.05" not in cost:
        raise Failure(f"the cost: {cost}")
    b.screenshot(os.path.join(shots, "console-answer.png"))
    b.goto(f"{url}/budget")
    after = b.text("#rho-spent")
    if after.strip() != "0.05":
        raise Failure(f"the budget did not move: {before} -> {after}")
    b.text("#charges")
    b.wait_for("the budget chart", "!!document.querySelector('#budget-chart polyline')")
    b.screenshot(os.path.join(shots, "console-budget.png"))
    b.goto(f"{url}/owner")
    b.text("#analysts")
    b.screenshot(os.path.join(shots, "console-owner.png"))


def main():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    dpfusion = sys.argv[1] if len(sys.argv) > 1 else os.path.join(target, "debug", "dpfusion")
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("console-browser: no chromium on PATH (apt-get install chromium, or set CHROMIUM)", file=sys.stderr)
        return 1
    # The docs' screenshots are rewritten only when asked (DPFUSION_BLESS=1, as for the generated docs): a test run
    # leaves the work tree as it found it.
    if os.environ.get("DPFUSION_BLESS") == "1":
        shots = os.path.join(ROOT, "docs", "img")
    else:
        shots = os.path.join(tempfile.gettempdir(), "dpfusion-console-screenshots")
    os.makedirs(shots, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dpfusion-console-browser-") as dir:
        cfg = config(dir)
        subprocess.run([dpfusion, "analyst", "add", "alice", "--rho", "1", "--password-stdin", "-c", cfg],
                       input=PASSWORD + "\n", text=True, check=True, stdout=subprocess.DEVNULL)
        server, url = start_server(dpfusion, cfg)
        b = Browser(chromium, os.path.join(dir, "profile"))
        try:
            drive(b, url, shots)
        except Failure as e:
            print(f"console-browser: FAILED: {e}", file=sys.stderr)
            return 1
        finally:
            b.close()
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
    print(f"console-browser: ok (screenshots in {shots})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
