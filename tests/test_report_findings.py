"""The report's findings section, charts and W&B findings table, on a run with the tables the
features stage writes for findings (finding_words.parquet, rules.parquet) and the words, build
index and documents they point into."""

from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_report import FEATURES, HOSTILE_LEFT, HOSTILE_RIGHT, HOSTILE_WORD, _table_json, build_output_dir, corpus_stats, embedded_data, report_config

from bbox_sae.artifacts import ShardedTable, read_table
from bbox_sae.layout import RunLayout
from bbox_sae.report import FINDING_COLUMNS, run_report
from bbox_sae.report.finding_inputs import FINDING_CONTEXTS, spread
from bbox_sae.report.plots import domains_figure, forest_figure
from bbox_sae.schemas import FINDING_SCHEMA, FINDING_WORDS_SCHEMA, LOGPROB_ALTERNATIVES_SCHEMA, TESTED_RULE_SCHEMA
from helpers.wandb_log import logged_bytes

# Held-out documents: finding 0 ('were', alpha better) covers word 2 of each "if you were i";
# finding 1 (beta better) the closing quote of each 'say "hi"' and the hostile word.
WERE_DOCS = [f"held-were-{i}" for i in range(7)]
QUOTE_DOCS = ["held-quote-0", "held-quote-1"]
EVIL_DOC = "held-evil"


def _doc_words(doc: str) -> tuple[str, list[tuple[str, int, int]]]:
    """A held-out document's text and its words as (word, char_start, char_end)."""
    if doc == EVIL_DOC:
        text = f"{HOSTILE_LEFT}{HOSTILE_WORD}{HOSTILE_RIGHT}"
        start = len(HOSTILE_LEFT)
        return text, [(HOSTILE_LEFT, 0, start), (HOSTILE_WORD, start, start + len(HOSTILE_WORD)), (HOSTILE_RIGHT, start + len(HOSTILE_WORD), len(text))]
    if doc in QUOTE_DOCS:
        return 'say "hi"', [("say", 0, 3), (' "', 3, 5), ("hi", 5, 7), ('"', 7, 8)]
    i = doc.rsplit("-", 1)[1]
    return f"if you\nwere {i}", [("if", 0, 2), (" you", 2, 6), ("\nwere", 6, 11), (f" {i}", 11, 13)]


FINDING_WORDS = {0: [(d, 2) for d in WERE_DOCS], 1: [(d, 3) for d in QUOTE_DOCS] + [(EVIL_DOC, 1)]}
# (latents, better model, q, passed): finding 0 joins the candidates of latents 0 and 7, finding
# 1 that of latents 3 and 4; the others failed or were not tested.
CANDIDATES = [("0", "alpha", 0.001, True), ("7", "alpha", 0.004, True), ("0", "alpha", 0.3, False), ("3,4", "beta", 0.02, True), ("5", "beta", None, False)]


def _alpha_logprob(row: int) -> float:
    return -1.0 - 0.1 * row


EXPECTED_LOGPROBS = [math.log(0.61), math.log(0.22), math.log(0.08)]
EXPECTED_ALPHA = "'the' 61% · 'a' 22% · '⏎' 8%"  # as a panel shows them


