"""The gap account where a reader meets it: first in report.md and report.html, in the W&B summary
and tables, and in the console summary printed to a log (no terminal, no COLUMNS)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from test_report import _table_json, build_output_dir, report_config

from bbox_sae import pipeline
from bbox_sae.layout import RunLayout
from bbox_sae.report import run_report
from bbox_sae.report.gap_views import headline
from bbox_sae.report.inputs import load_inputs
from helpers.gap_run import FINDINGS, HELD, add_gap_tables, held_out_deltas
from helpers.wandb_log import logged_summary


@pytest.fixture(scope="module")
def gap_run(tmp_path_factory):
    out = add_gap_tables(build_output_dir(tmp_path_factory.mktemp("gap") / "run"))
    cfg = report_config(out, mode="offline")
    result = run_report(cfg)
    return out, cfg, result


def _expected(out: Path) -> dict:
    """The account computed the plain way, from the index and words."""
    delta, docs, words = held_out_deltas(out)
    forms = np.array([w.strip().lower() for w in words])
    tragedy = np.array([d.startswith("tragedy") for d in docs])
    a_adv, b_adv = delta[delta > 0].sum(), -delta[delta < 0].sum()
    king = forms == "king"
    return {
        "delta": delta,
        "mean": delta.mean(),
        "share": {0: delta[forms == "fool"].sum() / a_adv, 1: -delta[king & tragedy].sum() / b_adv, 2: -delta[king].sum() / b_adv},
        "union_b": -delta[king].sum() / b_adv,  # finding 1's words lie inside finding 2's
    }


def test_report_md_opens_with_the_gap_account_of_the_held_out_words(gap_run):
    out, cfg, _ = gap_run
    md = RunLayout(out).report_md.read_text(encoding="utf-8")
    assert md.index("## The gap") < md.index("## Corpus level") < md.index("## Findings")
    gap = md.split("## The gap", 1)[1].split("## Corpus level", 1)[0]
    expected = _expected(out)
    assert f"on the {len(expected['delta']):,} held-out words ({len(HELD)} documents" in gap
    assert f"{expected['mean']:+.3f} nats per word" in gap and "alpha is better overall" in gap
    for finding, share in expected["share"].items():
        assert re.search(rf"^\| {finding} \| .* \| {share:.1%} \|$", gap, re.M), finding
    assert f"Its 2 finding(s) carry {expected['union_b']:.1%} of it" in gap and f"left: {1 - expected['union_b']:.1%}" in gap
    # Finding 1 ('king' in a tragedy) and finding 2 ('king': 75% of its summed Δ from tragedies) rest on one domain; 'fool' does not.
    assert "Findings carried by one domain: 2 of 3." in gap
    assert "Finding 1 ('king' in a tragedy) is carried by one domain: tragedy gives 100%" in gap and "tragedy gives 75%" in gap
    assert "![mean Δlog p and 95% CI by word frequency, kind of word, place and domain](report-gap.png)" in gap
    assert (RunLayout(out).root / "report-gap.png").read_bytes()[:4] == b"\x89PNG"


def test_where_the_gap_lives_partitions_every_held_out_word_on_each_axis(gap_run):
    out, cfg, _ = gap_run
    (acc,) = load_inputs(cfg).gap
    expected = _expected(out)
    assert {s.axis for s in acc.slices} == {"frequency", "kind", "place", "domain"}
    for axis in ("frequency", "kind", "place", "domain"):
        rows = [s for s in acc.slices if s.axis == axis]
        assert sum(s.words for s in rows) == len(expected["delta"]) and sum(s.gap_share for s in rows) == pytest.approx(1.0)
        assert all(s.ci_low <= s.mean_dlogp <= s.ci_high for s in rows)
    by = {(s.axis, s.name): s for s in acc.slices}
    # Each play opens on "Enter the FOOL.\n\nThe fool": five words, with the mark and blank line between them.
    opening = by[("place", "a text's opening (first 5 words)")]
    assert opening.words == 7 * len(HELD)
    assert by[("domain", "tragedy")].mean_dlogp < by[("domain", "comedy")].mean_dlogp  # the tragedies' kings weigh more
    # 'Enter' and 'FOOL' are capitalised words, 'The' a function word whatever its case, ' 3' a number.
    assert by[("kind", "capitalised")].words == 2 * len(HELD) and by[("kind", "number")].words == len(HELD)
    assert by[("kind", "capitalised")].mean_dlogp == pytest.approx((2.0 + np.mean([0.05 * (i - 1.5) for i in range(4)]) - 0.1) / 2)


def test_report_html_shows_the_account_first_and_each_finding_by_domain(gap_run):
    out, _, _ = gap_run
    page = RunLayout(out).report_html.read_text(encoding="utf-8")
    assert page.index('class="gap"') < page.index('id="corpus-table"') < page.index('id="findings"')
    assert 'id="gap-chart"><img alt="mean Δlog p' in page
    article = page.split('id="finding-1"', 1)[1].split("</article>", 1)[0]
    assert '<tr data-domain="tragedy"><td>tragedy</td><td class="num">8</td><td class="num">-1.50</td><td class="num">100.0%</td>' in article
    assert "Carried by tragedy: 100% of its summed Δ." in article
    fool = page.split('id="finding-0"', 1)[1].split("</article>", 1)[0]
    assert "No one domain carries it." in fool and fool.count("<tr data-domain=") == 2


def test_wandb_summary_and_tables_carry_the_account(gap_run):
    out, _, result = gap_run
    run_dir = Path(result["wandb_dir"])
    summary = logged_summary(run_dir, "gap/")
    expected = _expected(out)
    assert summary["gap/alpha vs beta/mean_dlogp"] == pytest.approx(expected["mean"])
    assert summary["gap/alpha vs beta/ci_low"] <= expected["mean"] <= summary["gap/alpha vs beta/ci_high"]
    assert summary["gap/alpha vs beta/beta/findings_share"] == pytest.approx(expected["union_b"])
    assert summary["gap/alpha vs beta/beta/left"] == pytest.approx(1 - expected["union_b"])
    (acc,) = load_inputs(report_config(out)).gap
    assert summary["gap/alpha vs beta/statement"] == " ".join(headline(acc))
    assert summary["gap/alpha vs beta/findings_net_share"] == pytest.approx(acc.findings_net_share)
    assert summary["gap/alpha vs beta/perplexity/beta"] == pytest.approx(acc.perplexity["beta"])
    shares = _table_json(run_dir, "gap_findings")
    assert {r[1]: r[6] for r in shares["data"]} == pytest.approx(expected["share"])
    slices = _table_json(run_dir, "gap_slices")
    assert {r[1] for r in slices["data"]} == {"frequency", "kind", "place", "domain"}
    domains = _table_json(run_dir, "finding_domains")
    assert [r[1:3] + r[-1:] for r in domains["data"] if r[1] == 1] == [[1, "tragedy", "tragedy"]]


def test_console_summary_in_a_log_says_the_account_and_breaks_no_statement(gap_run, monkeypatch):
    out, _, _ = gap_run
    monkeypatch.delenv("COLUMNS", raising=False)
    log = io.StringIO()
    pipeline._print_findings(RunLayout(out), Console(file=log), limit=None)  # not a terminal: rich would wrap at 80 columns
    lines = log.getvalue().splitlines()
    inputs_gap = load_inputs(report_config(out)).gap
    for statement in headline(inputs_gap[0]):
        assert statement in lines, statement  # each on one line of its own, however long
    assert "3 finding(s): 1 carried by 1 latent(s), 2 found by the rule search alone (no latent carries them)." in lines
    findings = [line for line in lines if line.startswith("  finding ")]
    assert len(findings) == len(FINDINGS) and all("(train: " in line for line in findings)
    assert not any(line.rstrip().endswith("()") for line in lines)
