"""The core of the house: the bookkeeping below the stages, the stage table above them, one typed manifest.

A stage reads only the config sections it declares (they are its key), the report says the features
stage's tests by the settings that decided them, no stage package imports anything above it, and the
manifest is read once and written through one record at a time."""

from __future__ import annotations

import ast
import json

import pytest

from bbox_sae.bookkeeping import Stage, execute, stage_key
from bbox_sae.config import SECTIONS, config_from_dict
from bbox_sae.errors import UndeclaredRead
from bbox_sae.manifest import Manifest, StageRecord
from bbox_sae.stages import BY_NAME, REPORT, STAGES
from helpers.cli import bbox
from helpers.project import SMALL_RUN, make_project
from helpers.repo import REPO

# The packages of the pipeline's stages, and what stands above them: the table, the commands.
STAGE_PACKAGES = ("corpus", "scoring", "embedding", "build", "train", "features", "labeling", "report")
ABOVE_STAGES = ("bbox_sae.stages", "bbox_sae.bookkeeping", "bbox_sae.pipeline", "bbox_sae.variants", "bbox_sae.sweep", "bbox_sae.evaluation", "bbox_sae.cli")


def _config(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"id": "d0", "text": "one two"}\n')
    return config_from_dict(
        {
            "output_dir": str(tmp_path / "out"),
            "corpus": {"path": str(tmp_path / "c.jsonl")},
            "models": [{"name": "a", "source": "hf", "path": "org/a"}, {"name": "b", "source": "hf", "path": "org/b"}],
            "wandb": {"mode": "disabled"},
        }
    )


def _toy_stage(reads: tuple[str, ...], read) -> Stage:
    def run(cfg, key):
        cfg.paths.root.mkdir(parents=True, exist_ok=True)
        (cfg.paths.root / "toy.txt").write_text(str(read(cfg)))
        return {"wrote": True}

    return Stage("toy", "a stage of the test's own", run, inputs=(), reads=reads, outputs=lambda c: [c.paths.root / "toy.txt"])


def test_a_stage_that_reads_a_section_it_does_not_declare_fails_and_records_nothing(tmp_path):
    cfg = _config(tmp_path)
    manifest = Manifest.read(cfg.out)
    honest = _toy_stage(("build",), lambda c: c.build.output_feature_weight)
    assert execute(honest, cfg, manifest) == {"wrote": True} and manifest.get("toy") is not None
    sneaky = _toy_stage(("build",), lambda c: c.features.q_threshold)
    with pytest.raises(UndeclaredRead, match="stage 'toy' read config section 'features', which it does not declare"):
        execute(sneaky, cfg, manifest)
    assert manifest.get("toy") is None and Manifest.read(cfg.out).get("toy") is None
    # Outside a stage, and for where and how it runs (its folders, torch's threads), nothing is refused.
    assert cfg.features.q_threshold == 0.05
    assert execute(_toy_stage(("build",), lambda c: (c.out, c.cache, c.threads)), cfg, manifest) == {"wrote": True}


def test_every_stage_declares_sections_of_the_schema_and_its_key_holds_them(tmp_path):
    cfg = _config(tmp_path)
    for stage in STAGES:
        assert set(stage.reads) <= SECTIONS, stage.name
        assert stage.readable - set(stage.reads) <= {"wandb"}, stage.name  # only where it logs stays out of its key
    # The score stage keys each model by its own key; every other stage by its sections' key fields.
    settings = {s.name: s.key_settings(cfg) for s in STAGES}
    for stage in STAGES:
        if stage.settings is None:
            assert set(stage.reads) <= set(settings[stage.name]), stage.name
    assert set(settings["score"]) == {"corpus", "seed", "models"}


def test_no_stage_package_imports_what_stands_above_it():
    """The stage table and the commands import the stages' code; the stages never import them back
    (a circle: the registry read the score stage's version, the score stage read the registry's)."""
    back = []
    for package in STAGE_PACKAGES:
        for path in sorted((REPO / "bbox_sae" / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [node.module]
                    if isinstance(node, ast.ImportFrom) and node.module
                    else [a.name for a in getattr(node, "names", [])]
                    if isinstance(node, ast.Import)
                    else []
                )
                back += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names if n and n.startswith(ABOVE_STAGES)]
    assert back == []


def test_the_commands_take_their_options_from_the_stages(capsys):
    from bbox_sae.cli import build_parser

    parser = build_parser()
    for stage in STAGES:
        for option in stage.options:
            args = parser.parse_args([stage.name, "-c", "x.yaml", option.flag] + ([] if option.argparse.get("action") == "store_true" else ["0/2"]))
            assert getattr(args, option.dest) not in (None, False), (stage.name, option.flag)
    merge = parser.parse_args(["merge", "-c", "x.yaml", "--stage", "embed"])
    assert merge.stage == ["embed"]
    with pytest.raises(SystemExit):
        parser.parse_args(["merge", "-c", "x.yaml", "--stage", "build"])  # not written by workers
    assert {s.name for s in STAGES if s.sharded} == {"score", "embed"}


