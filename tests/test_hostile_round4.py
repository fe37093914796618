"""Issue 41 (hostile review, round 4): the LLM endpoint, refusals with side effects, markup and
terminal injection, and numbers no machine holds. Each case asserts what the user sees (exit code,
one line naming the file or field) and what is kept on disk (inputs hashed before and after)."""

from __future__ import annotations

import email.utils
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_labeling import NEGATIVES, is_detection, labels, llm_cfg, simple_latent, smart, write_fixture
from test_labeling_llm import is_label

from bbox_sae.cli import main
from bbox_sae.config import load_config
from bbox_sae.config.output_dir import SAVED_HEADER
from bbox_sae.errors import EndpointError
from bbox_sae.labeling import finding_statements, run_label
from bbox_sae.labeling.client import estimate_tokens
from bbox_sae.labeling.messages import MAX_LABEL_CHARS
from bbox_sae.layout import RunLayout
from bbox_sae.retry import backoff_delay, retry_after_seconds
from helpers.cli import assert_one_line_error, bbox
from helpers.fake_openai import FakeOpenAI, Reply, json_reply, user_text
from helpers.project import SMALL_FEATURES_RUN, SMALL_RUN, Project, copy_of, make_project, run_through_features

SMALL = SMALL_FEATURES_RUN
# ANSI colour, an OSC-8 hyperlink to another host, a cursor move, a bidirectional override.
ESCAPES = "\x1b[31mred\x1b[0m \x1b]8;;http://evil.example/\x07click\x1b]8;;\x07 \x1b[2J\u202egnp.exe"


@pytest.fixture()
def project(tmp_path) -> Project:
    return make_project(tmp_path, **SMALL_RUN)


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- 1: a run never writes over its own input


@pytest.mark.parametrize("command", [["run"], ["ingest"], ["report"], ["eval", "coherence"]])
def test_an_output_dir_holding_the_users_own_config_yaml_is_refused(tmp_path, capsys, command):
    """`bbox run -c config.yaml -o .` in a project folder overwrote that very config.yaml."""
    project = make_project(tmp_path, config_name="config.yaml", **SMALL_RUN)
    before = digests(project.root)
    code, err = bbox(capsys, *command, "-c", str(project.config), "-o", str(project.root))
    assert_one_line_error(code, err, f"output_dir {project.root}: holds config.yaml, which bbox did not write", "choose another output dir (-o)")
    assert digests(project.root) == before and sorted(p.name for p in project.root.iterdir()) == sorted(before)


def test_the_runs_own_config_yaml_is_rewritten_and_says_who_wrote_it(project, capsys):
    code, err = bbox(capsys, "run", "-c", str(project.config), "--until", "ingest")
    assert code == 0, err
    saved = project.paths.config
    assert saved.read_text().startswith(SAVED_HEADER)
    code, err = bbox(capsys, "run", "-c", str(project.config), "--until", "ingest", "--set", "seed=3")
    assert code == 0, err
    assert "\nseed: 3\n" in saved.read_text()
    # A run's config.yaml saved before the header existed (the config's canonical dump) is the tool's too.
    saved.write_text(saved.read_text().removeprefix(SAVED_HEADER))
    code, err = bbox(capsys, "run", "-c", str(project.config), "--until", "ingest")
    assert code == 0, err
    assert saved.read_text().startswith(SAVED_HEADER)
    # Edited by hand, it is no longer the tool's record: refused, and left as it is.
    saved.write_text(saved.read_text().removeprefix(SAVED_HEADER).replace("seed: 0", "seed: 0 # mine"))
    kept = saved.read_bytes()
    assert_one_line_error(*bbox(capsys, "run", "-c", str(project.config), "--until", "ingest"), "which bbox did not write")
    assert saved.read_bytes() == kept


def test_a_dangling_or_looping_symlink_as_output_dir_is_named_as_such(tmp_path, capsys):
    """Item 18: it said only `File exists`."""
    project = make_project(tmp_path, **SMALL_RUN)
    dangling, loop = tmp_path / "dangling", tmp_path / "loop"
    dangling.symlink_to(tmp_path / "nowhere")
    loop.symlink_to(loop)
    for out in (dangling, loop):
        code, err = bbox(capsys, "run", "-c", str(project.config), "-o", str(out))
        assert_one_line_error(code, err, f"output_dir {out}: is a symlink to", "which does not resolve (dangling, or a loop)")
    assert not (tmp_path / "nowhere").exists() and not project.out.exists()


