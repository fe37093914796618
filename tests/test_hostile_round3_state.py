"""Issue 30 (hostile review, round 3), items 1-7 and 19: state that a command must not corrupt.

The evaluation must not write into a user's files or run; names and paths must be safe; resumed
training, dry runs and the report must never pass stale work off as current; the kill-and-rerun
test must compare what the stage registry says each stage writes; a config must say each key once.
Every case runs the real CLI (`bbox_sae.cli.main`) in this process on users' log-prob Parquet files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

from hardening import STAGES as CLI_STAGES
from hardening import stage_outputs
from test_cli import TEXTS, assert_one_line_error, bbox, write_corpus, write_logprobs

from bbox_sae.config import load_config
from bbox_sae.train.sae import RowBatches
from bbox_sae.stages import BY_NAME, STAGES

REPO = Path(__file__).resolve().parents[1]
SAE = {"architecture": "topk", "d_sae": 16, "k": 2, "batch_size": 8, "epochs": 10, "lr": 0.003, "checkpoint_every": 5}


def write_config(root: Path, tiny_encoder, corpus: Path | None = None, **overrides) -> Path:
    cfg = {
        "output_dir": str(root / "out"),
        "cache_dir": str(root / "cache"),
        "corpus": {"path": str(corpus or root / "c.jsonl"), "shard_docs": 2, "holdout_fraction": 0.3},
        "models": [{"name": m, "source": "parquet", "path": str(root / f"{m}.parquet")} for m in ("a", "b")],
        "embedding": {"model": str(tiny_encoder), "window": 16, "stride": 8},
        "sae": SAE,
        "features": {"top_n": 5, "bootstrap_samples": 20},
        "wandb": {"mode": "disabled"},
        **overrides,
    }
    (root / "cfg.yaml").write_text(yaml.safe_dump(cfg, allow_unicode=True))
    return root / "cfg.yaml"


@pytest.fixture()
def project(tmp_path, tiny_encoder):
    write_corpus(tmp_path / "c.jsonl", TEXTS)
    for m, offset in (("a", 0.0), ("b", 0.5)):
        write_logprobs(tmp_path / f"{m}.parquet", TEXTS, offset)
    write_config(tmp_path, tiny_encoder)
    return tmp_path


def digests(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(s == p or s in p.parents for s in skip)
    }


def run(capsys, root: Path, *extra: str) -> tuple[int, str]:
    return bbox(capsys, "run", "-c", str(root / "cfg.yaml"), *extra)


# ---------------------------------------------------------------- 1: eval planted writes only its own files

RULES = "noise_std: 0.1\nseed: 0\nrules:\n  - {name: the, kind: lexical form, word: '(?i)^the$', delta: -2.5}\n"


def test_eval_planted_refuses_an_output_dir_holding_a_bbox_run(project, capsys):
    """It used to rewrite the user's b.parquet with planted log-probs and the run's findings with the eval's."""
    (project / "rules.yaml").write_text(RULES)
    code, err = run(capsys, project)
    assert code == 0, err
    before = digests(project)
    code, err = bbox(capsys, "eval", "planted", "-c", str(project / "cfg.yaml"), "-o", str(project / "out"),
                     "--rules", str(project / "rules.yaml"), "--null-seeds", "0")
    assert_one_line_error(code, err, f"output_dir {project / 'out'}: holds a `bbox run`", "model 'b'", "output dir of its own (-o)")
    assert digests(project) == before  # b.parquet, the run's findings and its config.yaml alike


def test_eval_planted_writes_model_b_inside_its_own_output_dir(project, capsys):
    (project / "rules.yaml").write_text(RULES)
    evaluation = project / "eval"
    before = digests(project)
    args = ["eval", "planted", "-c", str(project / "cfg.yaml"), "-o", str(evaluation), "--rules", str(project / "rules.yaml")]
    code, err = bbox(capsys, *args, "--null-seeds", "1")
    assert code == 0, err
    assert digests(project, skip=(evaluation,)) == before  # the user's corpus and both models' files untouched
    planted = evaluation / "planted-B.parquet"
    assert planted.is_file() and (evaluation / "null-seed0" / "null-B.parquet").is_file()
    assert load_config(evaluation / "config.yaml").model("b").path == str(planted)  # the saved config says what was evaluated
    assert json.loads((evaluation / "planted_results.json").read_text())["rules"]["the"]["occurrences"] > 0
    # Its own output dir (no `bbox run` there) is taken again.
    code, err = bbox(capsys, *args, "--null-seeds", "0")
    assert code == 0, err
    assert digests(project, skip=(evaluation,)) == before


