"""Report stage: W&B tables, the self-contained report.html and report.md, on a synthetic output dir."""

from __future__ import annotations

import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from markupsafe import escape

from bbox_sae.config import FeaturesConfig, config_from_dict
from bbox_sae.errors import ArtifactError
from bbox_sae.features import FINDING_SCHEMA
from bbox_sae.layout import RunLayout
from bbox_sae.report import FINDING_COLUMNS, WANDB_COLUMNS, run_report
from helpers.wandb_log import logged_bytes

HOSTILE_WORD = "<script>alert(1)</script>"
HOSTILE_LEFT = "before </script><script>alert(2)</script> "
HOSTILE_RIGHT = " after & </script>"
HOSTILE_LABEL = '</script><script>alert("label")</script> closing tags'

# latent, median Δlog p (alpha − beta), kept, label, top words
FEATURES = [
    (0, 2.0, True, "conditional 'were' after 'if you'", "were"),
    (1, -1.5, True, "closing quotation marks", '" | »'),
    (2, 0.3, False, None, "the | a"),
    (3, -3.0, True, HOSTILE_LABEL, f"{HOSTILE_WORD} | </script>"),
    (4, 1.2, True, "units after numbers", "km | kg"),
    (5, -0.1, False, None, "and"),
    (6, 0.0, False, None, "of"),
]
N_TRAIN, N_IN_TOP, N_HOLDOUT = 6, 5, 3


def _delta(median: float, rank: int) -> float:
    return median + 0.1 * (rank - 2)


def _feature_columns(with_labels: bool) -> dict:
    cols = {
        "latent": pa.array([f[0] for f in FEATURES], pa.int32()),
        "model_a": ["alpha"] * len(FEATURES),
        "model_b": ["beta"] * len(FEATURES),
        "n_top": pa.array([N_IN_TOP] * len(FEATURES), pa.int32()),
        "density": [0.001 * (i + 1) for i in range(len(FEATURES))],
        "max_activation": [5.0] * len(FEATURES),
        "median_dlogp": [f[1] for f in FEATURES],
        "mean_dlogp": [f[1] + 0.05 for f in FEATURES],
        "median_dp": [f[1] / 10 for f in FEATURES],
        "ci_low": [f[1] - 0.4 for f in FEATURES],
        "ci_high": [f[1] + 0.4 for f in FEATURES],
        "consistency": [0.9] * len(FEATURES),
        "p_value": [1e-4] * len(FEATURES),
        "q_value": [0.001 if f[2] else 0.5 for f in FEATURES],
        "coherence": [0.7] * len(FEATURES),
        "holdout_n": pa.array([N_HOLDOUT] * len(FEATURES), pa.int32()),
        "holdout_median_dlogp": [f[1] * 0.8 for f in FEATURES],
        "holdout_mean_dlogp": [f[1] * 0.8 for f in FEATURES],
        "holdout_median_dp": [f[1] / 12 for f in FEATURES],
        "generalizes": [f[2] for f in FEATURES],
        "paper_rule": [f[2] for f in FEATURES],
        "kept": [f[2] for f in FEATURES],
        "better_model": ["alpha" if f[1] > 0 else "beta" if f[1] < 0 else None for f in FEATURES],
        "top_words": [f[4] for f in FEATURES],
        "source": ["sae"] * len(FEATURES),
    }
    if with_labels:
        cols["label"] = [f[3] for f in FEATURES]
        cols["label_source"] = ["llm:test-model" if f[3] else "unlabeled" for f in FEATURES]
        cols["label_reason"] = [None if f[3] else "not kept" for f in FEATURES]
        cols["label_coherent"] = [bool(f[3]) for f in FEATURES]
        cols["label_score"] = [0.85 if f[3] else None for f in FEATURES]
        cols["label_precision"] = [0.8 if f[3] else None for f in FEATURES]
        cols["label_recall"] = [0.9 if f[3] else None for f in FEATURES]
    return cols


