"""Behind a finding, in headless Chromium: the findings table sorts, filters and searches, and a
finding's panel lists every held-out word it was tested on, sortable by Δ, counter-examples marked,
with what each model expected there."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_report import build_output_dir, report_config
from test_report_findings import EXPECTED_ALPHA, FINDING_WORDS, add_finding_tables

from bbox_sae.layout import RunLayout
from bbox_sae.report import run_report
from helpers.gap_run import FINDINGS, add_gap_tables, held_out_deltas

pytestmark = pytest.mark.browser

SCREENSHOT = Path(__file__).resolve().parents[1] / "test-artifacts" / "report-findings-panel.png"


@pytest.fixture(scope="module")
def gap_url(tmp_path_factory) -> tuple[str, Path]:
    out = add_gap_tables(build_output_dir(tmp_path_factory.mktemp("browser-gap") / "run"))
    run_report(report_config(out))
    return RunLayout(out).report_html.as_uri(), out


def open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.dialogs = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.goto(url)
    page.wait_for_selector("#findings-table tr.finding-row")
    return page


@pytest.fixture
def page(browser, gap_url):
    page = open_page(browser, gap_url[0])
    yield page
    assert page.dialogs == []
    page.close()


def visible_findings(page) -> list[int]:
    return [int(v) for v in page.eval_on_selector_all("#findings-table tr.finding-row:not([hidden])", "rows => rows.map(r => r.dataset.finding)")]


def test_findings_table_sorts_by_a_column_and_back(page):
    n_header = page.locator('#findings-table th[data-sort="n"]')
    n_header.click()
    counts = {0: 16, 1: 8, 2: 16}  # 'fool' twice and 'king' twice in each of 8 plays; finding 1: the tragedies' kings
    ascending = visible_findings(page)
    assert [counts[f] for f in ascending] == sorted(counts.values()) and ascending[0] == 1
    assert n_header.get_attribute("aria-sort") == "ascending"
    n_header.click()
    assert [counts[f] for f in visible_findings(page)] == sorted(counts.values(), reverse=True)
    page.locator('#findings-table th[data-sort="statement"]').click()
    assert visible_findings(page) == [0, 2, 1]  # "'fool'", "'king'", "'king' in a tragedy"


def test_findings_table_filters_by_winner_and_kind_and_searches(page):
    page.select_option("#findings-filter-model", "beta")
    assert visible_findings(page) == [f for f, better, *_ in FINDINGS if better == "beta"]
    assert page.text_content("#findings-row-count") == "2 of 3 findings"
    page.select_option("#findings-filter-kind", "latent")
    assert visible_findings(page) == []
    page.select_option("#findings-filter-kind", "")
    page.select_option("#findings-filter-model", "")
    page.fill("#findings-filter-text", "TRAGEDY")
    assert visible_findings(page) == [1]


def test_a_findings_panel_lists_all_its_held_out_words_sortable_by_delta(page, gap_url):
    _, out = gap_url
    delta, _, words = held_out_deltas(out)
    kings = sorted(d for d, w in zip(delta, words) if w.strip().lower() == "king")
    panel = page.locator('details.finding-words[data-finding="2"]')
    assert "All 16 held-out words" in panel.locator("summary").text_content()
    panel.locator("summary").click()
    rows = panel.locator("tbody tr.finding-word")
    rows.first.wait_for()  # drawn on the toggle event, after the click returns
    assert rows.count() == len(kings) == 16
    panel.locator('th[data-sort="delta"]').click()
    shown = [float(v) for v in panel.locator("tbody tr.finding-word").evaluate_all("rows => rows.map(r => r.dataset.delta)")]
    assert shown == pytest.approx(kings)
    panel.locator('th[data-sort="delta"]').click()
    shown = [float(v) for v in panel.locator("tbody tr.finding-word").evaluate_all("rows => rows.map(r => r.dataset.delta)")]
    assert shown == pytest.approx(sorted(kings, reverse=True))
    assert panel.locator("tr.counter").count() == 0  # beta wins every king
    first = panel.locator("tbody tr.finding-word").first
    assert first.locator("mark.target").text_content().strip().lower() == "king" and first.locator("td.domain").text_content() in ("comedy", "tragedy")
    assert "king" in first.locator("td.passage").text_content() and first.locator("mark.target").evaluate("m => m.style.background") != ""
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.locator("#finding-2").screenshot(path=str(SCREENSHOT))
    assert SCREENSHOT.stat().st_size > 0


def test_counter_examples_are_marked(browser, tmp_path):
    """Finding 1 of tests/test_report_findings.py says beta is better, but alpha wins each of its words."""
    out = add_finding_tables(build_output_dir(tmp_path / "run"))
    run_report(report_config(out))
    page = open_page(browser, RunLayout(out).report_html.as_uri())
    panel = page.locator('details.finding-words[data-finding="1"]')
    assert "counter-examples (3: the other model better)" in panel.locator("summary").text_content()
    panel.locator("summary").click()
    # The rows are drawn when the panel's toggle event fires, after the click returns.
    panel.locator("tbody tr.finding-word").first.wait_for()
    assert panel.locator("tbody tr.finding-word.counter").count() == len(FINDING_WORDS[1]) == 3
    # What each model expected there: alpha's scores kept it, beta's (a Parquet file) did not.
    expected = panel.locator("tbody tr.finding-word").first.locator("td.expected")
    assert [expected.nth(i).text_content() for i in range(2)] == [EXPECTED_ALPHA, "–"]
    assert "alpha expected" in panel.locator("thead").text_content()
    # Corpus text is shown as text: the hostile word is no element.
    assert page.locator("script").count() == 2 and page.dialogs == []
    page.close()