# ---------------------------------------------------------------- 2: names are safe path components


@pytest.mark.parametrize(("key", "name"), [("models.1.name", ".."), ("models.1.name", "."), ("sae.run_name", ".."), ("sae.run_name", "../x")])
def test_names_that_are_not_a_folder_of_their_own_are_refused(project, capsys, key, name):
    """A model named '..' wrote its shards into the output root; removing 'its' folder removed the run."""
    code, err = run(capsys, project, "--set", f"{key}={name}")
    assert_one_line_error(code, err, f"'{key}'", f"{name!r} is not usable as a folder name")
    assert not (project / "out").exists()


# ---------------------------------------------------------------- 3: empty paths, output dir inside the corpus folder


def test_empty_output_dir_or_corpus_path_is_refused(project, capsys, monkeypatch):
    """`-o "$UNSET"` ran in the working directory and overwrote the config.yaml there."""
    work = project / "cwd"
    work.mkdir()
    (work / "config.yaml").write_text("mine: 1\n")
    monkeypatch.chdir(work)
    for extra, needles in [
        (["-o", ""], ["--output-dir: is empty"]),
        (["--set", "output_dir="], ["'output_dir'", "is empty"]),
        (["--set", "corpus.path="], ["'corpus.path'", "is empty"]),
        (["--set", "cache_dir="], ["'cache_dir'", "is empty"]),
    ]:
        assert_one_line_error(*run(capsys, project, *extra), *needles)
    assert sorted(p.name for p in work.iterdir()) == ["config.yaml"] and (work / "config.yaml").read_text() == "mine: 1\n"
    assert not (project / "out").exists()


def test_output_and_cache_dirs_inside_the_corpus_folder_are_not_read_as_corpus(project, capsys, tiny_encoder):
    """The second unchanged run used to fail on `cf/run/build/matrix.npy: unsupported corpus file`."""
    folder = project / "cf"
    folder.mkdir()
    write_corpus(folder / "c.jsonl", TEXTS)
    # What a model cache holds (a converted model's config.json reads as a JSON object without an id).
    (folder / "cache" / "models" / "m").mkdir(parents=True)
    (folder / "cache" / "models" / "m" / "config.json").write_text('{"vocab_size": 3}\n')
    write_config(project, tiny_encoder, corpus=folder, output_dir=str(folder / "run"), cache_dir=str(folder / "cache"))
    for _ in range(2):
        code, err = run(capsys, project, "--until", "build")
        assert code == 0, err
    assert "[1/4] ingest: up to date" in err and "[4/4] build: up to date" in err
    documents = json.loads((folder / "run" / "ingest.json").read_text())["documents"]
    assert documents == len(TEXTS)
    # The corpus folder as the output dir: refused, not ingested with the run's own files.
    write_config(project, tiny_encoder, corpus=folder, output_dir=str(folder))
    assert_one_line_error(*run(capsys, project, "--until", "build"), f"{folder}: the corpus folder is also where bbox writes")


# ---------------------------------------------------------------- 4: resume only under the same key


def interrupt_training(monkeypatch, at_batch: int) -> None:
    """The `at_batch`-th batch raises KeyboardInterrupt, as a kill mid-training would stop it."""
    original, calls = RowBatches.__next__, {"n": 0}

    def dying(self):
        calls["n"] += 1
        if calls["n"] == at_batch:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(RowBatches, "__next__", dying)


def sae_files(out: Path) -> tuple[dict, bytes]:
    run_dir = out / "sae" / "topk-d16-k2"
    return json.loads((run_dir / "metrics.json").read_text()), (run_dir / "sae_weights.safetensors").read_bytes()