@pytest.fixture(scope="module")
def through_features(tmp_path_factory) -> Project:
    """One run up to `features`, copied by each test that needs it (`copy_of`)."""
    return run_through_features(tmp_path_factory.mktemp("through-features"))


# ---------------------------------------------------------------- 3: nothing echoed holds terminal escapes


def test_the_final_summary_prints_labels_without_terminal_escapes(through_features, tmp_path, capsys, monkeypatch):
    """`bbox run`'s summary printed an LLM label's ANSI colours and OSC-8 link to the terminal."""
    out = copy_of(through_features, tmp_path)
    finding = {"finding": 0, "better_model": f"a{ESCAPES}", "latents": "1,2", "kind": "latent", "statement": f"{ESCAPES} [bold]x[/bold]"}
    finding |= {"top_words": f"{ESCAPES} w", "holdout_median_dlogp": 1.0, "holdout_ci_low": 0.5, "holdout_ci_high": 1.5, "holdout_n": 7}
    assert bbox(capsys, "run", "-c", str(through_features.config), "-o", str(out.root))[0] == 0
    # Every stage is up to date now: the next run only prints the summary, of these findings.
    monkeypatch.setattr(finding_statements, "labeled_findings", lambda paths: [finding])
    code, err = bbox(capsys, "run", "-c", str(through_features.config), "-o", str(out.root))
    assert code == 0, err
    summary = " ".join(err.split("1 finding(s), carried by 2 latent(s).", 1)[1].split())  # as if not wrapped
    assert (
        summary.count("\\x1b[31mred\\x1b[0m") == 3 and summary.count("\\x1b]8;;http://evil.example/\\x07click") == 3
    )  # model, statement, words (in full: no line is cut)
    assert "\\u202egnp.exe" in summary and not set(err) & {"\x1b", "\x07", "\u202e"}
    assert "latent group: \\x1b[31mred" in summary and "[bold]x[/bold]" in summary  # shown as text, not read as console markup


def test_errors_quoting_user_text_hold_no_terminal_escapes(tmp_path, capsys):
    missing = tmp_path / f"corpus{ESCAPES}.jsonl"
    project = make_project(tmp_path, docs=None, corpus={"path": str(missing)}, **SMALL_RUN)
    for args in (["--set", "seed=0"], ["--set", f"corpus.path={missing}"]):  # from the config file, from --set
        code, err = bbox(capsys, "run", "-c", str(project.config), *args)
        assert code == 2 and "\\x1b[31mred\\x1b[0m" in err and not set(err) & {"\x1b", "\x07", "\u202e"}, err
        assert err.strip().splitlines()[-1].startswith("bbox: error: ")
    # A usage error quotes argv: argparse writes an unrecognized argument as it is.
    with pytest.raises(SystemExit) as exit_:
        main(["run", "-c", str(project.config), ESCAPES])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "unrecognized arguments: \\x1b[31mred" in err and not set(err) & {"\x1b", "\x07", "\u202e"}, err


@pytest.fixture()
def fixture_negatives(monkeypatch):
    """As in test_labeling (not autouse here: the CLI tests above run the real label stage)."""
    import bbox_sae.labeling.stage as stage

    monkeypatch.setattr(stage, "draw_negatives", lambda src, forms, contrast=0, members_of=None: pq.read_table(src.cfg.out / NEGATIVES))


# ---------------------------------------------------------------- 4: Retry-After is capped, and the wait named


def test_retry_after_values_no_machine_should_wait_are_capped():
    assert retry_after_seconds({"retry-after": "inf"}) == float("inf") and retry_after_seconds({"retry-after": "nan"}) is None
    for asked in (86400.0, float("inf"), retry_after_seconds({"retry-after": "1e400"})):
        assert backoff_delay(0, 1.0, 60.0, 0.0, asked) == 60.0  # not a day, nor for ever
    assert backoff_delay(0, 1.0, 60.0, 0.0, 5.0) == 5.0  # one the cap allows is waited out
    assert backoff_delay(0, 1.0, 60.0, 0.0, None) == 0.5


