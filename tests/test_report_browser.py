"""report.html driven in headless Chromium: sorting, filtering, the feature card, and inert hostile text."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_report import FEATURES, HOSTILE_LABEL, HOSTILE_WORD, N_HOLDOUT, N_IN_TOP, N_TRAIN, build_output_dir, report_config

from bbox_sae.layout import RunLayout
from bbox_sae.report import run_report

pytestmark = pytest.mark.browser

SCREENSHOT = Path(__file__).resolve().parents[1] / "test-artifacts" / "report.png"


@pytest.fixture(scope="module")
def report_url(tmp_path_factory) -> str:
    out = build_output_dir(tmp_path_factory.mktemp("browser") / "run")
    run_report(report_config(out))
    return RunLayout(out).report_html.as_uri()


@pytest.fixture
def page(browser, report_url):
    """A fresh page; every dialog (an alert from injected script) is recorded and dismissed."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.dialogs = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.goto(report_url)
    page.wait_for_selector("#features tbody tr.feature-row")
    yield page
    assert page.dialogs == [], "a script from the corpus or a label ran"
    page.close()


def row_values(page, attribute: str) -> list[str]:
    return page.eval_on_selector_all("#features tbody tr.feature-row", f"rows => rows.map(r => r.dataset.{attribute})")


def open_card(page, latent: int):
    page.click(f'#features tr.feature-row[data-latent="{latent}"]')
    card = page.locator("#feature-card")
    assert card.is_visible()
    assert card.get_attribute("data-latent") == str(latent)
    return card


def test_sort_by_median_delta(page):
    initial = [float(v) for v in row_values(page, "median")]
    header = page.locator('#features th[data-sort="median_dlogp"]')
    header.click()
    ascending = [float(v) for v in row_values(page, "median")]
    assert ascending == sorted(f[1] for f in FEATURES) and ascending != initial
    assert header.get_attribute("aria-sort") == "ascending"
    page.locator('#features th[data-sort="median_dlogp"]').click()
    assert [float(v) for v in row_values(page, "median")] == sorted(ascending, reverse=True)


def test_filter_by_model_kept_and_text(page):
    page.select_option("#filter-model", "beta")
    assert set(row_values(page, "better")) == {"beta"}
    assert len(row_values(page, "better")) == sum(f[1] < 0 for f in FEATURES)
    page.check("#filter-kept")
    assert row_values(page, "latent") == ["3", "1"]  # beta's kept features, largest |median Δ| first
    page.select_option("#filter-model", "")
    page.uncheck("#filter-kept")
    page.fill("#filter-text", "IF YOU")
    assert row_values(page, "latent") == ["0"]
    assert page.text_content("#row-count") == f"1 of {len(FEATURES)} features"


def test_feature_card_shows_the_word_and_both_probabilities(page):
    card = open_card(page, 0)
    assert card.locator("#card-label").text_content() == "conditional 'were' after 'if you'"
    assert card.locator("#card-label-source").text_content() == "llm:test-model"
    train = card.locator("#card-train li.context")
    assert train.count() == N_TRAIN and card.locator("#card-holdout li.context").count() == N_HOLDOUT
    first = train.nth(0)
    assert first.locator("mark.target").text_content() == "were"
    lp_alpha, lp_beta = -1.0, -1.0 - 2.0 + 0.2  # rank 0 of latent 0 in the synthetic contexts
    for model, lp in (("alpha", lp_alpha), ("beta", lp_beta)):
        shown = first.locator(f'.prob[data-model="{model}"] .prob-value').text_content()
        assert float(shown) == pytest.approx(math.exp(lp), rel=5e-3)
    holdout_docs = card.locator("#card-holdout li.context").evaluate_all("items => items.map(i => i.dataset.docId)")
    assert all(d.startswith("holdout-") for d in holdout_docs)
    counts = card.locator("#card-hist rect").evaluate_all("bars => bars.map(b => Number(b.dataset.count))")
    assert sum(counts) == N_IN_TOP
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert SCREENSHOT.stat().st_size > 0


