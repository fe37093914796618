"""Domains in the report (issue 20): per-domain perplexity, each finding's per-domain table, the domain filter."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_report import CONTEXT_SCHEMA, FEATURES, build_output_dir, corpus_stats, embedded_data, report_config

from bbox_sae.features.domains import NO_DOMAIN
from bbox_sae.layout import RunLayout
from bbox_sae.report import run_report

SCREENSHOT = Path(__file__).resolve().parents[1] / "test-artifacts" / "report-domains.png"

# Latent 0 (alpha better, median +2): its top words by domain, as (domain, Δlog p alpha − beta).
LATENT0_TRAIN = [("play", 2.5), ("play", 2.0), ("poem", -1.0), ("play", 3.0), ("poem", -0.5), ("sonnet", 1.0), ("poem", -2.0), ("play", 1.5)]
LATENT0_HOLDOUT = [("play", 2.2), ("web", 0.4)]
DOMAIN_STATS = {
    "play": {"documents": 8, "words": 600, "models": {"alpha": {"mean_logprob": -3.0, "perplexity": math.exp(3.0), "words": 600}, "beta": {"mean_logprob": -3.6, "perplexity": math.exp(3.6), "words": 600}}, "pair_stats": {"alpha vs beta": {"mean_dlogp": 0.6, "median_dlogp": 0.5, "share_a_better": 0.6}}},
    "poem": {"documents": 4, "words": 400, "models": {"alpha": {"mean_logprob": -3.625, "perplexity": math.exp(3.625), "words": 400}, "beta": {"mean_logprob": -3.35, "perplexity": math.exp(3.35), "words": 400}}, "pair_stats": {"alpha vs beta": {"mean_dlogp": -0.275, "median_dlogp": -0.2, "share_a_better": 0.45}}},
}  # fmt: skip


def _domain_contexts(out: Path, train=LATENT0_TRAIN, holdout=LATENT0_HOLDOUT) -> None:
    """Latent 0's contexts rewritten with these (domain, Δ) top words; documents.parquet to match."""
    rows = [r for r in pq.read_table(RunLayout(out).contexts).to_pylist() if r["latent"] != 0]
    domain_of = {r["doc_id"]: "play" for r in rows}
    for split, items in (("train", train), ("holdout", holdout)):
        for rank, (domain, delta) in enumerate(items):
            doc = f"{domain}-{split}-{rank}"
            domain_of[doc] = domain
            rows.append(
                {
                    "latent": 0, "split": split, "rank": rank, "doc_id": doc, "word_idx": 3, "activation": 9.0 - rank, "in_top": True,
                    "left": f"{domain} line {rank}, ", "word": "were", "right": " it so", "logprob__alpha": -1.0, "logprob__beta": -1.0 - delta,
                }
            )  # fmt: skip
    # An out-of-top word in a domain of its own must not count.
    rows.append({**rows[-1], "rank": 99, "doc_id": "lyric-0", "in_top": False})
    domain_of["lyric-0"] = "lyric"
    domain_of["unlabelled-doc"] = None
    pq.write_table(pa.Table.from_pylist(rows, schema=CONTEXT_SCHEMA), RunLayout(out).contexts)
    docs = sorted(domain_of)
    pq.write_table(
        pa.table(
            {
                "doc_id": docs,
                "text": ["t"] * len(docs),
                "split": ["train"] * len(docs),
                "domain": [domain_of[d] for d in docs],
                "shard": pa.array([0] * len(docs), pa.int64()),
            }
        ),
        RunLayout(out).documents,
    )
    stats = corpus_stats()
    stats["domains"] = DOMAIN_STATS
    RunLayout(out).corpus_stats.write_text(json.dumps(stats))


@pytest.fixture
def domain_run(tmp_path):
    out = build_output_dir(tmp_path / "run")
    _domain_contexts(out)
    return out


def test_finding_card_rows_say_where_the_difference_holds(domain_run):
    run_report(report_config(domain_run))
    data = embedded_data(RunLayout(domain_run).report_html.read_text(encoding="utf-8"))
    rows = {r["domain"]: r for r in next(f for f in data["features"] if f["latent"] == 0)["domains"]}
    assert list(rows) == ["play", "poem", "sonnet", "web"]  # most top words first, then by name
    play, poem = rows["play"], rows["poem"]
    assert (play["n"], play["median_dlogp"], play["wins"], play["holds"]) == (5, pytest.approx(2.2), 1.0, True)
    assert (poem["n"], poem["median_dlogp"], poem["wins"], poem["holds"]) == (3, pytest.approx(-1.0), 0.0, False)
    assert rows["sonnet"]["holds"] is None and rows["web"]["holds"] is None  # 1 word each: too few to say
    assert data["domains"] == ["play", "poem", "sonnet", "web"]


def test_domain_min_words_decides_when_there_are_enough_words(domain_run):
    run_report(report_config(domain_run, domain_min_words=1))
    data = embedded_data(RunLayout(domain_run).report_html.read_text(encoding="utf-8"))
    rows = {r["domain"]: r for r in next(f for f in data["features"] if f["latent"] == 0)["domains"]}
    assert rows["sonnet"]["holds"] is True and rows["web"]["holds"] is True