@pytest.mark.usefixtures("fixture_negatives")
@pytest.mark.parametrize("retry_after", ["86400", "inf", "http-date"])
def test_a_429_asking_for_a_day_waits_at_most_backoff_max_s_and_says_so(tmp_path, caplog, retry_after):
    """`Retry-After: 86400` slept a day per retry, silently; `inf` slept for ever."""
    if retry_after == "http-date":
        retry_after = email.utils.formatdate(time.time() + 86400, usegmt=True)
    write_fixture(tmp_path, [simple_latent(1)])

    def rate_limited_once(body, index):
        return Reply(status=429, headers={"Retry-After": retry_after}) if index == 0 else smart(body, index)

    start = time.monotonic()
    with FakeOpenAI(rate_limited_once) as server, caplog.at_level(logging.INFO):
        result = run_label(llm_cfg(tmp_path, server, max_retries=1, backoff_base_s=0.01, backoff_max_s=0.3))
    assert time.monotonic() - start < 20
    assert result["retries"] == 1 and labels(tmp_path)[1]["label_source"] == "llm:judge"  # the retry got the label
    (said,) = [r for r in caplog.records if "waiting" in r.getMessage()]
    assert said.levelno == logging.WARNING
    assert re.fullmatch(
        rf"{re.escape(server.base_url)}: label request: HTTP 429: scripted 429; waiting 0\.3 s before attempt 2 of 2 "
        r"\(the server's Retry-After asked for (86400|inf|8639\d(\.\d+)?) s; label\.backoff_max_s=0\.3 caps it\)",
        said.getMessage(),
    ), said.getMessage()


# ---------------------------------------------------------------- 5: label.timeout_s bounds the whole request


@pytest.mark.usefixtures("fixture_negatives")
def test_a_reply_that_drips_forever_is_cut_at_timeout_s(tmp_path):
    """Headers, then a byte every 0.2 s: each read is quick, so the client's read timeout never fired."""
    write_fixture(tmp_path, [simple_latent(1), simple_latent(2)])
    start = time.monotonic()
    with FakeOpenAI(lambda body, index: Reply(content="{}", drip_s=0.2)) as server:
        with pytest.raises(EndpointError, match=r"every label request failed \(2 of 2.*timed out: no answer within 1 s"):
            run_label(llm_cfg(tmp_path, server, timeout_s=1, max_retries=1, backoff_base_s=0.01, backoff_max_s=0.01))
    assert time.monotonic() - start < 15  # 2 latents x 2 attempts of 1 s, at concurrency 4; the reply alone takes > 40 s
    assert len(server.requests) == 4
    assert all(r["label_source"] == "heuristic" and "timed out: no answer within 1 s" in r["label_reason"] for r in labels(tmp_path).values())


# ---------------------------------------------------------------- 6: a label's length is bounded


@pytest.mark.usefixtures("fixture_negatives")
def test_a_megabyte_label_is_cut_and_says_so(tmp_path, caplog):
    """A 30 MB description was taken as a label: a 54 MB report.html, minutes to print the summary."""
    write_fixture(tmp_path, [simple_latent(1), simple_latent(2)])
    huge = "words tagged ctx1 " * 60_000  # ~1 MB

    def verbose(body, index):
        return json_reply({"coherent": True, "description": huge}) if is_label(body) and "ctx1" in user_text(body) else smart(body, index)

    with FakeOpenAI(verbose) as server, caplog.at_level(logging.WARNING):
        result = run_label(llm_cfg(tmp_path, server))
    rows = labels(tmp_path)
    n = len(" ".join(huge.split()))
    assert len(rows[1]["label"]) == MAX_LABEL_CHARS and rows[1]["label"].endswith("…") and rows[1]["label"].startswith("words tagged ctx1 words")
    assert rows[1]["label_source"] == "llm:judge" and rows[1]["label_reason"] == f"llm:judge's label was {n:,} characters, cut to {MAX_LABEL_CHARS}"
    assert rows[2]["label"] == "words tagged ctx2" and rows[2]["label_reason"] is None
    assert result["labels_cut"] == 1 and any("cut to 300" in r.getMessage() for r in caplog.records)
    assert max(len(user_text(b)) for b in server.requests) < 10_000  # the judge was asked about the cut label