def test_train_resume_ignores_checkpoints_of_other_settings(project, capsys, monkeypatch):
    cfg = str(project / "cfg.yaml")
    assert run(capsys, project, "--until", "build")[0] == 0
    changed = ["--set", "sae.lr=0.01", "--set", "sae.seed=5"]

    with monkeypatch.context() as mp:
        interrupt_training(mp, 23)  # after the step-5 ... step-20 checkpoints
        assert bbox(capsys, "train", "-c", cfg)[0] == 130
    code, err = bbox(capsys, "train", "-c", cfg, "--resume", *changed)
    assert code == 0, err
    metrics, weights = sae_files(project / "out")
    assert metrics["resumed_from_step"] is None, "resumed a checkpoint trained with other settings"
    code, err = run(capsys, project, "--until", "train", *changed)
    assert code == 0 and "[5/5] train: up to date" in err, err
    # ... and what is up to date is what those settings train from scratch.
    code, err = run(capsys, project, "--until", "train", *changed, "-o", str(project / "fresh"))
    assert code == 0, err
    assert sae_files(project / "fresh")[1] == weights

    # With the same settings, --resume does resume.
    with monkeypatch.context() as mp:
        interrupt_training(mp, 23)
        assert bbox(capsys, "train", "-c", cfg, *changed)[0] == 130
    assert bbox(capsys, "train", "-c", cfg, "--resume", *changed)[0] == 0
    assert sae_files(project / "out")[0]["resumed_from_step"] == 20