def test_the_manifest_is_read_once_and_written_one_record_at_a_time(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    (root / "manifest.json").write_text(json.dumps({"stages": {"ingest": {"key": "k1", "digest": "d1"}, "score": {"key": 3}, "embed": "?"}}))
    manifest = Manifest.read(root)
    assert list(manifest.stages) == ["ingest"]  # malformed records are no records: those stages are redone
    # Another command (a shard worker) records a stage meanwhile: writing this one keeps it.
    other = Manifest.read(root)
    other.put("embed", StageRecord("k2", "d2"))
    manifest.put("build", StageRecord("k3", "d3"))
    assert set(Manifest.read(root).stages) == {"ingest", "embed", "build"}
    manifest.put("ingest", None)
    assert set(Manifest.read(root).stages) == {"embed", "build"} and "ingest" not in manifest.stages
    assert json.loads((root / "manifest.json").read_text())["stages"]["build"] == {
        "key": "k3",
        "digest": "d3",
        "outputs": {},
        "finished": "",
        "seconds": 0.0,
        "result": None,
    }
    assert Manifest.read(tmp_path / "nowhere").stages == {}


def test_the_key_of_the_report_holds_no_section_of_the_features_stage(tmp_path):
    """The report reads the features stage's decisions from its outputs (corpus_stats.json), so only
    their digest can make it stale; its key does not take features.* from the config of the day."""
    from helpers.stages import recorded

    cfg = _config(tmp_path)
    manifest = recorded(cfg.out, *(d.name for d in REPORT.ancestors()))
    stricter = cfg.model_copy(update={"features": cfg.features.model_copy(update={"q_threshold": 0.01})})
    assert "features" not in REPORT.reads
    assert stage_key(REPORT, cfg, manifest) == stage_key(REPORT, stricter, manifest)
    assert stage_key(BY_NAME["features"], cfg, manifest) != stage_key(BY_NAME["features"], stricter, manifest)


def test_bbox_report_is_not_up_to_date_after_a_new_q_threshold(tmp_path, capsys):
    """Even where the tables come out the same: the report says the threshold that decided them."""
    project = make_project(tmp_path, **SMALL_RUN)
    code, err = bbox(capsys, "run", "-c", str(project.config))
    assert code == 0, err
    assert "q < 0.05" in project.paths.report_md.read_text()
    code, err = bbox(capsys, "run", "-c", str(project.config), "--set", "features.q_threshold=0.049")
    assert code == 0, err
    assert "[6/8] features: done" in err and "[8/8] report: done" in err, err
    stats = json.loads(project.paths.corpus_stats.read_text())
    assert stats["features_settings"]["q_threshold"] == 0.049
    report = project.paths.report_md.read_text()
    assert "q < 0.049" in report and "q < 0.05 " not in report


def test_a_baseline_is_a_run_of_its_own(tmp_path, capsys):
    """`bbox features --baseline kmeans`: its tables in baselines/kmeans/, a run whose manifest records
    what it shares with the run (words, scores, matrix, SAE) and its own features; the run's own
    records and tables are left as they were."""
    project = make_project(tmp_path, **SMALL_RUN)
    assert bbox(capsys, "run", "-c", str(project.config))[0] == 0
    own = Manifest.read(project.out)
    findings = project.paths.findings.read_bytes()
    code, err = bbox(capsys, "features", "-c", str(project.config), "--baseline", "kmeans")
    assert code == 0, err
    variant = project.paths.baseline("kmeans")
    recorded = Manifest.read(variant.root)
    assert set(recorded.stages) == {"ingest", "score", "embed", "build", "train", "features"}
    assert {n: r.result for n, r in recorded.stages.items() if n != "features"} == {
        n: {"shared_from": str(project.out)} for n in ("ingest", "score", "embed", "build", "train")
    }
    assert recorded.get("features").result["source"] == "kmeans"
    assert Manifest.read(project.out) == own and project.paths.findings.read_bytes() == findings
    # Again: current, so nothing is redone.
    code, err = bbox(capsys, "features", "-c", str(project.config), "--baseline", "kmeans")
    assert code == 0 and Manifest.read(variant.root) == recorded, err


def test_stage_modules_hold_their_code_versions():
    """A stage's code version lives next to its code; the table only reads it."""
    from bbox_sae.features.grouping import FINDINGS_VERSION
    from bbox_sae.labeling.heuristic import OFFLINE_LABELER_VERSION
    from bbox_sae.scoring.precision import PRECISION_VERSION

    assert BY_NAME["features"].version() == {"findings": FINDINGS_VERSION}
    assert BY_NAME["label"].version() == {"offline_labeler": OFFLINE_LABELER_VERSION}
    assert PRECISION_VERSION >= 3


def test_a_variant_links_to_its_parent_even_in_a_copied_run(tmp_path):
    """A copied evaluation's null seeds linked to the original's scores: stale there, so they were
    scored again, into the original run's folder."""
    from bbox_sae.variants import _link

    original, copy = tmp_path / "original", tmp_path / "copy"
    for root in (original, copy):
        (root / "logprobs").mkdir(parents=True)
    target = tmp_path / "variant" / "logprobs"
    _link(original / "logprobs", target)
    _link(copy / "logprobs", target)
    assert target.resolve() == (copy / "logprobs").resolve()


def test_a_shard_worker_does_not_ingest_again_what_is_current(tmp_path, capsys):
    """Workers of a Slurm array start together: one that ingested again would pull documents.parquet
    from under the others (ingest withdraws it first)."""
    project = make_project(tmp_path, **SMALL_RUN)
    assert bbox(capsys, "run", "-c", str(project.config), "--until", "ingest")[0] == 0
    before = project.paths.documents.stat().st_mtime_ns
    for shard in ("0/2", "1/2"):
        code, err = bbox(capsys, "score", "-c", str(project.config), "--shard", shard)
        assert code == 0, err
    assert project.paths.documents.stat().st_mtime_ns == before
    assert bbox(capsys, "merge", "-c", str(project.config))[0] == 0
    assert Manifest.read(project.out).get("score").result == {"merged": True}
