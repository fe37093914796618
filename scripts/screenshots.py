"""Screenshots of a run's report.html for the docs, taken in headless Chromium with Playwright.

    python scripts/screenshots.py runs/demo/report.html docs/

writes `report-findings.png` (the first findings with their held-out contexts),
`report-table.png` (the findings table, searched for a word and sorted by n), `report-words.png`
(the first finding's panel of all its held-out words, sorted by Δ), `report-forest.png` (the
forest plot) and `report-domains.png` (the per-domain chart). Needs
/usr/bin/chromium (`scripts/install_browser.sh`); `make screenshots` runs it on the demo.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
VIEWPORT = {"width": 1300, "height": 900}
FINDINGS_SHOWN = 3  # finding cards in report-findings.png
SEARCHED = "rome"  # what report-table.png searches the findings table for (the demo's topic cue)
TALLEST = 640  # px: a longer table or panel is cut here


def _union(boxes: list[dict], pad: float = 6) -> dict:
    left, top = max(0, min(b["x"] for b in boxes) - pad), max(0, min(b["y"] for b in boxes) - pad)
    right, bottom = max(b["x"] + b["width"] for b in boxes) + pad, max(b["y"] + b["height"] for b in boxes) + pad
    return {"x": left, "y": top, "width": right - left, "height": bottom - top}


def take(report: Path, out_dir: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.goto(report.resolve().as_uri())
        page.wait_for_selector("#features tbody tr.feature-row")
        cards = page.locator("article.finding")
        if cards.count() == 0:
            raise SystemExit(f"{report}: no findings to show")
        findings_box = _union([cards.nth(i).bounding_box() for i in range(min(FINDINGS_SHOWN, cards.count()))])
        shots = [("report-findings.png", findings_box), ("report-forest.png", page.locator("#forest-plot").bounding_box())]
        if page.locator("#domain-chart").count():
            shots.append(("report-domains.png", page.locator("#domain-chart").bounding_box()))
        for name, box in shots:
            written.append(_shot(page, out_dir / name, box))
        # The views a reader uses to look behind a finding: the table searched and sorted, and a
        # finding's words, each in its passage shaded by Δ.
        page.fill("#findings-filter-text", SEARCHED)
        page.locator('#findings-table th[data-sort="n"]').click()
        written.append(_shot(page, out_dir / "report-table.png", _page_box(page.locator("#findings-table"))))
        page.fill("#findings-filter-text", "")
        panel = page.locator("details.finding-words").first
        panel.locator("summary").click()
        panel.locator("tbody tr.finding-word").first.wait_for()  # drawn on the toggle event
        panel.locator('th[data-sort="delta"]').click()
        written.append(_shot(page, out_dir / "report-words.png", _page_box(panel)))
        browser.close()
    return written


def _page_box(locator) -> dict:
    """The element's box in page coordinates (`bounding_box` is the viewport's, which moves once
    the page has scrolled to a clicked element; a full-page clip reads page coordinates)."""
    return locator.evaluate("e => { const r = e.getBoundingClientRect(); return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height}; }")


def _shot(page, path: Path, box: dict) -> Path:
    page.screenshot(path=str(path), clip={**box, "height": min(box["height"], TALLEST)}, full_page=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="report.html of a run")
    parser.add_argument("out_dir", type=Path, help="where the PNGs go (docs/)")
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        print(f"screenshots: {CHROMIUM} is not installed (scripts/install_browser.sh)", file=sys.stderr)
        return 1
    if not args.report.is_file():
        print(f"screenshots: {args.report}: no such report (run `bbox report` first)", file=sys.stderr)
        return 1
    for path in take(args.report, args.out_dir):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