def test_documents_without_a_domain_are_grouped(domain_run):
    docs = pq.read_table(RunLayout(domain_run).documents).to_pylist()
    for d in docs:
        if d["doc_id"].startswith("poem-"):
            d["domain"] = None
    pq.write_table(pa.Table.from_pylist(docs), RunLayout(domain_run).documents)
    run_report(report_config(domain_run))
    data = embedded_data(RunLayout(domain_run).report_html.read_text(encoding="utf-8"))
    rows = {r["domain"]: r["n"] for r in next(f for f in data["features"] if f["latent"] == 0)["domains"]}
    assert rows[NO_DOMAIN] == 3 and "poem" not in rows


def test_header_and_markdown_give_perplexity_per_domain(domain_run):
    run_report(report_config(domain_run))
    page = RunLayout(domain_run).report_html.read_text(encoding="utf-8")
    header = page.split("</header>", 1)[0]
    poem = re.search(r'<tr data-domain="poem">(.*?)</tr>', header).group(1)
    # beta has the lower perplexity on poems (bold), though alpha is better on the whole corpus.
    assert '<td class="num perplexity" data-model="beta"><b>28.50</b></td>' in poem
    assert '<td class="num perplexity" data-model="alpha">37.52</td>' in poem and "-0.275" in poem
    assert "2 domains" in header and '<details id="domain-stats" open>' in header
    md = RunLayout(domain_run).report_md.read_text(encoding="utf-8")
    assert "| domain | documents | words | perplexity alpha | perplexity beta | mean Δlog p alpha vs beta |" in md
    assert "| poem | 4 | 400 | 37.52 | 28.50 | -0.275 |" in md


def test_no_domains_no_domain_views(tmp_path):
    out = build_output_dir(tmp_path / "run", with_documents=False)
    run_report(report_config(out))
    page = RunLayout(out).report_html.read_text(encoding="utf-8")
    data = embedded_data(page)
    assert data["domains"] == [] and all(f["domains"] == [] for f in data["features"])
    assert 'id="domain-stats"' not in page
    assert "## Per domain" not in RunLayout(out).report_md.read_text(encoding="utf-8")


# ---------------------------------------------------------------- in the browser


@pytest.mark.browser
def test_domain_filter_and_card_table_in_the_browser(domain_run, browser):
    run_report(report_config(domain_run))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(RunLayout(domain_run).report_html.as_uri())
    page.wait_for_selector("#features tbody tr.feature-row")
    assert page.locator("#filter-domain-label").is_visible()
    page.select_option("#filter-domain", "poem")
    assert page.eval_on_selector_all("#features tbody tr.feature-row", "rows => rows.map(r => r.dataset.latent)") == ["0"]
    page.select_option("#filter-domain", "play")
    shown = page.eval_on_selector_all("#features tbody tr.feature-row", "rows => rows.map(r => r.dataset.latent)")
    assert sorted(map(int, shown)) == sorted(f[0] for f in FEATURES)  # every other latent's words are in plays
    page.click('#features tr.feature-row[data-latent="0"]')
    table = page.locator("#card-domain-table tbody tr")
    assert table.evaluate_all("rows => rows.map(r => [r.dataset.domain, r.dataset.holds])") == [
        ["play", "true"],
        ["poem", "false"],
        ["sonnet", ""],
        ["web", ""],
    ]
    assert page.locator('#card-domain-table tr[data-domain="poem"] td.holds-no').text_content() == "no"
    assert page.locator('#card-domain-table tr[data-domain="play"]').get_attribute("class") == "filtered"
    assert "1 of 2 domains with enough words" in page.text_content("#card-domain-caption")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    page.close()


@pytest.mark.browser
def test_card_lists_the_largest_domains_and_the_filtered_one(tmp_path, browser):
    out = build_output_dir(tmp_path / "run")
    works = [f"work-{k:02d}" for k in range(11)]
    _domain_contexts(out, train=[(w, 1.0) for w in works] + [("work-00", 1.0)] * 3, holdout=[])
    run_report(report_config(out))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(RunLayout(out).report_html.as_uri())
    page.wait_for_selector("#features tbody tr.feature-row")
    page.click('#features tr.feature-row[data-latent="0"]')
    listed = "#card-domain-table tbody tr[data-domain]"
    assert page.eval_on_selector_all(listed, "rows => rows.map(r => r.dataset.domain)") == works[:8]
    assert page.text_content("#card-domain-table tr.more-domains") == "… 3 more domains (3 words)"
    page.select_option("#filter-domain", "work-10")
    assert page.eval_on_selector_all(listed, "rows => rows.map(r => r.dataset.domain)") == works[:8] + ["work-10"]
    assert page.text_content("#card-domain-table tr.more-domains") == "… 2 more domains (2 words)"
    page.close()
