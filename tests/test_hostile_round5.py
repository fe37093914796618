"""Issue 57 (hostile review, round 5): remote scoring that lies or dies, a pair listed twice, SIGTERM.
Each case asserts what the user sees (exit code, one line naming the document, window and value
or the field), that nothing wrong is stored, and that giving up is bounded in time and leaves no
task running to print tracebacks after the error. The servers are FakeVLLM's on 127.0.0.1
(tests/helpers/hostile_vllm.py)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import random
import re
import signal
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_endpoint import DOCS, endpoint_project, lm, local_scores, make_scorer, n_windows

from bbox_sae.errors import EndpointError
from bbox_sae.scoring.base import LOGPROB_RULE
from bbox_sae.scoring.replicas import Replicas
from helpers.cli import assert_one_line_error, bbox, bbox_process
from helpers.fake_vllm import Backend
from helpers.hardening import start_killable, wait_for
from helpers.hostile_vllm import DEATHS, DyingVLLM, LyingVLLM
from helpers.project import SMALL_RUN, Project, make_project


@pytest.fixture(scope="module")
def backend() -> Backend:
    return Backend(*lm("smollm2"))


@pytest.fixture()
def project(tmp_path) -> Project:
    return make_project(tmp_path, **SMALL_RUN)


def stored_shards(project: Project, model: str) -> list:
    return sorted(project.paths.logprobs(model).glob("part-*"))


# ---------------------------------------------------------------- 1: a positive log-prob is refused, from a server as from a file


@pytest.mark.parametrize("value, shown", [(2.0, "2"), (math.inf, "inf")])
@pytest.mark.parametrize("mode", [{}, {"prompt_logprobs": True}], ids=["echo", "prompt_logprobs"])
def test_a_positive_logprob_from_a_server_is_refused_naming_document_window_and_value(backend, tmp_path, capsys, mode, value, shown):
    """+2.0 went into logprobs/<model> and the matrix, exit 0; +inf was nulled with a warning."""
    with LyingVLLM(backend, logprob=value) as srv:
        project = endpoint_project(tmp_path, {"a": srv.url, "b": srv.url}, **mode)
        line = assert_one_line_error(*bbox(capsys, "score", "-c", str(project.config)), LOGPROB_RULE)
    assert re.search(rf"model 'a': document 'doc\d', tokens \d+-\d+: log-prob {shown} > 0 at token position \d+; ", line), line
    assert not stored_shards(project, "a")


def test_a_positive_logprob_in_a_parquet_file_is_refused_by_the_same_rule(project, capsys):
    path = project.logprob_file("a")
    table = pq.read_table(path)
    logprobs = table["logprob"].to_numpy().copy()
    logprobs[3] = math.inf
    pq.write_table(table.set_column(2, "logprob", [logprobs]), path)
    line = assert_one_line_error(*bbox(capsys, "score", "-c", str(project.config)), f"{path}: log-prob inf > 0 for document 'd0' word 3; {LOGPROB_RULE}")
    assert "negative log-likelihoods?" in line and not stored_shards(project, "a")


# ---------------------------------------------------------------- 2: an answer to another prompt is refused


@pytest.mark.parametrize("ids_as_tokens", [False, True], ids=["tokens as text", "tokens as ids"])
def test_an_answer_to_another_prompt_of_the_same_length_is_refused(backend, ids_as_tokens):
    """Only the count of echoed tokens was checked: the answer was stored as this document's."""
    with LyingVLLM(backend, other_prompt=True, ids_as_tokens=ids_as_tokens) as srv:
        scorer = make_scorer("smollm2", [srv.url])
        with pytest.raises(EndpointError, match=r"document 'plain', tokens 0-\d+: .*cannot be aligned.*: echoed token \d+ is '.*', but token id \d+"):
            list(scorer.score(DOCS[:1]))
    assert scorer.failures == 1


def test_echoed_tokens_named_by_id_are_checked_by_id(backend):
    """vLLM's `return_tokens_as_token_ids`: the right ids pass, and give the local scores."""
    with LyingVLLM(backend, ids_as_tokens=True) as srv:
        got = list(make_scorer("smollm2", [srv.url]).score(DOCS))
    reference = local_scores("smollm2", DOCS)
    for scores in got:
        np.testing.assert_allclose(scores.logprobs, reference[scores.doc_id].logprobs, atol=1e-5, rtol=0)


# ---------------------------------------------------------------- 3, 4: a server that dies: bounded, one line, no traceback


def test_a_request_cancelled_as_a_slot_frees_passes_the_slot_on():
    """How `bbox score` could hang: the request woken for the freed slot was cancelled (its document
    had failed), took the wake-up with it, and the next one waited for ever, sending nothing."""

    async def scenario() -> None:
        replicas = Replicas(["http://127.0.0.1:9"], concurrency=1, backoff_base_s=0.01, backoff_max_s=0.01)
        replicas.open(None, 1.0)
        holder = await replicas.acquire(None)
        woken, behind = asyncio.ensure_future(replicas.acquire(None)), asyncio.ensure_future(replicas.acquire(None))
        await asyncio.sleep(0.01)
        replicas.release(holder, True)
        woken.cancel()
        assert (await asyncio.wait_for(behind, 5)) is holder
        assert woken.cancelled() and holder.in_flight == 1
        await replicas.close()

    asyncio.run(scenario())