# ---------------------------------------------------------------- 7: an unvalidated statement never replaces a validated one


@pytest.mark.usefixtures("fixture_negatives")
def test_a_label_whose_judge_replies_are_malformed_does_not_replace_the_validated_offline_one(tmp_path):
    write_fixture(tmp_path, [simple_latent(1)])

    def garbled_judge(body, index):
        return Reply(content="the examples 1 and 2, I think") if is_detection(body) else smart(body, index)

    with FakeOpenAI(garbled_judge) as server:
        run_label(llm_cfg(tmp_path, server, max_retries=1))
    row = labels(tmp_path)[1]
    assert row["label_source"] == "heuristic" and row["label"].startswith("'alpha'") and row["label_score"] is not None
    assert row["label_reason"].startswith("llm:judge's label was not validated (validation failed: detect request failed after 2 attempt(s): reply is not JSON")
    assert row["label_reason"].endswith("the offline one is kept: words tagged ctx1")


# ---------------------------------------------------------------- 8: token budgets hold without usage, and with requests in flight


@pytest.mark.usefixtures("fixture_negatives")
def test_replies_without_usage_are_charged_their_estimate(tmp_path, caplog):
    """No `usage` in the replies: label.max_tokens_total=50 was never reached (27 requests, 0 tokens)."""
    write_fixture(tmp_path, [simple_latent(k) for k in (1, 2, 3)])

    def no_usage(body, index):
        reply = smart(body, index)
        reply.omit_usage = True
        return reply

    with FakeOpenAI(no_usage) as server, caplog.at_level(logging.WARNING):
        result = run_label(llm_cfg(tmp_path, server, concurrency=1, max_tokens_total=50))
    assert len(server.requests) == 1 and result["requests"] == 1  # the first costs more than 50 by its estimate
    assert result["estimated_tokens"] == estimate_tokens(server.requests[0]["messages"]) > 50 and result["prompt_tokens"] == 0
    assert result["missing_usage"] == 1 and result["budget_exhausted"] is True and result["budget_refused"] == 3
    assert len([r for r in caplog.records if "has no usage" in r.getMessage()]) == 1


@pytest.mark.usefixtures("fixture_negatives")
def test_requests_in_flight_count_against_the_budget(tmp_path):
    """label.concurrency=4 and a budget of 250: four requests went out at once, 550 tokens."""
    write_fixture(tmp_path, [simple_latent(k) for k in (1, 2, 3, 4)])

    def slow_and_costly(body, index):
        reply = smart(body, index)
        reply.delay_s, reply.prompt_tokens, reply.completion_tokens = 0.3, 100, 50
        return reply

    with FakeOpenAI(slow_and_costly) as server:
        result = run_label(llm_cfg(tmp_path, server, concurrency=4, max_tokens_total=250))
    assert estimate_tokens(server.requests[0]["messages"]) > 250  # one in flight reserves the whole budget
    # One at a time, while the budget lasts: the second is sent at 150 of 250, nothing after it at 300.
    assert server.max_in_flight == 1 and len(server.requests) == 2
    assert result["prompt_tokens"] + result["completion_tokens"] == 300 and result["budget_exhausted"] is True


# ---------------------------------------------------------------- 14: numbers no machine holds, refused before any stage runs


@pytest.mark.parametrize(
    "setting, needles",
    [
        ("seed=-1", ["'seed'", "greater than or equal to 0"]),
        ("seed=4294967296", ["'seed'", "less than 4294967296"]),
        (f"sae.seed={2**64 + 1}", ["'sae.seed'", "less than 4294967296"]),
        ("threads=100000", ["'threads'", "less than or equal to 1024"]),
        ("build.prob_powers=[1, 1]", ["'build.prob_powers'", "repeats [1.0]: each power is one column per model; list it once"]),
        ("sae.d_sae=1000000000", ["sae.d_sae 1,000,000,000 with sae.batch_size 8: training this SAE needs at least", "lower sae.d_sae or sae.batch_size"]),
        ("features.bootstrap_samples=2000000000", ["features.bootstrap_samples 2,000,000,000: the bootstrap needs up to", "this machine has"]),
    ],
)
def test_numbers_no_machine_holds_are_refused_before_any_stage_runs(project, capsys, setting, needles):
    """They ended in tracebacks in features, train or k-means, an exhausted address space, a
    112 GB allocation after four stages, or (powers [1, 1]) silently double weight."""
    before = digests(project.root)
    assert_one_line_error(*bbox(capsys, "run", "-c", str(project.config), "--set", setting), *needles)
    assert digests(project.root) == before and not project.out.exists()


