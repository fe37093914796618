"""Labeling (issue 6): the real `openai` client over HTTP against a scripted local server,
detection scoring, and the offline heuristic labeler.

The fixtures write features.parquet and contexts.parquet directly, with no matrix or SAE behind
them, so the negatives the label stage would draw are the fixture's own (`fixture_negatives`)."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from bbox_sae.config import config_from_dict
from bbox_sae.errors import ArtifactError, ConfigError, EndpointError
from bbox_sae.labeling import (
    Context,
    MalformedReply,
    describe,
    detection_scores,
    heuristic_rule,
    labeled_features,
    parse_detection_reply,
    parse_label_reply,
    rule_matches,
    run_label,
)
from bbox_sae.layout import RunLayout
from bbox_sae.retry import backoff_delay, retry_after_seconds
from bbox_sae.schemas import contexts_schema
from helpers.fake_openai import FakeOpenAI, Reply, json_reply, user_text

MODELS = ("a", "b", "c")

# ---------------------------------------------------------------------------------------------
# Fixtures: features.parquet / contexts.parquet exactly as docs/artifacts.md describes them

NEGATIVES = "fixture-negatives.parquet"


@pytest.fixture(autouse=True)
def fixture_negatives(monkeypatch):
    """The label stage's negatives are the fixture's `negative` (and `contrast`) rows."""
    import bbox_sae.labeling.stage as stage

    monkeypatch.setattr(stage, "draw_negatives", lambda src, forms, contrast=0, members_of=None: pq.read_table(src.cfg.out / NEGATIVES))


def write_fixture(out: Path, latents: list[dict]) -> None:
    """Each latent: {"latent", "kept", "pairs": [(model_a, model_b, median_dlogp)], "train"/"holdout"/"negative"/"contrast": [(left, word, right)]}."""
    feats: dict[str, list] = {k: [] for k in FEATURE_SCHEMA.names}
    ctxs: dict[str, list] = {k: [] for k in CONTEXT_SCHEMA.names}
    for spec in latents:
        for model_a, model_b, dlogp in spec.get("pairs", [("a", "b", 1.5)]):
            row = {
                "latent": spec["latent"],
                "model_a": model_a,
                "model_b": model_b,
                "n_top": len(spec["train"]),
                "density": 0.01,
                "max_activation": 3.0,
                "median_dlogp": dlogp,
                "mean_dlogp": dlogp,
                "median_dp": dlogp / 10,
                "ci_low": dlogp - 0.5,
                "ci_high": dlogp + 0.5,
                "consistency": 0.9,
                "p_value": 0.001,
                "q_value": 0.01,
                "coherence": 0.7,
                "holdout_n": len(spec.get("holdout", [])),
                "holdout_median_dlogp": dlogp,
                "holdout_mean_dlogp": dlogp,
                "holdout_median_dp": dlogp / 10,
                "generalizes": True,
                "paper_rule": True,
                "kept": spec.get("kept", True),
                "better_model": model_a if dlogp > 0 else model_b if dlogp < 0 else None,
                "top_words": " | ".join(sorted({w for _, w, _ in spec["train"]})),
                "source": "sae",
            }
            for k, v in row.items():
                feats[k].append(v)
        for split in ("train", "holdout", "negative", "contrast"):
            for rank, (left, word, right) in enumerate(spec.get(split, [])):
                row = {
                    "latent": spec["latent"],
                    "split": split,
                    "rank": rank,
                    "doc_id": f"doc{spec['latent']}-{split}-{rank}",
                    "word_idx": rank,
                    "activation": 0.0 if split in ("negative", "contrast") else 3.0 - 0.1 * rank,
                    "in_top": split not in ("negative", "contrast"),
                    "left": left,
                    "word": word,
                    "right": right,
                    **{f"logprob__{m}": -2.0 for m in MODELS},
                }
                for k, v in row.items():
                    ctxs[k].append(v)
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(feats, schema=FEATURE_SCHEMA), RunLayout(out).features)
    contexts = pa.table(ctxs, schema=CONTEXT_SCHEMA)
    negative = pc.is_in(contexts["split"], value_set=pa.array(["negative", "contrast"]))
    pq.write_table(contexts.filter(pc.invert(negative)), RunLayout(out).contexts)
    pq.write_table(contexts.filter(negative), out / NEGATIVES)


_F64 = pa.float64()
FEATURE_SCHEMA = pa.schema(
    [("latent", pa.int32()), ("model_a", pa.string()), ("model_b", pa.string()), ("n_top", pa.int32())]
    + [
        (c, _F64)
        for c in ["density", "max_activation", "median_dlogp", "mean_dlogp", "median_dp", "ci_low", "ci_high", "consistency", "p_value", "q_value", "coherence"]
    ]
    + [("holdout_n", pa.int32())]
    + [(c, _F64) for c in ["holdout_median_dlogp", "holdout_mean_dlogp", "holdout_median_dp"]]
    + [
        ("generalizes", pa.bool_()),
        ("paper_rule", pa.bool_()),
        ("kept", pa.bool_()),
        ("better_model", pa.string()),
        ("top_words", pa.string()),
        ("source", pa.string()),
    ]
)
CONTEXT_SCHEMA = contexts_schema(MODELS)


def simple_latent(latent: int, kept: bool = True, **extra) -> dict:
    """Train words ' alpha' tagged ctx<latent>; holdout positives ' pos', negatives ' neg'."""
    return {
        "latent": latent,
        "kept": kept,
        "train": [(f"ctx{latent} example {r}", " alpha", " end") for r in range(3)],
        "holdout": [(f"held {r}", " pos", "") for r in range(2)],
        "negative": [(f"other {r}", " neg", "") for r in range(2)],
        **extra,
    }


def make_cfg(tmp: Path, **label):
    return config_from_dict(
        {
            "output_dir": str(tmp),
            "corpus": {"path": "x.jsonl"},
            "models": [{"name": "a", "source": "parquet", "path": "a.parquet"}, {"name": "b", "source": "parquet", "path": "b.parquet"}],
            "wandb": {"mode": "disabled"},
            "label": {"backoff_base_s": 0.01, "backoff_max_s": 0.05, **label},
        }
    )


def llm_cfg(tmp: Path, server: FakeOpenAI, **label):
    # The protocol tests below count label and detection requests; fuzzing has tests of its own.
    label = {"fuzz_examples": 0, **label}
    return make_cfg(tmp, labeler="llm", base_url=server.base_url, model="judge", api_key_env="BBOX_TEST_UNSET_KEY", **label)


def numbered_lines(text: str) -> list[tuple[int, str]]:
    return [(int(i), line) for i, line in re.findall(r"^(\d+)\. (.*)$", text, re.MULTILINE)]


def is_detection(body: dict) -> bool:
    return '"matches"' in user_text(body)


def smart(body: dict, index: int) -> Reply:
    """A well-behaved judge: labels name the ctx<latent> tag; detection picks the ' pos' examples."""
    text = user_text(body)
    if is_detection(body):
        return json_reply({"matches": [i for i, line in numbered_lines(text) if "<< pos>>" in line]})
    latent = re.search(r"ctx(\d+)", text).group(1)
    return json_reply({"coherent": True, "description": f"words tagged ctx{latent}"})


def labels(tmp: Path) -> dict[int, dict]:
    rows = labeled_features(RunLayout(tmp)).to_pylist()
    return {r["latent"]: r for r in rows}


def stats(tmp: Path) -> dict:
    return json.loads(RunLayout(tmp).label_stats.read_text())


# ---------------------------------------------------------------------------------------------
# LLM labeler over real HTTP


def test_happy_path_writes_labels_scores_and_stats(tmp_path):
    write_fixture(tmp_path, [simple_latent(1, pairs=[("a", "b", 1.5), ("a", "c", -2.0)]), simple_latent(2), simple_latent(3, kept=False)])

    def responder(body, index):
        # latent 2's judge says every example fits: recall 1, precision 1/2, balanced accuracy 1/2
        if is_detection(body) and "ctx2" in user_text(body):
            return json_reply({"matches": [i for i, _ in numbered_lines(user_text(body))]})
        return smart(body, index)

    with FakeOpenAI(responder) as server:
        result = run_label(llm_cfg(tmp_path, server, prompt_cost_per_1k=1.0, completion_cost_per_1k=2.0))

    table = labeled_features(RunLayout(tmp_path))
    assert table.num_rows == 4 and table.column_names[: len(FEATURE_SCHEMA)] == FEATURE_SCHEMA.names
    assert table.schema.field("label_score").type == pa.float64()
    assert table.schema.field("label_coherent").type == pa.bool_()
    rows = table.to_pylist()
    pair_rows = [r for r in rows if r["latent"] == 1]
    assert len(pair_rows) == 2 and all(r["label"] == "words tagged ctx1" for r in pair_rows)
    assert all(r["label_source"] == "llm:judge" and r["label_coherent"] is True for r in pair_rows)
    assert all((r["label_score"], r["label_precision"], r["label_recall"]) == (1.0, 1.0, 1.0) for r in pair_rows)
    assert all(r["label_reason"] is None for r in pair_rows)
    two = labels(tmp_path)[2]
    assert (two["label_score"], two["label_precision"], two["label_recall"]) == (0.5, 0.5, 1.0)
    three = labels(tmp_path)[3]
    assert all(three[c] is None for c in ["label", "label_source", "label_reason", "label_coherent", "label_score"])

    assert len(server.requests) == 4  # label + detection for each kept latent, none for latent 3
    assert set(server.authorizations) == {"Bearer EMPTY"}
    body = server.requests[0]
    assert body["model"] == "judge" and body["response_format"] == {"type": "json_object"} and body["temperature"] == 0.0
    label_prompt = next(user_text(b) for b in server.requests if not is_detection(b) and "ctx1" in user_text(b))
    assert "<< alpha>>" in label_prompt and "a predicts these words better than b" in label_prompt
    assert "c predicts these words better than a" in label_prompt
    detect_prompt = next(user_text(b) for b in server.requests if is_detection(b) and "ctx1" in user_text(b))
    lines = [line for _, line in numbered_lines(detect_prompt)]
    assert len(lines) == 4 and sum("<< pos>>" in x for x in lines) == 2 and sum("<< neg>>" in x for x in lines) == 2
    assert "alpha" not in "".join(lines)  # the judge never sees the examples the labeler saw

    expected = {
        "requests": 4,
        "cache_hits": 0,
        "retries": 0,
        "failures": 0,
        "prompt_tokens": 40,
        "completion_tokens": 20,
        "cost": 0.08,
        "labeled": 2,
        "unlabeled": 0,
        "features": 2,
    }
    assert {k: result[k] for k in expected} == expected
    assert stats(tmp_path) == result


def test_malformed_reply_is_retried_then_recovers(tmp_path):
    write_fixture(tmp_path, [simple_latent(1)])
    bad = ["Sure! The words are all 'alpha'.", json.dumps({"coherent": "yes", "description": "alpha"})]

    def responder(body, index):
        return Reply(content=bad[index]) if index < len(bad) else smart(body, index)

    with FakeOpenAI(responder) as server:
        result = run_label(llm_cfg(tmp_path, server))
    row = labels(tmp_path)[1]
    assert row["label"] == "words tagged ctx1" and row["label_source"] == "llm:judge" and row["label_score"] == 1.0
    assert result["retries"] == 2 and result["requests"] == 4 and result["failures"] == 0


def test_malformed_until_retries_exhausted_records_reason(tmp_path):
    write_fixture(tmp_path, [simple_latent(1)])
    # No label arrived at all: the stage fails (one line), keeping the offline label.
    with FakeOpenAI(lambda body, index: Reply(content="no json here")) as server, pytest.raises(EndpointError, match="every label request failed"):
        run_label(llm_cfg(tmp_path, server, max_retries=1))
    row = labels(tmp_path)[1]
    assert row["label_source"] == "heuristic" and "'alpha'" in row["label"]
    assert "not JSON" in row["label_reason"] and "2 attempt" in row["label_reason"]
    assert len(server.requests) == 2 and stats(tmp_path)["failures"] == 1 and stats(tmp_path)["labels_failed"] == 1


def test_rate_limit_waits_at_least_retry_after(tmp_path):
    write_fixture(tmp_path, [simple_latent(1)])

    def responder(body, index):
        return Reply(status=429, headers={"Retry-After": "1"}) if index == 0 else smart(body, index)

    with FakeOpenAI(responder) as server:
        result = run_label(llm_cfg(tmp_path, server, backoff_max_s=2.0))
    # backoff_base_s is 0.01 s: only the Retry-After header (under the 2 s cap) explains a one-second wait
    assert server.arrivals[1] - server.arrivals[0] >= 1.0
    assert labels(tmp_path)[1]["label"] == "words tagged ctx1"
    assert result["retries"] == 1 and result["requests"] == 3


def test_server_errors_exhaust_retries_for_one_feature_and_rerun_pays_only_for_it(tmp_path):
    write_fixture(tmp_path, [simple_latent(1), simple_latent(2), simple_latent(3)])

    def broken_for_2(body, index):
        return Reply(status=500) if "ctx2" in user_text(body) else smart(body, index)

    with FakeOpenAI(broken_for_2) as server:
        result = run_label(llm_cfg(tmp_path, server, max_retries=2))
    rows = labels(tmp_path)
    assert rows[2]["label_source"] == "heuristic" and "'alpha'" in rows[2]["label"]  # the offline label, kept
    assert "HTTP 500" in rows[2]["label_reason"] and "3 attempt" in rows[2]["label_reason"]
    assert [rows[k]["label"] for k in (1, 3)] == ["words tagged ctx1", "words tagged ctx3"]
    assert sum("ctx2" in user_text(b) for b in server.requests) == 3
    assert result["failures"] == 1 and result["retries"] == 2 and result["labels_failed"] == 1

    # The answers that arrived were cached as they came: only latent 2 is asked again.
    with FakeOpenAI(smart) as server:
        result = run_label(llm_cfg(tmp_path, server, max_retries=2))
    assert len(server.requests) == 2 and all("ctx2" in user_text(b) for b in server.requests)
    assert result["cache_hits"] == 4
    assert labels(tmp_path)[2]["label"] == "words tagged ctx2" and labels(tmp_path)[2]["label_reason"] is None


def test_timeouts_are_retried_and_reported(tmp_path):
    write_fixture(tmp_path, [simple_latent(1), simple_latent(2)])

    def responder(body, index):
        slow = "ctx2" in user_text(body) or (index == 0 and "ctx1" in user_text(body))
        return Reply(delay_s=5.0) if slow else smart(body, index)

    start = time.monotonic()
    with FakeOpenAI(responder) as server:
        result = run_label(llm_cfg(tmp_path, server, timeout_s=0.4, max_retries=1))
    assert time.monotonic() - start < 4.0  # the client gave up instead of waiting for the slow replies
    rows = labels(tmp_path)
    assert rows[1]["label"] == "words tagged ctx1" and rows[1]["label_score"] == 1.0
    assert rows[2]["label_source"] == "heuristic" and "timed out" in rows[2]["label_reason"]
    assert result["retries"] == 2 and result["failures"] == 1


def test_concurrency_never_exceeds_limit(tmp_path):
    write_fixture(tmp_path, [simple_latent(k) for k in range(1, 7)])

    def responder(body, index):
        reply = smart(body, index)
        reply.delay_s = 0.1
        return reply

    with FakeOpenAI(responder) as server:
        run_label(llm_cfg(tmp_path, server, concurrency=2))
    assert len(server.requests) == 12
    assert server.max_in_flight == 2  # the limit is reached (requests overlap) and never exceeded
    assert all(r["label_score"] == 1.0 for r in labels(tmp_path).values())


def test_rerun_is_served_from_cache_and_idempotent(tmp_path):
    write_fixture(tmp_path, [simple_latent(1), simple_latent(2)])
    with FakeOpenAI(smart) as server:
        cfg = llm_cfg(tmp_path, server)
        run_label(cfg)
        first = pq.read_table(RunLayout(tmp_path).labels)
        sent = len(server.requests)
        result = run_label(cfg)
    assert sent == 4 and len(server.requests) == 4  # nothing sent the second time
    assert result["cache_hits"] == 4 and result["requests"] == 0 and result["prompt_tokens"] == 0
    assert len(list(RunLayout(tmp_path).label_cache.glob("*.json"))) == 4
    second = pq.read_table(RunLayout(tmp_path).labels)
    assert second.column_names == first.column_names and second.equals(first)


def test_dry_run_prints_prompts_and_sends_nothing(tmp_path, capsys):
    write_fixture(tmp_path, [simple_latent(1)])
    before = RunLayout(tmp_path).features.read_bytes()
    with FakeOpenAI(smart) as server:
        result = run_label(llm_cfg(tmp_path, server, dry_run=True))
    printed = capsys.readouterr().out
    assert server.requests == []
    assert "latent 1" in printed and "ctx1 example 0<< alpha>> end" in printed
    assert result["dry_run"] is True and result["requests"] == 0
    assert RunLayout(tmp_path).features.read_bytes() == before
    assert not RunLayout(tmp_path).labels_dir.exists()


def test_rejected_credentials_stop_the_run(tmp_path):
    write_fixture(tmp_path, [simple_latent(1)])
    with FakeOpenAI(lambda body, index: Reply(status=401)) as server:
        with pytest.raises(EndpointError, match="BBOX_TEST_UNSET_KEY"):
            run_label(llm_cfg(tmp_path, server))
    assert len(server.requests) == 1  # not retried: every request would be refused alike


def test_missing_inputs_and_incomplete_llm_config_are_one_line_errors(tmp_path):
    with pytest.raises(ArtifactError, match="features.parquet"):
        run_label(make_cfg(tmp_path))
    write_fixture(tmp_path, [simple_latent(1)])
    with pytest.raises(ConfigError, match="label.base_url"):
        run_label(make_cfg(tmp_path, labeler="llm"))


# ---------------------------------------------------------------------------------------------
# Pure pieces: detection arithmetic, reply parsing, backoff


def test_detection_scores_on_scripted_judgements():
    truth = [True, True, True, False, False, False]
    s = detection_scores(truth, [True, True, False, True, False, False])
    assert (s.recall, s.precision, s.balanced_accuracy) == pytest.approx((2 / 3, 2 / 3, 2 / 3))
    s = detection_scores(truth, [True, False, False, False, False, False])
    assert (s.recall, s.precision, s.balanced_accuracy) == pytest.approx((1 / 3, 1.0, 2 / 3))
    perfect = detection_scores(truth, truth)
    assert (perfect.recall, perfect.precision, perfect.balanced_accuracy) == (1.0, 1.0, 1.0)


def test_detection_scores_undefined_parts_are_none():
    nothing_picked = detection_scores([True, False], [False, False])
    assert nothing_picked.precision is None and nothing_picked.recall == 0.0 and nothing_picked.balanced_accuracy == 0.5
    no_positives = detection_scores([False, False], [True, False])
    assert no_positives.recall is None and no_positives.balanced_accuracy is None and no_positives.precision == 0.0
    empty = detection_scores([], [])
    assert (empty.recall, empty.precision, empty.balanced_accuracy) == (None, None, None)
    with pytest.raises(ValueError):
        detection_scores([True], [])


def test_parse_label_reply_is_strict():
    assert parse_label_reply('{"coherent": false, "description": " a\\n b "}').description == "a b"
    assert parse_label_reply('```json\n{"coherent": true, "description": "x"}\n```').coherent is True
    for bad in ["x", "[1]", '{"coherent": 1, "description": "x"}', '{"coherent": true, "description": ""}', '{"coherent": true}']:
        with pytest.raises(MalformedReply):
            parse_label_reply(bad)


def test_parse_detection_reply_checks_numbers():
    assert parse_detection_reply('{"matches": [1, 3, 3]}', 3) == {1, 3}
    assert parse_detection_reply("[2]", 3) == {2}
    assert parse_detection_reply('{"matches": []}', 3) == frozenset()
    for bad in ['{"matches": [0]}', '{"matches": [4]}', '{"matches": [true]}', '{"matches": "1"}', '{"m": [1]}']:
        with pytest.raises(MalformedReply):
            parse_detection_reply(bad, 3)


def test_backoff_grows_is_capped_and_honours_retry_after():
    assert backoff_delay(0, 1.0, 60.0, jitter=1.0, retry_after_s=None) == 1.0
    assert backoff_delay(3, 1.0, 60.0, jitter=1.0, retry_after_s=None) == 8.0
    assert backoff_delay(3, 1.0, 60.0, jitter=0.0, retry_after_s=None) == 4.0
    assert backoff_delay(10, 1.0, 5.0, jitter=1.0, retry_after_s=None) == 5.0
    assert backoff_delay(0, 0.01, 3.0, jitter=0.5, retry_after_s=2.0) == 2.0
    assert backoff_delay(0, 0.01, 0.05, jitter=0.5, retry_after_s=2.0) == 0.05  # the cap holds for Retry-After too
    assert retry_after_seconds({"retry-after": "3"}) == 3.0
    assert retry_after_seconds({}) is None and retry_after_seconds({"retry-after": "soon"}) is None
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 <= retry_after_seconds({"retry-after": later}) <= 31


# ---------------------------------------------------------------------------------------------
# Heuristic labeler

WERE_AFTER_IF = {
    "latent": 10,
    "train": [
        ("I wish that if you", " were", " here with me"),
        ("and if you", " were", " to ask him"),
        ("If I", " were", " you, I would"),
        ("what if he", " were", " right after all"),
        ("even if you", " were", " late"),
        ("as if it", " were", " nothing"),
    ],
    "holdout": [("but if you", " were", " there"), ("if she", " were", " older")],
    "negative": [("They", " were", " happy"), ("The dogs", " were", " barking"), ("He", " ran", " home")],
}
COMMA_BEFORE_NAME = {
    "latent": 11,
    "train": [
        ('"I told you', ",", ' Harry," said Ron.'),
        ('"Come on', ",", ' Hermione," he whispered.'),
        ('"Listen', ",", ' Neville. We have to go."'),
        ('"Thank you', ",", ' Professor," she answered.'),
        ('"Wait', ",", ' Ginny!" shouted Fred.'),
    ],
    "holdout": [('"Good morning', ",", ' Luna," said Harry.'), ('"Look', ",", ' Dobby," he said.')],
    "negative": [("We bought apples", ",", " pears and plums"), ("Later", ",", " we went home."), ("the", " cat", " sat")],
}
NEWLINE_RUNS = {
    "latent": 12,
    "train": [
        ("end of the chapter.", "\n\n", "Chapter Two"),
        ("Yours truly,", "\n", "John"),
        ("THE END", "\n\n\n", "Appendix"),
        ("first line", "\n", "second line"),
        ("## Heading", "\n\n", "Some text"),
    ],
    "holdout": [("Dear Sir,", "\n", "Thank you"), ("the end.", "\n\n", "Next")],
    "negative": [("hello", " world", ""), ("and", " then", " more"), ("one", "\n", "and two")],
}


def _contexts(rows) -> list[Context]:
    return [Context(*r) for r in rows]


def test_heuristic_descriptions_of_hand_built_features():
    were = heuristic_rule(_contexts(WERE_AFTER_IF["train"]))
    assert describe(were) == "'were' after 'if'" and were.coherent
    comma = describe(heuristic_rule(_contexts(COMMA_BEFORE_NAME["train"])))
    assert "comma" in comma and "capitalised word" in comma and comma.index("comma") < comma.index("capitalised")
    assert comma == "',' (comma) followed by a capitalised word"
    newline = describe(heuristic_rule(_contexts(NEWLINE_RUNS["train"])))
    assert "newline" in newline


def test_heuristic_matcher_follows_the_description():
    were = heuristic_rule(_contexts(WERE_AFTER_IF["train"]))
    assert rule_matches(were, Context("what if they", " Were", " real"))  # case and space normalized
    assert not rule_matches(were, Context("They", " were", " happy"))  # the word without the context
    assert not rule_matches(were, Context("if you", " are", " here"))  # the context without the word
    comma = heuristic_rule(_contexts(COMMA_BEFORE_NAME["train"]))
    assert rule_matches(comma, Context("Yes", ",", " Sirius")) and not rule_matches(comma, Context("Yes", ",", " sir"))


def test_heuristic_without_a_shared_pattern_is_incoherent():
    rule = heuristic_rule(_contexts([("a", " dog", " b"), ("c", " runs", " d"), ("e", " blue", " f"), ("g", " so", " h"), ("i", " it", " j")]))
    assert not rule.coherent and describe(rule).startswith("mixed words such as")


def test_heuristic_labeler_end_to_end(tmp_path):
    write_fixture(tmp_path, [WERE_AFTER_IF, COMMA_BEFORE_NAME, NEWLINE_RUNS])
    result = run_label(make_cfg(tmp_path))  # no endpoint configured: `auto` picks the heuristic
    rows = labels(tmp_path)
    assert {r["label_source"] for r in rows.values()} == {"heuristic"}
    assert rows[10]["label"] == "'were' after 'if'"
    assert "comma" in rows[11]["label"] and "newline" in rows[12]["label"]
    for r in rows.values():
        assert (r["label_score"], r["label_precision"], r["label_recall"]) == (1.0, 1.0, 1.0)
        assert r["label_coherent"] is True and r["label_reason"] is None
    assert result["labeler"] == "heuristic" and result["model"] is None
    assert result["requests"] == 0 and result["labeled"] == 3 and stats(tmp_path) == result


def test_a_latent_broader_than_its_finding_says_what_else_it_fires_on():
    """Latent fires on 'st' (its finding's rule) and on place names (its `broader` rules): the label
    names both, is marked incoherent, and the judge counts both."""
    from bbox_sae.features.rules import Rule
    from bbox_sae.labeling import heuristic_label
    from bbox_sae.labeling.records import FeatureExamples

    def ctx(word: str) -> Context:
        return Context("And thou know", word, " it well")

    train = tuple(ctx(w) for w in ["st"] * 10 + [" Denmark"] * 4 + [" Norway"] * 3 + [" Moor"])
    holdout = tuple(ctx(w) for w in ["st"] * 5 + [" Denmark", " Norway"] * 2 + [" Norway"])
    negative = tuple(ctx(w) for w in [" the", " king", " sword", " night", " Rome"] * 2)
    rule, places = Rule("form", "f:st"), (Rule("form", "f:denmark"), Rule("form", "f:norway"))
    broad = heuristic_label(FeatureExamples(1, train, holdout, negative, (), rules=(rule,), broader=places), seed=0)
    assert broad.label == "'st'; the latent also fires on 'denmark', 'norway'" and broad.coherent is False
    assert (broad.score, broad.precision, broad.recall) == (1.0, 1.0, 1.0)

    narrow = heuristic_label(FeatureExamples(2, train, holdout, negative, (), rules=(rule,)), seed=0)
    assert narrow.label == "'st'" and narrow.coherent is True
    assert narrow.recall == 0.5  # the place names in holdout are what the rule alone misses

    after_blank = Rule("form", "f:scene", "layout", "after_blank")
    elsewhere = heuristic_label(FeatureExamples(3, train, holdout, negative, (), rules=(after_blank,), broader=(Rule("form", "f:scene"),)), seed=0)
    assert elsewhere.label == "'scene' after a blank line; the latent also fires on 'scene' elsewhere"


# ---------------------------------------------------------------------------------------------
# The stage owns its settings


@pytest.mark.parametrize("setting", [{"validation_examples": 3}, {"only_kept": False}, {"examples": 5}, {"labeler": "heuristic"}])
def test_label_settings_are_in_the_label_key_only(tmp_path, setting):
    from bbox_sae.bookkeeping import stage_key
    from bbox_sae.stages import BY_NAME
    from helpers.stages import recorded

    manifest = recorded(tmp_path, "ingest", "score", "embed", "build", "train", "features")
    before, after = make_cfg(tmp_path), make_cfg(tmp_path, **setting)
    for name in ("embed", "build", "train", "features"):  # (ingest and score read the corpus files)
        # Nothing before the label stage re-runs when only a label setting changes.
        assert stage_key(BY_NAME[name], before, manifest) == stage_key(BY_NAME[name], after, manifest)
    assert stage_key(BY_NAME["label"], before, manifest) != stage_key(BY_NAME["label"], after, manifest)


def test_a_new_offline_labeler_relabels_an_old_run(tmp_path, monkeypatch):
    from bbox_sae.bookkeeping import stage_key
    from bbox_sae.labeling import heuristic
    from bbox_sae.stages import BY_NAME
    from helpers.stages import recorded

    manifest = recorded(tmp_path, "ingest", "score", "embed", "build", "train", "features")
    before = stage_key(BY_NAME["label"], make_cfg(tmp_path), manifest)
    monkeypatch.setattr(heuristic, "OFFLINE_LABELER_VERSION", heuristic.OFFLINE_LABELER_VERSION + 1)
    assert stage_key(BY_NAME["label"], make_cfg(tmp_path), manifest) != before


def test_a_new_findings_grouping_makes_the_findings_again(tmp_path, monkeypatch):
    from bbox_sae.bookkeeping import stage_key
    from bbox_sae.features import grouping
    from bbox_sae.stages import BY_NAME
    from helpers.stages import recorded

    manifest = recorded(tmp_path, "ingest", "score", "embed", "build", "train")
    before = stage_key(BY_NAME["features"], make_cfg(tmp_path), manifest)
    monkeypatch.setattr(grouping, "FINDINGS_VERSION", grouping.FINDINGS_VERSION + 1)
    assert stage_key(BY_NAME["features"], make_cfg(tmp_path), manifest) != before


def test_negatives_of_a_finding_member_are_words_where_no_member_fires():
    """Latents 0 and 1 form one finding (one per name, say): a word only latent 1 fires on is
    covered by the finding's label, so it is never drawn as latent 0's negative."""
    import numpy as np
    import pyarrow as pa
    import torch

    from bbox_sae.labeling.negatives import finding_members, negative_rows

    n_rows = 40
    acts = torch.zeros(n_rows, 3)
    acts[0:10, 0] = 1.0  # latent 0's words
    acts[10:20, 1] = 1.0  # its sibling's words, same form
    acts[20:25, 2] = 1.0  # an unrelated latent
    matrix = np.arange(n_rows, dtype=np.float32)[:, None]

    def encode(x):
        return acts[x[:, 0].long()]

    pool = np.arange(n_rows)
    forms = np.array(["name"] * 20 + ["other"] * 20, dtype=object)
    findings = pa.table({"latents": ["0,1"]})
    members = finding_members(findings, [0, 2])
    assert members == {0: [0, 1], 2: [2]}
    grouped = negative_rows(encode, matrix, {0: {"name"}, 2: {"other"}}, pool, forms, 12, 0, 16, members_of=members)
    alone = negative_rows(encode, matrix, {0: {"name"}, 2: {"other"}}, pool, forms, 12, 0, 16)
    assert not set(grouped[0].tolist()) & set(range(0, 20))
    assert set(alone[0].tolist()) & set(range(10, 20)), "without the finding, the sibling's words are drawn"
    assert not set(grouped[2].tolist()) & set(range(20, 25))
    assert set(grouped[2].tolist()) & set(range(0, 20)), "a latent in no finding keeps only its own exclusion"