def add_finding_tables(out: Path) -> Path:
    """finding_words.parquet, rules.parquet, words/, build/index.parquet and the held-out
    documents, and the features' finding columns, on top of test_report's output dir."""
    paths = RunLayout(out)
    features = read_table(paths.features)
    finding_of = {0: 0, 3: 1, 4: 1}
    features = features.append_column("finding", pa.array([finding_of.get(f[0]) for f in FEATURES], pa.int32()))
    features = features.append_column("findings", pa.array([None if f[0] not in finding_of else str(finding_of[f[0]]) for f in FEATURES], pa.string()))
    q = features["q_value"].to_pylist()
    q[0] = 0.3  # latent 0 is kept for its finding, not for its own top words
    features = features.set_column(features.schema.get_field_index("q_value"), "q_value", pa.array(q, pa.float64()))
    pq.write_table(features, paths.features)
    findings = read_table(paths.findings).to_pylist()
    findings[1]["latents"], findings[1]["n_latents"] = "3,4", 2
    # The features stage records each finding's q: the largest of its passed candidates' (below).
    findings[0]["q_value"], findings[1]["q_value"] = 0.004, 0.02
    pq.write_table(pa.Table.from_pylist(findings, schema=FINDING_SCHEMA), paths.findings)

    docs = WERE_DOCS + QUOTE_DOCS + [EVIL_DOC]
    words, index, finding_words = [], [], []
    for doc in docs:
        _, doc_words = _doc_words(doc)
        for idx, (word, start, end) in enumerate(doc_words):
            words.append({"doc_id": doc, "word_idx": idx, "char_start": start, "char_end": end, "word": word, "split": "holdout", "domain": "books"})
            row = len(index)
            lp = _alpha_logprob(row)
            index.append({"row": row, "doc_id": doc, "word_idx": idx, "split": "holdout", "logprob__alpha": lp, "logprob__beta": lp - 2.0})
            for finding, spots in FINDING_WORDS.items():
                if (doc, idx) in spots:
                    finding_words.append({"finding": finding, "split": "holdout", "row": row, "doc_id": doc, "word_idx": idx})
    # A train word of finding 0: where it was chosen, never shown as a held-out context.
    finding_words.append({"finding": 0, "split": "train", "row": 0, "doc_id": WERE_DOCS[0], "word_idx": 0})
    ShardedTable(paths.words).write(0, pa.Table.from_pylist(words))
    # alpha kept what it expected at each word (a model scored in process); beta, read from a
    # Parquet file, kept none.
    expected = [{**w, "logprob": -1.0, "top_tokens": [" the", " a", "\n"], "top_logprobs": EXPECTED_LOGPROBS} for w in words]
    ShardedTable(paths.logprobs("alpha")).write(
        0, pa.Table.from_pylist([{k: w[k] for k in LOGPROB_ALTERNATIVES_SCHEMA.names} for w in expected], schema=LOGPROB_ALTERNATIVES_SCHEMA)
    )
    paths.build.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(index), paths.index)
    pq.write_table(pa.Table.from_pylist(finding_words, schema=FINDING_WORDS_SCHEMA), paths.finding_words)
    rules = [
        {"model_a": "alpha", "model_b": "beta", "better_model": better, "kind": "rule", "latents": latents, "q_value": q, "passed": passed}
        for latents, better, q, passed in CANDIDATES
    ]
    pq.write_table(pa.Table.from_pylist(rules, schema=TESTED_RULE_SCHEMA), paths.rules)
    existing = read_table(paths.documents).to_pylist()
    held = [{"doc_id": d, "text": _doc_words(d)[0], "split": "holdout", "domain": "books", "shard": 0} for d in docs]
    pq.write_table(pa.Table.from_pylist(existing + held), paths.documents)
    stats = corpus_stats()
    stats["domains"] = {
        "books": {
            "documents": 20,
            "words": 900,
            "models": {"alpha": {"perplexity": 20.0}, "beta": {"perplexity": 30.0}},
            "pair_stats": {"alpha vs beta": {"mean_dlogp": 0.4}},
        },
        "web": {
            "documents": 1,
            "words": 100,
            "models": {"alpha": {"perplexity": 60.0}, "beta": {"perplexity": 50.0}},
            "pair_stats": {"alpha vs beta": {"mean_dlogp": -0.2}},
        },
    }
    paths.corpus_stats.write_text(json.dumps(stats))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = add_finding_tables(build_output_dir(tmp_path_factory.mktemp("findings") / "run"))
    result = run_report(report_config(out, mode="offline"))
    paths = RunLayout(out)
    return paths, result, paths.report_html.read_text(encoding="utf-8"), paths.report_md.read_text(encoding="utf-8")


def held_out_words(finding: int) -> list[tuple[str, int, str]]:
    """(doc_id, word_idx, word) of a finding's held-out words in corpus order."""
    return sorted((d, i, _doc_words(d)[1][i][0]) for d, i in FINDING_WORDS[finding])


def expected_contexts(finding: int) -> list[tuple[str, int, str]]:
    words = held_out_words(finding)
    return [words[i] for i in spread(len(words), FINDING_CONTEXTS)]