def test_an_sae_no_machine_holds_is_refused_by_train_and_sweep_too(project, capsys):
    assert_one_line_error(*bbox(capsys, "train", "-c", str(project.config), "--set", "sae.d_sae=1000000000"), "training this SAE needs at least")
    sweep = project.root / "sweep.yaml"
    sweep.write_text(f"base: {project.config}\nsae:\n  d_sae: [16, 1000000000]\n")
    assert_one_line_error(*bbox(capsys, "sweep", "-c", str(sweep)), "sae.d_sae 1,000,000,000", "training this SAE needs at least")
    assert not project.out.exists()


# ---------------------------------------------------------------- 15: planted-rule files


@pytest.mark.parametrize(
    "rules, needles",
    [
        ("noise_std: abc\nrules:\n  - {name: the, word: '^the$', delta: -2}\n", ["'noise_std': expected a finite number, got 'abc'"]),
        ("seed: x\nrules:\n  - {name: the, word: '^the$', delta: -2}\n", ["'seed': expected a whole number 0 .. 2**32-1, got 'x'"]),
        ("rules:\n  - {name: the, word: '^the$', delta: abc}\n", ["rules[0]: 'delta': expected a finite number, got 'abc'"]),
        ("rules:\n  - {name: the, word: '^the$', delta: .nan}\n", ["rules[0]: 'delta': expected a finite number, got nan"]),
        ("rules: []\n", ["`rules` is empty"]),
        ("rules:\n  - the\n", ["rules[0]: expected a mapping"]),
        ("rules:\n  - {name: the, delta: -2}\n", ["rules[0]: rule 'the' names no condition"]),
        ("rules:\n  - {name: the, word: 3, delta: -2}\n", ["rules[0]: 'word': expected a string, got 3"]),
        ("rules:\n  - {name: a, word: x, delta: 1}\n  - {name: a, word: y, delta: 1}\n", ["rule name(s) ['a'] given twice"]),
    ],
)
def test_bad_planted_rule_files_are_one_line_before_anything_runs(project, capsys, rules, needles):
    """Tracebacks; `rules: []` ran the whole pipeline for 17 s into a StopIteration; `delta: .nan`
    made every planted log-prob NaN and was reported as a build error about embeddings."""
    path = project.root / "rules.yaml"
    path.write_text(rules)
    before = digests(project.root)
    args = ["eval", "planted", "-c", str(project.config), "-o", str(project.root / "eval"), "--rules", str(path), "--null-seeds", "0"]
    assert_one_line_error(*bbox(capsys, *args), f"{path}: ", *needles)
    assert digests(project.root) == before and not (project.root / "eval").exists()


# ---------------------------------------------------------------- 17: reserved names


@pytest.mark.parametrize(
    "key, name, needle",
    [
        ("models.1.name", "stats-0of1.json", "model name 'stats-0of1.json' is reserved: logprobs/ holds a file of that name"),
        ("sae.run_name", "sweep_summary.csv", "run_name 'sweep_summary.csv' is reserved: sae/ holds a file of that name"),
        ("sae.run_name", "sweep_summary.png", "run_name 'sweep_summary.png' is reserved"),
    ],
)
def test_names_the_layout_gives_its_own_files_are_refused(project, capsys, key, name, needle):
    """A model so named wrote its shards into logprobs/stats-0of1.json/; such a run trained for 33 s, then failed."""
    assert_one_line_error(*bbox(capsys, "run", "-c", str(project.config), "--set", f"{key}={name}"), f"'{key}'", needle)
    assert not project.out.exists()


# ---------------------------------------------------------------- 18: messages that mislead