@contextlib.contextmanager
def within(seconds: float, what: str):
    """Fail (instead of hanging the suite) if the block takes longer than `seconds`."""

    def expired(signum, frame):
        raise AssertionError(f"{what}: still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def asyncio_noise(caplog):
    """Tasks the scorer's event loops still held when they closed, and what such tasks print once
    collected: asyncio's error log ("Task was destroyed but it is pending!") and unraisable
    exceptions ("Event loop is closed", "Lock is not acquired")."""
    noise: list[str] = []
    loops: list[asyncio.AbstractEventLoop] = []
    new_event_loop = asyncio.new_event_loop
    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.WARNING, logger="asyncio"):
        mp.setattr(asyncio, "new_event_loop", lambda: loops.append(new_event_loop()) or loops[-1])
        mp.setattr(sys, "unraisablehook", lambda u: noise.append(f"{u.exc_type.__name__}: {u.exc_value} in {u.object!r}"))
        yield noise
        noise.extend(f"left pending: {task!r}" for loop in loops for task in asyncio.all_tasks(loop))
        gc.collect()
    noise.extend(r.getMessage() for r in caplog.records if r.name == "asyncio")


@pytest.mark.parametrize("death, said", [("503", "HTTP 503"), ("html", "malformed response (no choices): <html>")])
def test_giving_up_on_a_dead_server_leaves_no_task_to_print_tracebacks(backend, caplog, death, said):
    """The failed document's other windows were left running on a loop about to close."""
    with DyingVLLM(backend, death, die_after=6) as srv, asyncio_noise(caplog) as noise, within(60, death):
        scorer = make_scorer("smollm2", [srv.url], max_retries=2, backoff_base_s=0.05, backoff_max_s=0.1)
        with pytest.raises(EndpointError, match=rf"document '\w+': gave up after 3 attempt\(s\); last error from .*: {re.escape(said)}"):
            list(scorer.score(DOCS))
    assert not noise, noise[:3]


def test_bbox_score_against_a_server_dying_mid_shard_ends_in_one_line(backend, tmp_path):
    """It ended in tracebacks after the error, or (2 runs of 11) never ended."""
    with DyingVLLM(backend, "503", die_after=12) as srv:
        project = endpoint_project(tmp_path, {"a": srv.url, "b": srv.url}, max_retries=3, backoff_max_s=0.1, concurrency=2)
        start = time.monotonic()
        done = bbox_process("score", "-c", str(project.config), timeout=120)
    assert time.monotonic() - start < 60
    assert_one_line_error(done.returncode, done.stderr, "model 'a': document 'doc", "gave up after 4 attempt(s)", "HTTP 503: overloaded")
    assert "Task was destroyed" not in done.stderr and "Event loop is closed" not in done.stderr


# At most this many runs, and no new one after this many seconds: 30 runs take about 20 s on a free core.
FAULT_RUNS, FAULT_BUDGET_S = 30, 90


def test_a_server_dying_at_random_points_never_hangs_and_never_prints_a_traceback(backend, caplog):
    """Fault injection: each run draws how the server dies, after how many requests (up to all
    of them), and the scorer's concurrency, retries and timeout; each must end within 30 s, in
    scores or in one EndpointError line naming a document, with no task left behind."""
    rng = random.Random(57)
    n_requests = n_windows("smollm2", DOCS)
    start, outcomes = time.monotonic(), []
    for run in range(FAULT_RUNS):
        if time.monotonic() - start > FAULT_BUDGET_S:
            break
        death, die_after = rng.choice(DEATHS), rng.randint(0, n_requests)
        settings = {"concurrency": rng.randint(1, 4), "max_retries": rng.randint(0, 2), "timeout_s": 0.5, "backoff_max_s": 0.05}
        context = f"run {run}: {death} after {die_after} requests, {settings}"
        with DyingVLLM(backend, death, die_after, delay_s=rng.choice([0.0, 0.01])) as srv, asyncio_noise(caplog) as noise, within(30, context):
            srv.slow_s = 2.0
            scorer = make_scorer("smollm2", [srv.url], **settings)
            try:
                outcomes.append(len(list(scorer.score(DOCS))))
            except EndpointError as err:
                assert "\n" not in str(err) and re.match(r"model 'smollm2': document '\w+'", str(err)), f"{context}: {err}"
                outcomes.append(str(err))
        assert not noise, f"{context}: {noise[:3]}"
        caplog.clear()
    assert len(outcomes) >= 10 and any(isinstance(o, str) for o in outcomes)
    assert all(o == len(DOCS) for o in outcomes if isinstance(o, int)), outcomes


# ---------------------------------------------------------------- 5: a pair listed twice, or both ways


@pytest.mark.parametrize(
    "pairs, needle",
    [
        ("[[a, b], [a, b]]", "pair (a, b) is listed twice; list each pair once"),
        ("[[a, b], [b, a]]", "pair (b, a) is pair (a, b) reversed, the same comparison with the opposite sign; list it once"),
    ],
)
def test_a_pair_listed_twice_or_reversed_is_refused(project, capsys, pairs, needle):
    """Every row of features.parquet and labels.parquet appeared twice; reversed, one difference
    was reported as two findings of opposite sign."""
    assert_one_line_error(*bbox(capsys, "run", "-c", str(project.config), "--set", f"compare={pairs}"), "invalid config: 'compare': ", needle)
    assert not project.out.exists()


# ---------------------------------------------------------------- 6: SIGTERM says so, releases the lock, and the run resumes


def test_sigterm_prints_one_line_releases_the_lock_and_the_run_resumes(project, tmp_path):
    """What Slurm, docker and systemd send at a time limit ended the run with exit 143 and no word."""
    signal_file = tmp_path / "reached"
    proc = start_killable(2, signal_file, "run", "-c", str(project.config), "--until", "score")
    wait_for(proc, signal_file)
    assert project.paths.lock.exists()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "bbox: terminated (SIGTERM); re-run the same command to resume" and "Traceback" not in err, err
    assert not project.paths.lock.exists()
    again = bbox_process("run", "-c", str(project.config), "--until", "score")
    assert again.returncode == 0, again.stderr
    assert "took over" not in again.stderr
