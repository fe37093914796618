"""Issue 30 (hostile review, round 3), items 1-7 and 19: state that a command must not corrupt.

The evaluation must not write into a user's files or run; names and paths must be safe; resumed
training, dry runs and the report must never pass stale work off as current; the kill-and-rerun
test must compare what the stage registry says each stage writes; a config must say each key once.
Every case runs the real CLI (`bbox_sae.cli.main`) in this process on users' log-prob Parquet files.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from bbox_sae.config import load_config
from bbox_sae.layout import RunLayout
from bbox_sae.stages import BY_NAME, STAGES
from helpers.cli import assert_one_line_error, bbox
from helpers.hardening import STAGES as CLI_STAGES
from helpers.hardening import interrupt_training, stage_outputs
from helpers.planted import THE_RULES_YAML
from helpers.project import SMALL_RUN, TEXTS, Project, make_project, write_corpus
from helpers.repo import load_script


@pytest.fixture()
def project(tmp_path) -> Project:
    return make_project(tmp_path, **SMALL_RUN)


def digests(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(s == p or s in p.parents for s in skip)
    }


def run(capsys, project: Project, *extra: str) -> tuple[int, str]:
    return bbox(capsys, "run", "-c", str(project.config), *extra)


# ---------------------------------------------------------------- 1: eval planted writes only its own files


def test_eval_planted_refuses_an_output_dir_holding_a_bbox_run(project, capsys):
    """It used to rewrite the user's b.parquet with planted log-probs and the run's findings with the eval's."""
    (project.root / "rules.yaml").write_text(THE_RULES_YAML)
    code, err = run(capsys, project)
    assert code == 0, err
    before = digests(project.root)
    code, err = bbox(
        capsys, "eval", "planted", "-c", str(project.config), "-o", str(project.out), "--rules", str(project.root / "rules.yaml"), "--null-seeds", "0"
    )
    assert_one_line_error(code, err, f"output_dir {project.out}: holds a `bbox run`", "model 'b'", "output dir of its own (-o)")
    assert digests(project.root) == before  # b.parquet, the run's findings and its config.yaml alike


def test_eval_planted_writes_model_b_inside_its_own_output_dir(project, capsys):
    (project.root / "rules.yaml").write_text(THE_RULES_YAML)
    evaluation = RunLayout(project.root / "eval")
    before = digests(project.root)
    args = ["eval", "planted", "-c", str(project.config), "-o", str(evaluation.root), "--rules", str(project.root / "rules.yaml")]
    code, err = bbox(capsys, *args, "--null-seeds", "1")
    assert code == 0, err
    assert digests(project.root, skip=(evaluation.root,)) == before  # the user's corpus and both models' files untouched
    planted = evaluation.planted_logprobs
    assert planted.is_file() and evaluation.null_logprobs(0).is_file()
    assert load_config(evaluation.config).model("b").path == str(planted)  # the saved config says what was evaluated
    assert json.loads(evaluation.planted_results.read_text())["rules"]["the"]["occurrences"] > 0
    # Its own output dir (no `bbox run` there) is taken again.
    code, err = bbox(capsys, *args, "--null-seeds", "0")
    assert code == 0, err
    assert digests(project.root, skip=(evaluation.root,)) == before


# ---------------------------------------------------------------- 2: names are safe path components


@pytest.mark.parametrize(("key", "name"), [("models.1.name", ".."), ("models.1.name", "."), ("sae.run_name", ".."), ("sae.run_name", "../x")])
def test_names_that_are_not_a_folder_of_their_own_are_refused(project, capsys, key, name):
    """A model named '..' wrote its shards into the output root; removing 'its' folder removed the run."""
    code, err = run(capsys, project, "--set", f"{key}={name}")
    assert_one_line_error(code, err, f"'{key}'", f"{name!r} is not usable as a folder name")
    assert not project.out.exists()


# ---------------------------------------------------------------- 3: empty paths, output dir inside the corpus folder