def article(page: str, finding: int) -> str:
    return re.search(rf'<article class="finding" id="finding-{finding}".*?</article>', page, re.S).group(0)


def test_spread_takes_k_evenly_from_first_to_last():
    assert spread(3, 5) == [0, 1, 2] and spread(7, 5) == [0, 2, 3, 4, 6] and spread(100, 5) == [0, 25, 50, 74, 99]
    for n in range(1, 60):
        picked = spread(n, 5)
        assert len(picked) == min(n, 5) and picked == sorted(set(picked)) and picked[0] == 0 and picked[-1] == n - 1


def test_findings_precede_the_domain_table_in_both_outputs(run):
    _, _, page, md = run
    assert md.index("## Findings") < md.index("### Finding 0") < md.index("## Per domain") < md.index("## alpha vs beta")
    assert page.index('id="how-to-read"') < page.index('id="findings-table"') < page.index('id="finding-1"') < page.index('id="domain-table"')


def test_how_to_read_explains_every_statistic_and_the_delta_is_over_every_held_out_word(run):
    _, _, page, md = run
    how = html.unescape(re.search(r'<p id="how-to-read">(.*?)</p>', page, re.S).group(1))
    for term in (
        "log p(first model of the pair) − log p(second model)",
        "median of Δlog p over every held-out word",
        "95% confidence interval",
        "n is",
        "Benjamini–Hochberg",
        "Detection",
        "Rule precision",
        "rule recall",
        "F1",
        "Kept:",
    ):
        assert term in how, term
    assert how in html.unescape(md) and "median over the held-out top words" not in md + page