def _context_rows() -> list[dict]:
    rows = []
    for latent, median, _, _, words in FEATURES:
        word = words.split(" | ")[0]
        for split, n in (("train", N_TRAIN), ("holdout", N_HOLDOUT), ("negative", 2)):
            for rank in range(n):
                hostile = latent == 3 and rank == 0
                lp_alpha = -1.0 - 0.1 * rank
                lp_beta = None if (latent == 2 and rank == N_TRAIN - 1 and split == "train") else lp_alpha - _delta(median, rank)
                rows.append(
                    {
                        "latent": latent,
                        "split": split,
                        "rank": rank,
                        "doc_id": "doc-evil" if hostile else f"{split}-doc-{latent}-{rank}",
                        "word_idx": 7,
                        "activation": 0.0 if split == "negative" else 5.0 - rank,
                        "in_top": split == "train" and rank < N_IN_TOP,
                        "left": HOSTILE_LEFT if hostile else f"left of {split} {rank} ",
                        "word": HOSTILE_WORD if hostile else word,
                        "right": HOSTILE_RIGHT if hostile else " right",
                        "logprob__alpha": lp_alpha,
                        "logprob__beta": lp_beta,
                    }
                )
    return rows


CONTEXT_SCHEMA = pa.schema(
    [
        ("latent", pa.int32()), ("split", pa.string()), ("rank", pa.int32()), ("doc_id", pa.string()),
        ("word_idx", pa.int32()), ("activation", pa.float32()), ("in_top", pa.bool_()), ("left", pa.string()),
        ("word", pa.string()), ("right", pa.string()), ("logprob__alpha", pa.float64()), ("logprob__beta", pa.float64()),
    ]
)  # fmt: skip


def _finding(finding: int, better: str, rule: str | None, delta: float, latents: str, statement: str | None = None) -> dict:
    return {
        "finding": finding,
        "model_a": "alpha",
        "model_b": "beta",
        "better_model": better,
        "latents": latents,
        "n_latents": latents.count(",") + 1,
        "n_top": 40,
        "holdout_n": 12,
        "median_dlogp": delta,
        "mean_dlogp": delta,
        "median_dp": 0.2,
        "ci_low": delta - 0.3,
        "ci_high": delta + 0.3,
        "consistency": 0.9,
        "holdout_median_dlogp": delta,
        "holdout_ci_low": delta - 0.5,
        "holdout_ci_high": delta + 0.5,
        "holdout_p_value": 1e-4,
        "rule": rule,
        "rule_json": None,
        "rule_precision": 0.8 if rule else None,
        "rule_recall": 0.9 if rule else None,
        "rule_f1": 0.85 if rule else None,
        "top_words": "were (30)",
        "kind": "rule" if rule else "latent",
        "statement": rule or statement,
        "word_set_json": None if rule else json.dumps({"forms": ["were"], "counts": [30], "suffix": None, "left": None}),
    }


FINDINGS = [
    _finding(0, "alpha", "'were' right after a pronoun", 2.0, "0,7"),
    _finding(1, "beta", None, -1.5, "3", statement="a group of 2 word forms, most often <script>alert(2)</script>"),
]


def corpus_stats() -> dict:
    return {
        "models": {
            "alpha": {"mean_logprob": -3.25, "perplexity": math.exp(3.25), "words": 1000},
            "beta": {"mean_logprob": -3.5, "perplexity": math.exp(3.5), "words": 1000},
        },
        "documents": 12,
        "words": 1000,
        "pairs": [["alpha", "beta"]],
        "pair_stats": {"alpha vs beta": {"mean_dlogp": 0.25, "median_dlogp": 0.1, "share_a_better": 0.55}},
        # The settings the features stage decided with: the report says its tests by these.
        "features_settings": FeaturesConfig().model_dump(mode="json"),
    }


