"""The HTML report of a real matrix with one failing case, opened in a real headless
Chromium (Debian's, driven by Playwright): the page loads from the file alone, the
heatmap has one cell per case, clicking the failing cell opens its details and replay
command, ``report.html#CASE_ID`` opens that case (the id as printed, or
percent-encoded, or the pytest item id), and "failing cases only" hides the rows that passed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote

from _plugin_support import CHROMIUM_ARGS, crashmatrix_cli


def test_html_report_in_headless_chromium(tmp_path: Path, chromium: Path) -> None:
    from playwright.sync_api import sync_playwright

    work = tmp_path / "run"
    work.mkdir()
    # kill x conv1 on the unkeyed-retry mutant, shard 1/10 (a shard keeps a crash state's
    # kill cases together): 8 cases today, two of which (kills after the charge's effect
    # row was started) charge twice
    run = crashmatrix_cli(work, "run", "checkout", "--subject", "defect:unkeyed-retry", "--conversation", "conv1",
                          "--kinds", "kill", "--shard", "1/10", "--report", "r.json", "--html", "r.html")
    assert run.returncode == 1, run.output[-3000:]
    report = json.loads((work / "r.json").read_text())
    cases = report["cases"]
    failing = [c for c in cases if c["outcome"] == "fail"]
    assert len(cases) >= 5 and len(failing) >= 1, [(c["id"], c["outcome"]) for c in cases]
    assert len(failing) < len(cases)
    bad = failing[0]

    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("request", lambda r: requests.append(r.url))
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((work / "r.html").as_uri())
            assert page.title() == "crashmatrix: checkout on defect:unkeyed-retry"
            assert page.locator("table.heatmap thead th").all_inner_texts() == ["crash point", "kill"]
            assert page.locator("td.cell[data-case]").count() == len(cases)
            red = page.locator("td.cell.fail")
            assert red.count() == len(failing)
            assert page.locator("td.cell.pass").count() == len(cases) - len(failing)
            assert "Click a cell" in page.locator("#details").inner_text()
            red.first.click()
            details = page.locator("#details")
            assert details.locator(".case-id").inner_text() == bad["id"]
            text = details.inner_text()
            assert f"outcome: fail ({bad['failed_check']})" in text
            for v in bad["verdicts"]:
                if v["verdict"] == "invalid":
                    assert f"{v['phase']} check {v['check']}: invalid" in text
            assert re.search(r"crash point at \S*reference_runtime/executor.py:\d+", text), text
            assert details.locator("code.replay").inner_text() == bad["replay"]
            assert json.loads(details.locator("pre.plan").inner_text()) == bad["plan"]
            page.screenshot(path=str(work / "report.png"))

            # clicking put the case's id in the address bar: the link opens the case
            link = page.url
            assert link.split("#", 1)[1] == quote(bad["id"], safe=""), link
            good = next(c for c in cases if c["outcome"] == "pass")
            for url in (link, (work / "r.html").as_uri() + "#" + bad["id"],
                        (work / "r.html").as_uri() + "#" + quote(good["id"], safe="")):
                fresh = browser.new_page()
                fresh.on("pageerror", lambda e: errors.append(str(e)))
                fresh.goto(url)
                want = good if url.endswith(quote(good["id"], safe="")) else bad
                assert fresh.locator("#details .case-id").inner_text() == want["id"], url
                assert fresh.locator(f'td.cell.selected[id="{want["id"]}"]').count() == 1
                fresh.close()
            assert page.locator(f'[id="{bad["id"]}"]').count() == 1  # one anchor per case

            # the pytest item id opens the case too: whole, without its path, its param alone
            param = bad["id"].split("/", 1)[1]
            for item in (f"tests/test_checkout.py::test_checkout[{param}]", f"test_checkout[{param}]", param):
                for encoded in (item, quote(item, safe="")):
                    fresh = browser.new_page()
                    fresh.on("pageerror", lambda e: errors.append(str(e)))
                    fresh.goto((work / "r.html").as_uri() + "#" + encoded)
                    assert fresh.locator("#details .case-id").inner_text() == bad["id"], encoded
                    fresh.close()

            # failing cases only: every row without a failing case is hidden
            rows = page.locator("table.heatmap tr.point-row")
            assert rows.count() == len(cases)  # one kind: one row per case
            page.locator("#failing-only").check()
            visible = [r for r in rows.all() if r.is_visible()]
            assert len(visible) == len(failing), [r.inner_text() for r in visible]
            assert all(r.locator("td.cell.fail").count() == 1 for r in visible)
            page.locator("#failing-only").uncheck()
            assert sum(r.is_visible() for r in rows.all()) == len(cases)
            assert not errors, errors
        finally:
            browser.close()
    # the page needed nothing but itself: no font, script or image from anywhere
    assert requests == [(work / "r.html").as_uri()], requests