def test_every_finding_shows_its_statistics_and_held_out_contexts(run):
    paths, _, page, md = run
    index = {r["row"]: r for r in read_table(paths.index).to_pylist()}
    by_spot = {(r["doc_id"], r["word_idx"]): r for r in index.values()}
    for f in read_table(paths.findings).to_pylist():
        block = article(page, f["finding"])
        ci = f"{f['holdout_median_dlogp']:+.2f} [{f['holdout_ci_low']:+.2f}, {f['holdout_ci_high']:+.2f}]"
        assert f["statement"] in html.unescape(block)
        assert ci in block and f'n = <span class="n">{f["holdout_n"]}</span>' in block
        items = re.findall(
            r'<li class="context" data-doc-id="([^"]*)">.*?<mark class="target">(.*?)</mark>.*?<span class="ctx-logprobs">(.*?)</span>', block, re.S
        )
        expected = expected_contexts(f["finding"])
        assert [(html.unescape(d), html.unescape(w)) for d, w, _ in items] == [(d, w.replace("\n", "⏎")) for d, _, w in expected]
        for (doc, idx, _), (_, _, logprobs) in zip(expected, items):
            row = by_spot[(doc, idx)]
            assert logprobs == f"{row['logprob__alpha']:.2f} / {row['logprob__beta']:.2f}"
        section = md.split(f"### Finding {f['finding']}:", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
        assert ci in section and f"n = {f['holdout_n']}" in section
        marked = [html.unescape(re.sub(r"\\(.)", r"\1", w)) for w in re.findall(r"<mark>(.*?)</mark>", section)]
        assert marked == [w.replace("\n", "⏎") for _, _, w in expected]


def test_a_findings_panel_says_what_each_model_expected_at_each_word(run):
    """Each row of a panel carries what the model expected most there (alpha's scores kept it) or
    nothing (beta's, a Parquet file, did not)."""
    _, _, page, _ = run
    rows = [row for rows in embedded_data(page)["finding_words"].values() for row in rows]
    assert rows and all(row[8] == EXPECTED_ALPHA and row[9] is None for row in rows)


def test_a_finding_says_how_it_was_tested_and_its_q(run):
    _, _, page, md = run
    tested = sum(q is not None for _, _, q, _ in CANDIDATES)
    first = article(page, 0)
    assert f"tested on all 12 held-out words its rules cover: Wilcoxon signed-rank, BH over all {tested} candidates" in first
    assert 'q = <span class="q">4.0e-03</span>' in first  # the larger of its two candidates' q
    assert 'q = <span class="q">2.0e-02</span>' in article(page, 1)
    assert "its word group covers" in article(page, 1)  # a latent finding's words are its word group's
    assert "q = 4.0e-03" in md.split("### Finding 0:", 1)[1].split("### Finding 1:", 1)[0]


def test_hostile_context_text_is_escaped(run):
    _, _, page, md = run
    block = article(page, 1)
    assert HOSTILE_WORD not in page and "<script" not in block.lower()
    assert f'<mark class="target">{html.escape(HOSTILE_WORD, quote=False)}</mark>' in block.replace("&#34;", '"').replace("&#39;", "'")
    assert HOSTILE_WORD not in md and "&lt;script&gt;alert(1)&lt;/script&gt;" in md


def test_finding_members_and_latent_cards_link_both_ways(run):
    _, _, page, _ = run
    assert re.search(r'<a class="member kept" href="#sae:0:alpha:beta">0 \(kept\)</a>, <span class="member">7</span>', article(page, 0))
    assert '<a class="member kept" href="#sae:3:alpha:beta">3 (kept)</a>, <a class="member kept" href="#sae:4:alpha:beta">4 (kept)</a>' in article(page, 1)
    features = {f["latent"]: f for f in embedded_data(page)["features"]}
    for latent, finding in ((0, 0), (3, 1), (4, 1)):
        assert [r["finding"] for r in features[latent]["finding_refs"]] == [finding]
        assert f'id="finding-{finding}"' in page
    assert all(not f["finding_refs"] and f["kept_reason"] is None for f in features.values() if f["latent"] not in (0, 3, 4))
    assert "would not keep it (q = 0.3)" in features[0]["kept_reason"]  # kept for its finding, not its own test
    assert "its own top words are significant too (q = 0.001)" in features[3]["kept_reason"]
    assert "lean towards alpha; finding 1 favours beta" in features[4]["kept_reason"]


def test_forest_plot_has_one_mark_per_finding_sorted_and_coloured_by_winner(run):
    paths, result, page, md = run
    findings = read_table(paths.findings).to_pylist()
    fig = forest_figure(findings, ["alpha", "beta"])
    (marks,) = [c for c in fig.axes[0].collections if c.get_gid() == "findings"]
    xs, ys = marks.get_offsets()[:, 0], marks.get_offsets()[:, 1]
    assert len(xs) == len(findings) and list(xs) == sorted(f["holdout_median_dlogp"] for f in findings) and list(ys) == list(range(len(findings)))
    colors = {tuple(c) for c in marks.get_facecolors()}
    assert len(colors) == len({f["better_model"] for f in findings})
    # Each row says its whole statement and its n; the axis says its unit.
    shown = [" ".join(t.get_text().split()) for t in fig.axes[0].get_yticklabels()]
    by_delta = sorted(findings, key=lambda f: f["holdout_median_dlogp"])
    assert shown == [f"#{f['finding']} {' '.join(f['statement'].split())} (n = {f['holdout_n']})" for f in by_delta]
    assert "(nats)" in fig.axes[0].get_xlabel()
    png = paths.report_md.parent / "report-forest.png"
    assert str(png) in result["charts"] and "](report-forest.png)" in md.split("## Per domain", 1)[0]
    inline = re.search(r'<figure id="forest-plot"><img [^>]*src="data:image/png;base64,([^"]+)"', page).group(1)
    assert base64.b64decode(inline) == png.read_bytes()


def test_domain_chart_shows_perplexity_and_delta_per_domain(run, tmp_path):
    paths, _, page, md = run
    stats = json.loads(paths.corpus_stats.read_text())
    fig = domains_figure(stats)
    ppl_ax, delta_ax = fig.axes
    for model in ("alpha", "beta"):
        (points,) = [c for c in ppl_ax.collections if c.get_gid() == f"perplexity-{model}"]
        # domains sorted by Δ: web (-0.2) first, books (+0.4) second
        assert list(points.get_offsets()[:, 0]) == [stats["domains"][d]["models"][model]["perplexity"] for d in ("web", "books")]
    bars = [p.get_width() for p in delta_ax.patches]
    assert bars == pytest.approx([-0.2, 0.4])
    labels = [t.get_text() for t in ppl_ax.get_yticklabels()]
    assert all(
        label.startswith(d) and (f"({stats['domains'][d]['words']:,} words)" in label) == bool(stats["domains"][d].get("words"))
        for label, d in zip(labels, ("web", "books"))
    )
    assert md.index("](report-domains.png)") > md.index("## Per domain") and '<figure id="domain-chart">' in page
    assert domains_figure(corpus_stats()) is None


def test_charts_without_data_are_not_drawn_and_stale_ones_are_removed(tmp_path):
    out = build_output_dir(tmp_path / "run")
    paths = RunLayout(out)
    pq.write_table(FINDING_SCHEMA.empty_table(), paths.findings)
    stale = paths.report_md.parent / "report-forest.png"
    stale.write_bytes(b"old")
    result = run_report(report_config(out))
    assert result["charts"] == [] and not stale.exists()
    page, md = paths.report_html.read_text(encoding="utf-8"), paths.report_md.read_text(encoding="utf-8")
    assert 'id="forest-plot"' not in page and "report-forest.png" not in md and "0 finding(s)" in md


def test_wandb_findings_table_is_plain_text_with_marked_contexts(run):
    paths, result, _, _ = run
    run_dir = Path(result["wandb_dir"])
    table = _table_json(run_dir, "findings")
    assert table["columns"] == FINDING_COLUMNS
    assert {"statement", "kind", "better_model", "delta", "ci_low", "ci_high", "q", "n", "detection", "contexts"} <= set(FINDING_COLUMNS)
    rows = [dict(zip(table["columns"], r)) for r in table["data"]]
    assert all(v is None or isinstance(v, (str, int, float)) for r in rows for v in r.values())
    first = rows[0]
    assert (first["finding"], first["better_model"], first["n"], first["q"]) == (0, "alpha", 12, 0.004)
    lines = first["contexts"].split("\n")
    assert len(lines) == FINDING_CONTEXTS and all("[[⏎were]]" in line and "(alpha: " in line and " / beta: " in line for line in lines)
    features = _table_json(run_dir, "features")
    cell = dict(zip(features["columns"], features["data"][0]))["top_contexts"]
    assert isinstance(cell, str) and re.search(r"\[\[.+\]\]", cell)


def test_wandb_logs_one_image_per_chart_and_no_panel_per_latent(run):
    _, result, _, _ = run
    run_dir = Path(result["wandb_dir"])
    raw = logged_bytes(run_dir)
    assert b"dlogp_hist/" not in raw
    images = sorted(p.name.split("_")[0] + "_" + p.name.split("_")[1] for p in (run_dir / "files" / "media" / "images").glob("*.png"))
    assert images == ["domains_chart", "findings_forest", "gap_chart"]


def test_every_logprob_shown_is_finite_or_marked(run):
    paths, _, page, _ = run
    shown = re.findall(r'<span class="ctx-logprobs">(-?[\d.]+) / (-?[\d.]+)</span>', page)
    assert shown and all(math.isfinite(float(a)) and math.isfinite(float(b)) for a, b in shown)
    assert np.allclose([float(a) - float(b) for a, b in shown], 2.0, atol=0.011)


@pytest.mark.browser
def test_a_member_link_opens_the_latent_card_which_links_back(run, browser):
    paths, _, _, _ = run
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(paths.report_html.as_uri())
    page.wait_for_selector("#features tbody tr.feature-row")
    assert page.locator("#finding-1 mark.target").nth(0).text_content() == HOSTILE_WORD
    page.click('#finding-0 a.member[href="#sae:0:alpha:beta"]')
    card = page.locator("#feature-card")
    card.wait_for(state="visible")
    assert card.get_attribute("data-latent") == "0"
    back = card.locator("#card-findings a.finding-link")
    assert back.count() == 1 and back.get_attribute("href") == "#finding-0"
    assert "Kept because it carries finding 0" in card.locator("#card-kept-reason").text_content()
    back.click()
    page.wait_for_function("location.hash === '#finding-0'")
    assert page.locator("#finding-0").is_visible() and dialogs == []
    page.close()