def build_output_dir(out: Path, with_labels: bool = True, with_documents: bool = True) -> Path:
    """A features-stage output dir as docs/artifacts.md describes it, with one hostile document."""
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(_feature_columns(with_labels)), RunLayout(out).features)
    pq.write_table(pa.Table.from_pylist(_context_rows(), schema=CONTEXT_SCHEMA), RunLayout(out).contexts)
    RunLayout(out).corpus_stats.write_text(json.dumps(corpus_stats()))
    pq.write_table(pa.Table.from_pylist(FINDINGS, schema=FINDING_SCHEMA), RunLayout(out).findings)
    if with_documents:
        doc_ids = sorted({r["doc_id"] for r in _context_rows()})
        docs = {
            "doc_id": doc_ids,
            "text": [f"{HOSTILE_LEFT}{HOSTILE_WORD}{HOSTILE_RIGHT}" if d == "doc-evil" else "text" for d in doc_ids],
            "split": ["train" if d.startswith("train") or d == "doc-evil" else "holdout" for d in doc_ids],
            "domain": ["web" if d == "doc-evil" else "books" for d in doc_ids],
            "shard": pa.array([0] * len(doc_ids), pa.int64()),
        }
        pq.write_table(pa.table(docs), RunLayout(out).documents)
    return out


def report_config(out: Path, mode: str = "disabled", **report):
    return config_from_dict(
        {
            "output_dir": str(out),
            "corpus": {"path": "x.jsonl"},
            "models": [{"name": "alpha", "source": "parquet", "path": "a.parquet"}, {"name": "beta", "source": "parquet", "path": "b.parquet"}],
            "wandb": {"mode": mode},
            "report": report,
        }
    )


def embedded_data(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S)
    assert match, "report.html has no embedded data block"
    return json.loads(match.group(1))


class StructureChecker(HTMLParser):
    """Tracks open elements to catch unbalanced tags, and records scripts and external references."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.scripts: list[dict] = []
        self.references: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            self.scripts.append(attrs)
        for name in ("src", "href", "action", "data"):
            if attrs.get(name) is not None:
                self.references.append((tag, name, attrs[name]))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()


def check_structure(page: str) -> StructureChecker:
    checker = StructureChecker()
    checker.feed(page)
    checker.close()
    return checker


@pytest.fixture
def report(tmp_path):
    out = build_output_dir(tmp_path / "run")
    result = run_report(report_config(out))
    return out, result, RunLayout(out).report_html.read_text(encoding="utf-8")


def test_html_is_well_formed_and_self_contained(report):
    _, _, page = report
    checker = check_structure(page)
    assert checker.problems == []
    assert checker.stack == []
    # The only references: charts inlined as data URIs, and links within the page.
    assert all(
        v.startswith("data:image/png;base64,") if (tag, name) == ("img", "src") else (name == "href" and v.startswith("#"))
        for tag, name, v in checker.references
    )
    assert [tag for tag, _, _ in checker.references].count("img") == 1  # the forest plot (no domains here)
    assert not re.search(r"https?:|(?<![:\w])//[\w.-]+\.[a-z]{2,}/|<link\b|@import|url\(", page, re.I)
    assert [s.get("type") for s in checker.scripts] == ["application/json", None]


def test_hostile_text_is_escaped_and_round_trips(report):
    _, _, page = report
    assert HOSTILE_WORD not in page
    block = page.split('id="report-data">', 1)[1].split("</script>", 1)[0]
    assert not set("<>&") & set(block)
    assert len(re.findall(r"<script\b", page, re.I)) == 2
    assert page.count("</script>") == 2
    data = embedded_data(page)
    hostile = next(f for f in data["features"] if f["latent"] == 3)
    assert hostile["label"] == HOSTILE_LABEL
    first = hostile["contexts"]["train"][0]
    assert (first["left"], first["word"], first["right"]) == (HOSTILE_LEFT, HOSTILE_WORD, HOSTILE_RIGHT)
    assert first["domain"] == "web"


def test_hostile_header_text_is_escaped(tmp_path):
    """The header's template escapes what comes from the run: domain names, SAE metrics."""
    out = build_output_dir(tmp_path / "run")
    stats = corpus_stats()
    stats["domains"] = {HOSTILE_WORD: {"documents": 1, "words": 2, "models": {"alpha": {"perplexity": 3.0}}}}
    RunLayout(out).corpus_stats.write_text(json.dumps(stats))
    sae_run = RunLayout(out).sae_run("r1")
    sae_run.root.mkdir(parents=True)
    sae_run.metrics.write_text(json.dumps({"note": HOSTILE_LABEL}))
    run_report(report_config(out))
    page = RunLayout(out).report_html.read_text(encoding="utf-8")
    header = page.split("</header>", 1)[0]
    assert HOSTILE_WORD not in page and "<script" not in header
    assert f'<tr data-domain="{escape(HOSTILE_WORD)}"><td>{escape(HOSTILE_WORD)}</td>' in header
    assert f"<td>note</td><td>{escape(HOSTILE_LABEL)}</td>" in header
    assert check_structure(page).problems == [] and page.count("</script>") == 2