def test_empty_output_dir_or_corpus_path_is_refused(project, capsys, monkeypatch):
    """`-o "$UNSET"` ran in the working directory and overwrote the config.yaml there."""
    work = RunLayout(project.root / "cwd")  # a folder holding a file named as a run's config
    work.root.mkdir()
    work.config.write_text("mine: 1\n")
    monkeypatch.chdir(work.root)
    for extra, needles in [
        (["-o", ""], ["--output-dir: is empty"]),
        (["--set", "output_dir="], ["'output_dir'", "is empty"]),
        (["--set", "corpus.path="], ["'corpus.path'", "is empty"]),
        (["--set", "cache_dir="], ["'cache_dir'", "is empty"]),
    ]:
        assert_one_line_error(*run(capsys, project, *extra), *needles)
    assert list(work.root.iterdir()) == [work.config] and work.config.read_text() == "mine: 1\n"
    assert not project.out.exists()


def test_output_and_cache_dirs_inside_the_corpus_folder_are_not_read_as_corpus(project, capsys):
    """The second unchanged run used to fail on `cf/run/build/matrix.npy: unsupported corpus file`."""
    folder = project.root / "cf"
    folder.mkdir()
    write_corpus(folder / "c.jsonl", TEXTS)
    # What a model cache holds (a converted model's config.json reads as a JSON object without an id).
    (folder / "cache" / "models" / "m").mkdir(parents=True)
    (folder / "cache" / "models" / "m" / "config.json").write_text('{"vocab_size": 3}\n')
    inside = make_project(project.root, docs=None, corpus={"path": str(folder)}, output_dir=str(folder / "run"), cache_dir=str(folder / "cache"), **SMALL_RUN)
    for _ in range(2):
        code, err = run(capsys, project, "--until", "build")
        assert code == 0, err
    assert "[1/4] ingest: up to date" in err and "[4/4] build: up to date" in err
    documents = json.loads(inside.paths.ingest_marker.read_text())["documents"]
    assert documents == len(TEXTS)
    # The corpus folder as the output dir: refused, not ingested with the run's own files.
    make_project(project.root, docs=None, corpus={"path": str(folder)}, output_dir=str(folder), **SMALL_RUN)
    assert_one_line_error(*run(capsys, project, "--until", "build"), f"{folder}: the corpus folder is also where bbox writes")


# ---------------------------------------------------------------- 4: resume only under the same key


def sae_files(project: Project, out: Path | None = None) -> tuple[dict, bytes]:
    """The trained SAE's metrics and weights in the project's run (or the run in `out`)."""
    sae_run = project.load(output_dir=out).sae_paths
    return json.loads(sae_run.metrics.read_text()), sae_run.weights.read_bytes()


def test_train_resume_ignores_checkpoints_of_other_settings(project, capsys, monkeypatch):
    cfg = str(project.config)
    assert run(capsys, project, "--until", "build")[0] == 0
    changed = ["--set", "sae.lr=0.01", "--set", "sae.seed=5"]

    with monkeypatch.context() as mp:
        interrupt_training(mp, 23)  # after the step-5 ... step-20 checkpoints
        assert bbox(capsys, "train", "-c", cfg)[0] == 130
    code, err = bbox(capsys, "train", "-c", cfg, "--resume", *changed)
    assert code == 0, err
    metrics, weights = sae_files(project)
    assert metrics["resumed_from_step"] is None, "resumed a checkpoint trained with other settings"
    code, err = run(capsys, project, "--until", "train", *changed)
    assert code == 0 and "[5/5] train: up to date" in err, err
    # ... and what is up to date is what those settings train from scratch.
    code, err = run(capsys, project, "--until", "train", *changed, "-o", str(project.root / "fresh"))
    assert code == 0, err
    assert sae_files(project, project.root / "fresh")[1] == weights

    # With the same settings, --resume does resume.
    with monkeypatch.context() as mp:
        interrupt_training(mp, 23)
        assert bbox(capsys, "train", "-c", cfg, *changed)[0] == 130
    assert bbox(capsys, "train", "-c", cfg, "--resume", *changed)[0] == 0
    assert sae_files(project)[0]["resumed_from_step"] == 20