def test_hostile_text_shows_as_text_and_never_runs(page):
    card = open_card(page, 3)
    assert card.locator("#card-label").text_content() == HOSTILE_LABEL
    assert card.locator("#card-train li.context").nth(0).locator("mark.target").text_content() == HOSTILE_WORD
    assert page.evaluate("document.scripts.length") == 2
    assert page.locator("#card-train script, #features script").count() == 0


# ---------------------------------------------------------------- rule fit and label scores


@pytest.fixture(scope="module")
def scored_url(tmp_path_factory) -> str:
    from test_report_columns import scored_output_dir

    out = scored_output_dir(tmp_path_factory.mktemp("scored") / "run", fuzz=True)
    run_report(report_config(out, examples_per_other_feature=2))
    return RunLayout(out).report_html.as_uri()


@pytest.fixture
def scored_page(browser, scored_url):
    page = browser.new_page(viewport={"width": 1600, "height": 900})
    page.goto(scored_url)
    page.wait_for_selector("#features tbody tr.feature-row")
    yield page
    page.close()


def column_values(page, key: str) -> list[float | None]:
    texts = page.eval_on_selector_all(f'#features tbody td[data-col="{key}"]', "cells => cells.map(c => c.textContent)")
    return [None if t == "–" else float(t) for t in texts]


@pytest.mark.parametrize("key", ["label_score", "fuzz_score", "rule_precision"])
def test_sort_by_score_puts_unscored_features_last(scored_page, key):
    from test_report_columns import SCORED

    index = {"rule_precision": 1, "label_score": 3, "fuzz_score": 4}[key]
    scores = sorted(s[index] for s in SCORED.values() if s[index] is not None)
    missing = [None] * sum(s[index] is None for s in SCORED.values())
    header = scored_page.locator(f'#features th[data-sort="{key}"]')
    header.click()
    assert column_values(scored_page, key) == scores + missing  # SCORED has two decimals, as shown
    assert header.get_attribute("aria-sort") == "ascending"
    header.click()
    assert column_values(scored_page, key) == scores[::-1] + missing
    assert header.get_attribute("aria-sort") == "descending"
    assert scored_page.locator("#features th[aria-sort]").count() == 1


def test_card_shows_rule_fit_scores_and_how_many_contexts(scored_page):
    scored_page.click('#features tr.feature-row[data-latent="0"]')
    card = scored_page.locator("#feature-card")
    rule = card.locator('dd[data-stat="rule"]').text_content()
    assert rule == "'were' right after 'if you' (held-out precision 0.90, recall 0.60, F1 0.50)"
    assert card.locator("#card-label-score").text_content() == "detection score 0.95 · fuzzing score 0.70"
    assert card.locator("#card-train-count").text_content() == f"({N_TRAIN})"
    scored_page.click('#features tr.feature-row[data-latent="2"]')  # not kept: two contexts per split
    assert card.locator("#card-train li.context").count() == 2 and card.locator("#card-holdout li.context").count() == 2
    assert card.locator("#card-train-count").text_content() == f"(2 of {N_TRAIN})"
    assert card.locator("#card-holdout-count").text_content() == f"(2 of {N_HOLDOUT})"
    assert card.locator('dd[data-stat="rule"]').text_content() == "–" and card.locator("#card-label-score").text_content() == ""


def test_the_feature_table_fits_its_box_in_a_laptop_window(browser, report_url):
    """At 1,360 px the table fits beside the card (the demo's was 1,804 px in a 1,360 px box, then
    1,555 in 1,320); sign consistency and density live on the card."""
    page = browser.new_page(viewport={"width": 1360, "height": 900})
    page.goto(report_url)
    page.wait_for_selector("#features tbody tr.feature-row")
    table, box = page.evaluate("() => [document.querySelector('#browser table').scrollWidth, document.querySelector('#browser').clientWidth]")
    headers = page.eval_on_selector_all("#browser table th", "hs => hs.map(h => h.textContent.trim())")
    page.close()
    assert table <= box and "consistency" not in headers and "density" not in headers
