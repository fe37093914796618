"""The feature table of report.html and W&B: each feature's rule with its held-out precision and
recall, and its label scores (detection always, fuzzing when the labeler wrote it), sortable."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_report import FEATURES, build_output_dir, embedded_data, report_config

from bbox_sae.layout import RunLayout
from bbox_sae.report import WANDB_COLUMNS, run_report

# latent -> (rule, rule precision, rule recall, detection score, fuzzing score); None: not scored.
SCORED = {
    0: ("'were' right after 'if you'", 0.9, 0.6, 0.95, 0.7),
    1: ("closing quotes at a line end", 0.5, 0.8, 0.62, None),
    2: (None, None, None, None, None),
    3: ("<script> tags", 0.7, 0.7, 0.81, 0.9),
    4: ("a unit after a number", 0.3, 0.9, 0.55, 0.6),
    5: (None, None, None, None, None),
    6: ("'of' before a noun", 0.2, 0.1, 0.74, 0.65),
}
NUMERIC = {
    "latent",
    "label_score",
    "fuzz_score",
    "rule_precision",
    "rule_recall",
    "median_dlogp",
    "ci_low",
    "q_value",
    "holdout_median_dlogp",
}  # sign consistency and density: on the feature card, not in the table (test_report_browser)


def scored_output_dir(out: Path, fuzz: bool) -> Path:
    """test_report's output dir with rules, their fit and distinct label scores per feature."""
    build_output_dir(out)
    table = pq.read_table(RunLayout(out).features).drop_columns(["label_score"])
    latents = table["latent"].to_pylist()
    columns = {"rule": pa.string(), "rule_precision": pa.float64(), "rule_recall": pa.float64(), "label_score": pa.float64()}
    if fuzz:
        columns["fuzz_score"] = pa.float64()
    for i, (name, kind) in enumerate(columns.items()):
        table = table.append_column(name, pa.array([SCORED[latent][i] for latent in latents], kind))
    table = table.append_column("rule_f1", pa.array([0.5] * len(latents), pa.float64()))
    pq.write_table(table, RunLayout(out).features)
    return out


def head_cells(page: str) -> list[dict]:
    thead = page.split('<table id="features"><thead>', 1)[1].split("</thead>", 1)[0]
    return [dict(re.findall(r'([\w-]+)="([^"]*)"', attrs)) for attrs in re.findall(r"<th\b([^>]*)>", thead)]


@pytest.mark.parametrize("fuzz", [False, True])
def test_table_head_has_rule_fit_and_scores_each_sortable(tmp_path, fuzz):
    out = scored_output_dir(tmp_path / "run", fuzz)
    run_report(report_config(out))
    page = RunLayout(out).report_html.read_text(encoding="utf-8")
    cells = head_cells(page)
    keys = [c["data-sort"] for c in cells]
    assert all(c.get("data-format") for c in cells), "every column names its formatter"
    assert len(keys) == len(set(keys))
    for key in ("rule", "rule_precision", "rule_recall", "label_score", "label", "median_dlogp"):
        assert key in keys
    assert ("fuzz_score" in keys) == fuzz
    if fuzz:
        assert keys.index("fuzz_score") == keys.index("label_score") + 1
    assert {c["data-sort"] for c in cells if "num" in c.get("class", "").split()} == NUMERIC - ({"fuzz_score"} - set(keys))
    data = embedded_data(page)
    assert data["scores"] == [["label_score", "detection"]] + ([["fuzz_score", "fuzzing"]] if fuzz else [])


def test_embedded_features_carry_the_rule_fit_and_scores(tmp_path):
    out = scored_output_dir(tmp_path / "run", fuzz=True)
    run_report(report_config(out))
    for f in embedded_data(RunLayout(out).report_html.read_text(encoding="utf-8"))["features"]:
        assert (f["rule"], f["rule_precision"], f["rule_recall"], f["label_score"], f["fuzz_score"]) == SCORED[f["latent"]]


def test_wandb_features_table_has_the_scores(tmp_path):
    out = scored_output_dir(tmp_path / "run", fuzz=True)
    result = run_report(report_config(out, mode="offline"))
    (path,) = (Path(result["wandb_dir"]) / "files" / "media" / "table").glob("features_*.table.json")
    table = json.loads(path.read_text())
    at = WANDB_COLUMNS.index("label_score") + 1
    assert table["columns"] == WANDB_COLUMNS[:at] + ["fuzz_score"] + WANDB_COLUMNS[at:]
    assert len(table["data"]) == len(FEATURES)
    for row in table["data"]:
        r = dict(zip(table["columns"], row))
        assert (r["rule"], r["rule_precision"], r["rule_recall"], r["label_score"], r["fuzz_score"]) == SCORED[r["latent"]]