def test_a_read_only_output_dir_names_the_file_not_a_temp_name(project, capsys, monkeypatch):
    """It said `.config.yaml.0lcxo8e0.tmp: Read-only file system`."""
    import tempfile

    def read_only(prefix="", suffix="", dir=None, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", os.path.join(dir, f"{prefix}0lcxo8e0{suffix}"))

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    line = assert_one_line_error(*bbox(capsys, "run", "-c", str(project.config)), f"{project.paths.config}: Read-only file system")
    assert ".tmp" not in line


def test_a_repeated_sweep_value_is_named_as_such(project, capsys):
    """`d_sae: [16, 16]` was refused with "drop sae.run_name", although none was set."""
    sweep = project.root / "sweep.yaml"
    sweep.write_text(f"base: {project.config}\nsae:\n  d_sae: [16, 16]\n")
    line = assert_one_line_error(*bbox(capsys, "sweep", "-c", str(sweep)), f"{sweep}: 'sae.d_sae': 16 is listed twice; each value is one run, list it once")
    assert "run_name" not in line and not project.out.exists()


# ---------------------------------------------------------------- 9, 10: refused before changing anything; no stale tables read as current


@pytest.fixture(scope="module")
def finished(through_features, tmp_path_factory) -> RunLayout:
    """`through_features` run to the end (offline labels, report)."""
    out = copy_of(through_features, tmp_path_factory.mktemp("finished"))
    assert main(["run", "-c", str(through_features.config), "-o", str(out.root)]) == 0
    return out


@pytest.mark.parametrize(
    "command, extra, needles",
    [
        (["embed"], ["--shard", "5/2"], ["--shard '5/2': need 0 <= i < n"]),
        (["score"], ["--model", "nope"], ["unknown model 'nope'"]),
        (["report"], ["--set", "features.top_n=3"], ["'report' reads", "from stage 'features', which"]),
        (["eval", "ablation"], ["--set", "features.top_n=3"], ["'eval ablation' reads", "from stage 'features', which"]),
        (["eval", "coherence"], ["--set", "features.top_n=3"], ["'eval coherence' reads", "from stage 'features', which"]),
    ],
)
def test_a_refused_command_changes_nothing_in_the_run(finished, through_features, tmp_path, capsys, command, extra, needles):
    """Item 9: `embed --shard 5/2` withdrew the embed record first (then `bbox build` refused too), a
    refused `report` rewrote config.yaml, `eval ablation` rewrote ablation-w0/ and baselines/ for
    19 s before refusing. Item 10: `eval coherence` reported on features made with another top_n."""
    out = RunLayout(tmp_path / "out")
    shutil.copytree(finished.root, out.root)
    before = digests(out.root)
    assert_one_line_error(*bbox(capsys, *command, "-c", str(through_features.config), "-o", str(out.root), *extra), *needles)
    assert digests(out.root) == before
    assert not out.ablation_w0.root.exists() and not out.baseline("random").root.exists()


def test_eval_coherence_on_a_current_run_still_reports(finished, through_features, tmp_path, capsys):
    out = RunLayout(tmp_path / "out")
    shutil.copytree(finished.root, out.root)
    code, err = bbox(capsys, "eval", "coherence", "-c", str(through_features.config), "-o", str(out.root))
    assert code == 0, err


# ---------------------------------------------------------------- 16: a damaged checkpoint is not resumed from


class _TouchOnLoad:
    """A pickle that, loaded with full unpickling, would create a file: code in a checkpoint."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("damage", ["truncated", "malicious pickle"])
def test_a_damaged_newest_checkpoint_is_retrained_from_scratch_with_a_warning(project, capsys, monkeypatch, caplog, damage):
    """A truncated trainer_state.pt wedged the run (torch traceback in `bbox train --resume` and every
    later `bbox run`, until the user removed checkpoints/); a malicious pickle was refused as an
    UnpicklingError traceback."""
    import torch

    from bbox_sae.errors import ArtifactError
    from bbox_sae.layout import checkpoint_complete

    assert bbox(capsys, "run", "-c", str(project.config), "--until", "build")[0] == 0

    def disk_full(*args, **kwargs):
        raise ArtifactError("sae_weights.safetensors: cannot write the trained SAE: no space left on device")

    with monkeypatch.context() as m:  # training ends, its checkpoints stay
        m.setattr("bbox_sae.train.sae.save_inference_model", disk_full)
        assert bbox(capsys, "train", "-c", str(project.config))[0] == 2
    sae_paths = project.load().sae_paths
    (newest,) = [p for p in sae_paths.checkpoints.iterdir() if checkpoint_complete(p).exists()]
    state = newest / "trainer_state.pt"
    marker = project.root / "pwned"
    if damage == "truncated":
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    else:
        torch.save(_TouchOnLoad(marker), state)
    with caplog.at_level(logging.WARNING):
        code, err = bbox(capsys, "train", "-c", str(project.config), "--resume")
    assert code == 0, err
    (said,) = [r.getMessage() for r in caplog.records if "cannot be resumed from" in r.getMessage()]
    assert f"checkpoint {newest} cannot be resumed from" in said and said.endswith("; training afresh")
    assert json.loads(sae_paths.metrics.read_text())["resumed_from_step"] is None and not marker.exists()
    assert bbox(capsys, "run", "-c", str(project.config))[0] == 0  # and the run goes on


# ---------------------------------------------------------------- 12: a sweep's run is named by everything that makes it


def test_a_second_sweep_with_other_fixed_settings_keeps_the_first_ones_runs(finished, through_features, tmp_path, capsys):
    """Same axes, another lr: it retrained `sae/d_sae8-k2` over the first sweep's run."""
    out = RunLayout(tmp_path / "out")
    shutil.copytree(finished.root, out.root)
    trained = {}
    for lr in ("0.01", "0.02"):
        sweep = tmp_path / f"sweep-{lr}.yaml"
        sweep.write_text(f"base: {through_features.config}\nsae:\n  d_sae: [8]\n  k: [2]\n  lr: {lr}\n")
        code, err = bbox(capsys, "sweep", "-c", str(sweep), "-o", str(out.root))
        assert code == 0, err
        run = out.sae_run(f"d_sae8-k2-lr{lr}")
        trained[lr] = hashlib.sha256(run.weights.read_bytes()).hexdigest()
    assert hashlib.sha256(out.sae_run("d_sae8-k2-lr0.01").weights.read_bytes()).hexdigest() == trained["0.01"]  # kept as it was
    assert load_config(out.sae_run("d_sae8-k2-lr0.02").run_config).sae.lr == 0.02


# ---------------------------------------------------------------- 11: statements of earlier findings are not read as current


def test_finding_statements_of_earlier_findings_are_not_read_as_the_current_ones(finished, tmp_path):
    """After `bbox features` re-ran with new findings, finding_labels.parquet of the earlier ones was
    read as theirs (same finding numbers, other findings)."""
    import pyarrow as pa
    from test_report import FINDINGS

    from bbox_sae.artifacts import sha256_file
    from bbox_sae.features import FINDING_SCHEMA
    from bbox_sae.labeling.finding_statements import FINDING_LABEL_SCHEMA, labeled_findings

    assert json.loads(finished.label_stats.read_text())["findings_sha256"] == sha256_file(finished.findings)  # the label stage records it
    run = RunLayout(tmp_path)
    pq.write_table(pa.Table.from_pylist(FINDINGS, schema=FINDING_SCHEMA), run.findings)
    said = [{"finding": f["finding"], "statement": f"said of finding {f['finding']}", "statement_source": "llm:m"} for f in FINDINGS]
    pq.write_table(pa.Table.from_pylist(said, schema=FINDING_LABEL_SCHEMA), run.finding_labels)
    run.label_stats.parent.mkdir(parents=True)
    run.label_stats.write_text(json.dumps({"findings_sha256": sha256_file(run.findings)}))
    assert [f["statement"] for f in labeled_findings(run)] == ["said of finding 0", "said of finding 1"]
    # The features stage re-ran: other findings under the same numbers.
    pq.write_table(pa.Table.from_pylist([{**f, "statement": f"new {f['finding']}"} for f in FINDINGS], schema=FINDING_SCHEMA), run.findings)
    rows = labeled_findings(run)
    assert [f["statement"] for f in rows] == ["new 0", "new 1"] and [f["statement_source"] for f in rows] == ["rule", "word set"]