def test_html_header_shows_corpus_level_numbers(report):
    _, _, page = report
    header = page.split("</header>", 1)[0]
    assert 'id="n-documents">12<' in header and 'id="n-words">1,000<' in header
    assert 'data-sort="pair"' not in page  # one pair: no column repeating it on every row
    for model, stats in corpus_stats()["models"].items():
        row = re.search(rf'<tr data-model="{model}">(.*?)</tr>', header).group(1)
        assert f"{stats['mean_logprob']:.4f}" in row and f"{stats['perplexity']:.3f}" in row


def test_html_lists_kept_first_then_by_abs_median(report):
    _, result, page = report
    latents = [f["latent"] for f in embedded_data(page)["features"]]
    assert latents == [3, 0, 1, 4, 2, 5, 6]
    assert result["shown"] == len(FEATURES) and result["kept"] == 4


def test_html_limits_features_and_examples(tmp_path):
    out = build_output_dir(tmp_path / "run")
    result = run_report(report_config(out, max_features=3, examples_per_feature=2))
    data = embedded_data(RunLayout(out).report_html.read_text(encoding="utf-8"))
    assert [f["latent"] for f in data["features"]] == [3, 0, 1]
    assert result["shown"] == 3 and result["features"] == len(FEATURES)
    for f in data["features"]:
        assert [c["rank"] for c in f["contexts"]["train"]] == [0, 1]
        assert [c["rank"] for c in f["contexts"]["holdout"]] == [0, 1]


def test_histogram_covers_the_top_words_only(report):
    _, _, page = report
    by_latent = {f["latent"]: f for f in embedded_data(page)["features"]}
    hist = by_latent[0]["hist"]
    assert sum(hist["counts"]) == N_IN_TOP
    assert hist["edges"][0] == pytest.approx(_delta(2.0, 0)) and hist["edges"][-1] == pytest.approx(_delta(2.0, N_IN_TOP - 1))
    assert by_latent[2]["contexts"]["train"][-1]["logprob"][1] is None


def test_markdown_summary(report):
    out, result, _ = report
    md = RunLayout(out).report_md.read_text(encoding="utf-8")
    assert result["report_md"] == str(RunLayout(out).report_md)
    assert "| alpha | -3.2500 | 25.790 | 1,000 |" in md
    alpha = md.split("### alpha better", 1)[1].split("###", 1)[0]
    beta = md.split("### beta better", 1)[1]
    assert "conditional 'were' after 'if you'" in alpha and "+2.00 [+1.60, +2.40]" in alpha and "1.0e-03" in alpha
    assert "closing quotation marks" in beta and "units after numbers" not in beta
    assert "<script>" not in md and "&lt;script&gt;alert(1)&lt;/script&gt; \\| &lt;/script&gt;" in beta
    assert all(line.count("|") - line.count("\\|") == 8 for line in md.splitlines() if line.startswith("| 3 |"))


MD_LABEL = "[lnk](javascript:alert(1)) ![i](http://host/track.png) <https://x.example> www.evil.example a@b.example *em* `code` a|b"
MD_DOMAIN = "![d](http://127.0.0.1:9/d.png)"