def test_train_script_resumes_only_under_the_same_key(project, capsys, monkeypatch):
    """train/train_sae.py (the GPU-box entry point) takes the same care as `bbox train --resume`."""
    spec = importlib.util.spec_from_file_location("train_sae_script", REPO / "train" / "train_sae.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    cfg = str(project / "cfg.yaml")
    for changed, resumed in ((["--set", "sae.lr=0.01"], None), ([], 20)):
        with monkeypatch.context() as mp:
            interrupt_training(mp, 23)
            assert run(capsys, project)[0] == 130  # `bbox run` killed mid-training
        assert script.main(["--config", cfg, "--resume", *changed]) == 0
        assert sae_files(project / "out")[0]["resumed_from_step"] == resumed


# ---------------------------------------------------------------- 5: a dry run labels nothing


def test_label_dry_run_is_not_recorded_as_labeling(project, capsys):
    code, err = run(capsys, project)
    assert code == 0, err
    stats = project / "out" / "labels" / "labels.json"
    assert json.loads(stats.read_text())["labeler"] == "heuristic"
    llm = ["--set", "label.labeler=llm", "--set", "label.base_url=http://127.0.0.1:9/v1", "--set", "label.model=m"]
    code, err = run(capsys, project, *llm, "--set", "label.dry_run=true")
    assert code == 0, err
    assert "[7/8] label: dry run, nothing written" in err and "[8/8]" not in err
    assert json.loads(stats.read_text())["labeler"] == "heuristic"
    code, err = run(capsys, project, *llm)
    assert code == 0, err
    assert "[7/8] label: done" in err, "the dry run was taken for the labeling it never did"
    assert json.loads(stats.read_text())["labeler"] == "llm"


# ---------------------------------------------------------------- 6: the report's key covers what it reads


def stage_reads(monkeypatch, out: Path) -> dict[str, set[Path]]:
    """Files under `out` each stage of `bbox run` opens: Python's opens (audit hook) and Parquet tables
    (all read through `artifacts.resolve_files`)."""
    from bbox_sae import artifacts, pipeline, stages

    reads: dict[str, set[Path]] = {}
    current: list[str] = []

    def note(path) -> None:
        p = Path(str(path)).absolute()
        if current and out in p.parents:
            reads.setdefault(current[-1], set()).add(p)

    def hook(event, args) -> None:
        if event == "open" and current and isinstance(args[0], (str, Path)):
            note(args[0])

    sys.addaudithook(hook)  # audit hooks cannot be removed: this one records only while `current` is set

    original_resolve, original_execute = artifacts.resolve_files, stages.execute

    def resolve_files(path, verify=True):
        files = original_resolve(path, verify)
        for f in files:
            note(f)
        return files

    def execute(stage, cfg, **options):
        current.append(stage.name)
        try:
            return original_execute(stage, cfg, **options)
        finally:
            current.pop()

    monkeypatch.setattr(artifacts, "resolve_files", resolve_files)
    monkeypatch.setattr(pipeline, "execute", execute)
    return reads


def owner(cfg, path: Path) -> str | None:
    """The stage whose outputs hold `path` (a declared output, inside one, or beside one in its own
    folder, such as the SAE's metrics.json); None for the run's bookkeeping (config, manifest)."""
    for stage in STAGES:
        for out in stage.outputs(cfg):
            if path == out or out in path.parents or (path.parent == out.parent and out.parent != cfg.out):
                return stage.name
    return None


def test_every_stage_reads_only_outputs_of_the_stages_its_key_covers(project, capsys, monkeypatch):
    """A stage's key holds its settings and its inputs' digests only: a file it reads from a stage
    not among its inputs can change without the stage being redone (the report kept old CIs)."""
    reads = stage_reads(monkeypatch, (project / "out").absolute())
    code, err = run(capsys, project)
    assert code == 0, err
    cfg = load_config(project / "out" / "config.yaml")
    cfg = cfg.model_copy(update={"output_dir": str(cfg.out.absolute())})
    assert set(reads) >= {"build", "features", "label", "report"}
    undeclared = {}
    for name, paths in reads.items():
        allowed = {name, *BY_NAME[name].inputs}
        wrong = sorted(str(p.relative_to(cfg.out)) for p in paths if owner(cfg, p) not in allowed | {None})
        if wrong:
            undeclared[name] = wrong
    assert undeclared == {}


def test_report_is_redone_when_a_documents_domain_changes(project, capsys):
    """Features and labels were redone, the labels came out the same, and the report (keyed on the
    labels' digest alone) kept the old domains."""
    code, err = run(capsys, project)
    assert code == 0, err
    assert "poetry" not in (project / "out" / "report.md").read_text()
    texts = {d: {"id": d, "text": t, "domain": "poetry" if d == "d2" else "prose"} for d, t in TEXTS.items()}
    (project / "c.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in texts.values()))
    code, err = run(capsys, project)
    assert code == 0, err
    assert "[8/8] report: done" in err, err
    assert "poetry" in (project / "out" / "report.md").read_text()


# ---------------------------------------------------------------- 7: the kill-and-rerun table is the registry


def test_kill_and_rerun_compares_every_output_the_registry_declares(project, capsys):
    assert run(capsys, project, "--until", "ingest")[0] == 0  # saves out/config.yaml
    out = project / "out"
    cfg = load_config(out / "config.yaml")
    for stage in CLI_STAGES:
        names = ["ingest", stage] if stage == "score" else [stage]
        assert stage_outputs(stage, out) == [str(p.relative_to(cfg.out)) for n in names for p in BY_NAME[n].outputs(cfg)]
    assert {"findings.parquet", "rules.parquet"} <= set(stage_outputs("features", out))


# ---------------------------------------------------------------- 19: a key said twice


def test_duplicate_config_key_is_refused_naming_both_lines(project, capsys):
    """PyYAML keeps the last of two equal keys: `d_sae: 16` then `d_sae: 32` trained 32, silently."""
    path = project / "cfg.yaml"
    lines = path.read_text().splitlines()
    at = lines.index("  d_sae: 16")
    path.write_text("\n".join([*lines[: at + 1], "  d_sae: 32", *lines[at + 1 :]]) + "\n")
    assert_one_line_error(*run(capsys, project), f"{path}:{at + 2}: invalid YAML: duplicate key 'd_sae' (first at line {at + 1})")
    path.write_text("\n".join([*lines, "seed: 1", "seed: 2"]) + "\n")
    assert_one_line_error(*run(capsys, project), f"{path}:{len(lines) + 2}: invalid YAML: duplicate key 'seed' (first at line {len(lines) + 1})")
    path.write_text("\n".join(lines) + "\n")
    assert_one_line_error(*run(capsys, project, "--set", "sae={k: 1, k: 2}"), "'sae'", "duplicate key 'k'")
    assert not (project / "out").exists()