def test_train_script_resumes_only_under_the_same_key(project, capsys, monkeypatch):
    """train/train_sae.py (the GPU-box entry point) takes the same care as `bbox train --resume`."""
    script = load_script("train/train_sae.py")
    cfg = str(project.config)
    for changed, resumed in ((["--set", "sae.lr=0.01"], None), ([], 20)):
        with monkeypatch.context() as mp:
            interrupt_training(mp, 23)
            assert run(capsys, project)[0] == 130  # `bbox run` killed mid-training
        assert script.main(["--config", cfg, "--resume", *changed]) == 0
        assert sae_files(project)[0]["resumed_from_step"] == resumed


# ---------------------------------------------------------------- 5: a dry run labels nothing


def test_label_dry_run_is_not_recorded_as_labeling(project, capsys):
    code, err = run(capsys, project)
    assert code == 0, err
    stats = project.paths.label_stats
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
    from bbox_sae import artifacts, pipeline

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

    original_resolve, original_execute = artifacts.resolve_files, pipeline.execute

    def resolve_files(path, verify=True):
        files = original_resolve(path, verify)
        for f in files:
            note(f)
        return files

    def execute(stage, cfg, manifest, **options):
        current.append(stage.name)
        try:
            return original_execute(stage, cfg, manifest, **options)
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
    reads = stage_reads(monkeypatch, project.out.absolute())
    code, err = run(capsys, project)
    assert code == 0, err
    cfg = load_config(project.paths.config)
    cfg = cfg.model_copy(update={"output_dir": str(cfg.out.absolute())})
    assert set(reads) >= {"build", "features", "label", "report"}
    undeclared = {}
    for name, paths in reads.items():
        allowed = {name, *(d.name for d in BY_NAME[name].inputs)}
        wrong = sorted(str(p.relative_to(cfg.out)) for p in paths if owner(cfg, p) not in allowed | {None})
        if wrong:
            undeclared[name] = wrong
    assert undeclared == {}


def test_report_is_redone_when_a_documents_domain_changes(project, capsys):
    """Features and labels were redone, the labels came out the same, and the report (keyed on the
    labels' digest alone) kept the old domains."""
    code, err = run(capsys, project)
    assert code == 0, err
    assert "poetry" not in project.paths.report_md.read_text()
    write_corpus(project.corpus, [{"id": d, "text": t, "domain": "poetry" if d == "d2" else "prose"} for d, t in TEXTS.items()])
    code, err = run(capsys, project)
    assert code == 0, err
    assert "[8/8] report: done" in err, err
    assert "poetry" in project.paths.report_md.read_text()


# ---------------------------------------------------------------- 7: the kill-and-rerun table is the registry


def test_kill_and_rerun_compares_every_output_the_registry_declares(project, capsys):
    assert run(capsys, project, "--until", "ingest")[0] == 0  # saves out/config.yaml
    cfg = load_config(project.paths.config)
    for stage in CLI_STAGES:
        names = ["ingest", stage] if stage == "score" else [stage]
        assert stage_outputs(stage, project.out) == [str(p.relative_to(cfg.out)) for n in names for p in BY_NAME[n].outputs(cfg)]
    findings_and_rules = {str(p.relative_to(cfg.out)) for p in (cfg.paths.findings, cfg.paths.rules)}
    assert findings_and_rules <= set(stage_outputs("features", project.out))


# ---------------------------------------------------------------- 19: a key said twice


def test_duplicate_config_key_is_refused_naming_both_lines(project, capsys):
    """PyYAML keeps the last of two equal keys: `d_sae: 16` then `d_sae: 32` trained 32, silently."""
    path = project.config
    lines = path.read_text().splitlines()
    at = lines.index("  d_sae: 16")
    path.write_text("\n".join([*lines[: at + 1], "  d_sae: 32", *lines[at + 1 :]]) + "\n")
    assert_one_line_error(*run(capsys, project), f"{path}:{at + 2}: invalid YAML: duplicate key 'd_sae' (first at line {at + 1})")
    path.write_text("\n".join([*lines, "seed: 1", "seed: 2"]) + "\n")
    assert_one_line_error(*run(capsys, project), f"{path}:{len(lines) + 2}: invalid YAML: duplicate key 'seed' (first at line {len(lines) + 1})")
    path.write_text("\n".join(lines) + "\n")
    assert_one_line_error(*run(capsys, project, "--set", "sae={k: 1, k: 2}"), "'sae'", "duplicate key 'k'")
    assert not project.out.exists()
