"""The web console in a real browser (Debian's Chromium, driven by
Playwright) against a running `fleet dev` mesh: the overview, the
Operational Racks matrix showing exactly the cells the API derives, an
action clicked that turns its cell pending and then moves without a reload,
a device page, and a read-only token that sees no action. Screenshots go to
the directory given as --shots.

    python3 tests/console/console_browser.py --api URL --token T --read-token R --shots docs
"""
import argparse
import json
import sys
import time
import urllib.request

from playwright.sync_api import sync_playwright

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def get(api, token, path):
    req = urllib.request.Request(api + path, headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def fail(msg):
    print("console-browser: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def wait_for(what, f, within=60.0, every=0.1):
    deadline = time.time() + within
    while time.time() < deadline:
        v = f()
        if v:
            return v
        time.sleep(every)
    fail(f"{what} did not happen within {within:.0f} s")


def login(page, api, token):
    page.goto(api + "/ui/")
    page.fill("#token", token)
    page.click("#login button")
    page.wait_for_selector("#who:not(:empty)", timeout=15000)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--api", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--read-token", required=True)
    ap.add_argument("--site", default="s1")
    ap.add_argument("--shots", required=True)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    a = ap.parse_args()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=a.chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("pageerror", lambda e: fail(f"a script error on the page: {e}"))
        login(page, a.api, a.token)

        # The overview: one card per site, with its status distributions.
        page.wait_for_selector(f".card[data-site='{a.site}']", timeout=15000)
        summary = get(a.api, a.token, f"/api/v1/sites/{a.site}/summary")
        text = page.inner_text(f".card[data-site='{a.site}']")
        if f"{summary['total']} devices" not in text:
            fail(f"the overview card says {text!r}, the API {summary['total']} devices")
        wait_for("the live feed", lambda: "live" in page.inner_text("#live") and "offline" not in page.inner_text("#live"), 20)
        page.screenshot(path=f"{a.shots}/console-overview.png", full_page=True)

        # The matrix shows exactly the cells the API derives.
        page.goto(f"{a.api}/ui/#/racks/{a.site}")
        page.wait_for_selector("table.matrix .cell", timeout=15000)
        want = get(a.api, a.token, f"/api/v1/sites/{a.site}/standup-pipeline/?limit=20")
        cells = [c for r in want["racks"] for c in r["devices"]]
        if not cells:
            fail("the API derives no cell to compare with")
        got = page.eval_on_selector_all(
            "table.matrix .cell",
            "els => els.map(e => [e.dataset.deviceId, e.closest('td').dataset.stage, e.dataset.status])")
        got = {d: (s, st) for d, s, st in got}
        for c in cells:
            g = got.get(c["device_id"])
            # A cell may have moved between the two reads; a mismatch is a
            # failure only if it persists on a fresh read.
            if g != (c["stage"], c["status"]):
                again = {x["device_id"]: x for r in get(a.api, a.token, f"/api/v1/sites/{a.site}/standup-pipeline/?limit=20")["racks"] for x in r["devices"]}
                page.reload()
                page.wait_for_selector("table.matrix .cell", timeout=15000)
                d = page.eval_on_selector(f".cell[data-device-id='{c['device_id']}']",
                                          "e => [e.closest('td').dataset.stage, e.dataset.status]")
                x = again[c["device_id"]]
                if tuple(d) != (x["stage"], x["status"]):
                    fail(f"{c['name']}: the matrix shows {d}, the API {(x['stage'], x['status'])}")
        hover = page.get_attribute(".cell[data-status='succeeded']", "title") or ""
        if "no_next_stage" not in hover:
            fail(f"a terminal cell's hover names no suppression reason: {hover!r}")
        page.screenshot(path=f"{a.shots}/console-matrix.png", full_page=True)

        # An action: the cell turns pending, then moves, with no reload.
        button = page.query_selector("table.matrix .cell button[data-workflow]")
        if button is None:
            fail("no cell offers an action")
        device = button.get_attribute("data-device")
        sel = f".cell[data-device-id='{device}']"
        before = page.eval_on_selector(sel, "e => [e.closest('td').dataset.stage, e.dataset.status]")
        page.evaluate("() => { window.__sameDocument = true; }")
        seen = []

        def status():
            s = page.eval_on_selector(sel, "e => [e.closest('td').dataset.stage, e.dataset.status]") if page.query_selector(sel) else None
            if s and (not seen or seen[-1] != s):
                seen.append(s)
            return s

        button.click()
        wait_for("the cell turning pending", lambda: (status() or [None, None])[1] == "pending", 10, 0.02)
        wait_for("the pending cell moving on",
                 lambda: (s := status()) is not None and s[1] != "pending", 90, 0.2)
        if not page.evaluate("() => window.__sameDocument === true"):
            fail("the page reloaded")
        print(f"console-browser: {device} went {before} -> " + " -> ".join(map(str, seen)))
        page.screenshot(path=f"{a.shots}/console-matrix-after-action.png", full_page=True)

        # A device page: axes, conditions with their decisive flags, jobs.
        page.click(f"{sel} a")
        page.wait_for_selector("h3:has-text('Conditions')", timeout=15000)
        body = page.inner_text("main")
        for word in ["no_schedule_reasons", "operational_status", "Lifecycle", "Jobs"]:
            if word not in body:
                fail(f"the device page shows no {word}")
        page.screenshot(path=f"{a.shots}/console-device.png", full_page=True)

        # A read-only token sees no action buttons.
        ro = browser.new_page(viewport={"width": 1400, "height": 900})
        login(ro, a.api, a.read_token)
        ro.goto(f"{a.api}/ui/#/racks/{a.site}")
        ro.wait_for_selector("table.matrix .cell", timeout=15000)
        if ro.query_selector("button[data-workflow]") is not None:
            fail("a device:read token is offered actions")
        if "no jobs:write" not in ro.inner_text("main"):
            fail("the matrix does not say why a read-only token has no actions")
        # A refused request shows the API's own error.
        ro.goto(f"{a.api}/ui/#/device/no-such-device")
        ro.wait_for_selector("#error:not([hidden])", timeout=15000)
        if "NOT_FOUND" not in ro.inner_text("#error"):
            fail(f"the error banner says {ro.inner_text('#error')!r}")
        browser.close()
    print("console-browser: overview, matrix, action, device page and read-only token checked in Chromium")


if __name__ == "__main__":
    main()
