"""W&B can be followed from a latent to its findings, their statements, Δ and CI, and on to each
held-out context: the `latent_findings` and `finding_contexts` tables join on `finding`."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_report import FEATURES, build_output_dir, report_config
from test_report_findings import FINDING_WORDS, add_finding_tables, expected_contexts

from bbox_sae.artifacts import read_table
from bbox_sae.layout import RunLayout
from bbox_sae.report import run_report
from bbox_sae.report.wandb_tables import FINDING_CONTEXT_COLUMNS, LATENT_FINDING_COLUMNS
from bbox_sae.schemas import FINDING_SCHEMA
from helpers.wandb_log import logged_rows

LABELS = {f[0]: f[3] for f in FEATURES}


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    out = add_finding_tables(build_output_dir(tmp_path_factory.mktemp("joined") / "run"))
    paths = RunLayout(out)
    findings = read_table(paths.findings).to_pylist()
    findings[0]["latents"] = "0,3,7"  # latent 3 carries both findings: two rows, one per finding
    pq.write_table(pa.Table.from_pylist(findings, schema=FINDING_SCHEMA), paths.findings)
    result = run_report(report_config(out, mode="offline"))
    run_dir = Path(result["wandb_dir"])
    return findings, logged_rows(run_dir, "latent_findings"), logged_rows(run_dir, "finding_contexts"), logged_rows(run_dir, "findings")


def test_a_latent_joins_to_every_finding_it_carries_and_on_to_their_contexts(logged):
    findings, latent_findings, contexts, finding_table = logged
    assert list(latent_findings[0]) == LATENT_FINDING_COLUMNS and list(contexts[0]) == FINDING_CONTEXT_COLUMNS
    assert sorted((r["latent"], r["finding"]) for r in latent_findings) == [(0, 0), (3, 0), (3, 1), (4, 1), (7, 0)]
    by_finding = {f["finding"]: f for f in findings}
    for row in latent_findings:
        f = by_finding[row["finding"]]
        assert (row["statement"], row["better_model"], row["delta"], row["ci_low"], row["ci_high"], row["n"]) == (
            f["statement"], f["better_model"], f["holdout_median_dlogp"], f["holdout_ci_low"], f["holdout_ci_high"], f["holdout_n"],
        )  # fmt: skip
        assert row["ci_low"] <= row["delta"] <= row["ci_high"]
        assert row["label"] == LABELS.get(row["latent"])  # latent 7 is no feature row: no label, not kept
    assert [r["kept"] for r in latent_findings if r["latent"] == 7] == [False]
    # latent -> finding -> context: latent 3's rows reach the held-out words of both its findings.
    reached = {(c["doc_id"], c["word_idx"]) for r in latent_findings if r["latent"] == 3 for c in contexts if c["finding"] == r["finding"]}
    assert reached == {(d, i) for finding in (0, 1) for d, i, _ in expected_contexts(finding)}
    assert {c["finding"] for c in contexts} == {f["finding"] for f in finding_table}


def test_one_row_per_context_with_its_delta(logged):
    _, _, contexts, finding_table = logged
    shown = {f["finding"]: f["contexts"].count("\n") + 1 for f in finding_table}
    assert {f: sum(c["finding"] == f for c in contexts) for f in shown} == shown
    for c in contexts:
        assert c["delta"] == pytest.approx(c["logprob_a"] - c["logprob_b"]) and "\n" not in c["left"] + c["word"] + c["right"]
    assert [c["rank"] for c in contexts if c["finding"] == 1] == list(range(len(FINDING_WORDS[1])))