def test_markdown_renders_hostile_labels_domains_and_names_as_text(tmp_path):
    """Issue 41 item 2: report.md escaped HTML but not Markdown: an LLM label rendered as a live
    link and a remote tracking image, and so did a document's `domain` in the per-domain table."""
    from markdown_it import MarkdownIt

    out = build_output_dir(tmp_path / "run")
    layout = RunLayout(out)
    features = pq.read_table(layout.features).to_pylist()
    for f in features:
        f["label"] = MD_LABEL if f["label"] else None
    pq.write_table(pa.Table.from_pylist(features), layout.features)
    pq.write_table(pa.Table.from_pylist([{**FINDINGS[0], "statement": MD_LABEL}, FINDINGS[1]], schema=FINDING_SCHEMA), layout.findings)
    stats = corpus_stats()
    stats["domains"] = {MD_DOMAIN: {"documents": 1, "words": 2, "models": {"alpha": {"perplexity": 3.0}}}}
    layout.corpus_stats.write_text(json.dumps(stats))
    layout.sae_run("r`1").root.mkdir(parents=True)
    layout.sae_run("r`1").metrics.write_text("{}")
    run_report(report_config(out))
    md = layout.report_md.read_text(encoding="utf-8")
    rendered = MarkdownIt("commonmark").enable("table").render(md)
    # The only images: the report's own charts, next to report.md; no link at all.
    assert re.findall(r'<img src="([^"]*)"', rendered) == ["report-forest.png", "report-domains.png"]
    assert "<a " not in rendered and "<em>" not in rendered and "<code>code</code>" not in rendered
    # GFM turns bare URLs, www. names and e-mail addresses into links too: each is broken by an escape.
    assert not re.search(r"(?<!\\)(://|www\.|@)", md)
    assert rendered.count(escape(MD_LABEL)) >= 3 and escape(MD_DOMAIN) in rendered  # shown as the text they are
    assert "<code>r`1</code>" in rendered  # a run name in a code span, backtick and all


def test_labels_are_optional(tmp_path):
    out = build_output_dir(tmp_path / "run", with_labels=False, with_documents=False)
    run_report(report_config(out))
    data = embedded_data(RunLayout(out).report_html.read_text(encoding="utf-8"))
    assert all(f["label"] is None and f["label_source"] is None for f in data["features"])
    assert all(c["domain"] is None for f in data["features"] for c in f["contexts"]["train"])
    assert "| 0 |  | +2.00 [+1.60, +2.40] |" in RunLayout(out).report_md.read_text(encoding="utf-8")


def test_sae_metrics_are_listed(tmp_path):
    out = build_output_dir(tmp_path / "run")
    metrics = {"run_name": "batchtopk-d64-k4", "steps": 120, "holdout": {"explained_variance": 0.91, "mean_l0": 4.0}, "curve": [1, 2]}
    sae_run = RunLayout(out).sae_run("batchtopk-d64-k4")
    sae_run.root.mkdir(parents=True)
    sae_run.metrics.write_text(json.dumps(metrics))
    result = run_report(report_config(out))
    page = RunLayout(out).report_html.read_text(encoding="utf-8")
    assert result["sae_runs"] == ["batchtopk-d64-k4"]
    assert "<td>holdout.explained_variance</td><td>0.91</td>" in page and "curve" not in page
    assert "sae/batchtopk-d64-k4/metrics.json" in RunLayout(out).report_md.read_text(encoding="utf-8")


def test_missing_features_is_a_clear_error(tmp_path):
    out = build_output_dir(tmp_path / "run")
    RunLayout(out).features.unlink()
    with pytest.raises(ArtifactError, match="features.parquet"):
        run_report(report_config(out))


# ---------------------------------------------------------------- W&B (offline)


def _table_json(run_dir: Path, key: str) -> dict:
    (path,) = (run_dir / "files" / "media" / "table").glob(f"{key}_*.table.json")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def offline_runs(tmp_path_factory):
    """The report run twice in offline mode, as a user re-running the stage would."""
    out = build_output_dir(tmp_path_factory.mktemp("wandb") / "run")
    cfg = report_config(out, mode="offline")
    first = run_report(cfg)
    second = run_report(cfg)
    return out, first, second


def test_wandb_tables_have_documented_columns_and_all_rows(offline_runs):
    _, _, result = offline_runs
    run_dir = Path(result["wandb_dir"])
    features = _table_json(run_dir, "features")
    kept = _table_json(run_dir, "kept_features")
    assert features["columns"] == WANDB_COLUMNS and kept["columns"] == WANDB_COLUMNS
    assert len(features["data"]) == len(FEATURES)
    assert sorted(r[0] for r in kept["data"]) == sorted(f[0] for f in FEATURES if f[2])
    row = dict(zip(WANDB_COLUMNS, next(r for r in features["data"] if r[0] == 0)))
    assert (row["pair"], row["better_model"], row["label_source"], row["median_dlogp"]) == ("alpha vs beta", "alpha", "llm:test-model", 2.0)
    corpus = _table_json(run_dir, "corpus")
    assert [r[:3] for r in corpus["data"]] == [[m, s["mean_logprob"], s["perplexity"]] for m, s in corpus_stats()["models"].items()]


def test_wandb_logs_charts_not_a_panel_per_kept_feature(offline_runs):
    """A panel per kept latent floods a workspace at thousands of latents: the charts are one image each."""
    _, _, result = offline_runs
    raw = logged_bytes(Path(result["wandb_dir"]))
    assert b"dlogp_hist/" not in raw and b"findings_forest" in raw


def test_wandb_rerun_updates_the_same_run(offline_runs):
    _, first, second = offline_runs
    assert first["wandb_run"] == second["wandb_run"]
    wandb_root = Path(second["wandb_dir"]).parent
    run_dirs = [p for p in wandb_root.iterdir() if p.is_dir() and second["wandb_run"] in p.name]
    assert run_dirs == [Path(second["wandb_dir"])]


def test_wandb_run_carries_the_findings_tables_and_each_sae_as_artifacts(tmp_path):
    """A user on a GPU box pulls the SAE and the findings from W&B: tables alone were not enough."""
    out = build_output_dir(tmp_path / "run")
    sae_run = RunLayout(out).sae_run("batchtopk-d64-k4")
    sae_run.root.mkdir(parents=True)
    sae_run.metrics.write_text(json.dumps({"holdout": {"explained_variance": 0.91}}))
    sae_run.weights.write_bytes(b"weights")
    sae_run.sae_config.write_text("{}")
    result = run_report(report_config(out, mode="offline"))
    raw = logged_bytes(Path(result["wandb_dir"]))
    assert b"sae-batchtopk-d64-k4" in raw and b"run-findings" in raw
    for name in ("findings.parquet", "finding_words.parquet", "features.parquet", "sae_weights.safetensors", "cfg.json"):
        assert name.encode() in raw, name
    assert b"explained_variance" in raw  # the SAE's metrics ride with it


def test_findings_come_first_in_every_summary(report, offline_runs):
    out, _, page = report
    md = RunLayout(out).report_md.read_text(encoding="utf-8")
    section = md.split("## Findings", 1)[1].split("## alpha vs beta", 1)[0]
    assert "2 finding(s)" in section and "| 'were' right after a pronoun | rule (rule) |" in section and "+2.00 [+1.50, +2.50]" in section
    assert "| latent (word set) |" in section  # a latent group is marked as such, not passed off as a rule
    assert section.index("| 0 |") < section.index("| 1 |") and "&lt;script&gt;alert(2)" in section
    table = page.split('id="findings-table"', 1)[1].split("</table>", 1)[0]
    assert table.count('<tr class="finding-row"') == 2 and "alert(2)</script>" not in table and "&lt;script&gt;alert(2)" in table
    _, _, result = offline_runs
    findings = _table_json(Path(result["wandb_dir"]), "findings")
    assert findings["columns"] == FINDING_COLUMNS and [r[0] for r in findings["data"]] == [0, 1]


def test_page_assets_ship_with_the_package():
    """A non-editable install carries the page template, CSS and JS: pyproject's package-data covers them."""
    import fnmatch
    import tomllib

    import bbox_sae.report

    package = Path(bbox_sae.report.__file__).parent
    globs = tomllib.loads((package.parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["bbox_sae.report"]
    assets = [p.relative_to(package).as_posix() for p in (package / "assets").iterdir()]
    assert {"assets/page.html", "assets/report.css", "assets/report.js"} <= set(assets)
    assert all(any(fnmatch.fnmatch(a, g) for g in globs) for a in assets)
