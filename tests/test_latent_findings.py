"""Latent-defined findings end to end: a difference no rule of the grammar states (a class of 32
nouns, none above 5% of its occurrences, in the same frames as 32 other nouns) comes out as one
finding, said by its words, and nothing else does."""

import numpy as np
import pytest

from bbox_sae.artifacts import read_table
from helpers.planted import assert_statements_true, planted_pipeline, planted_rows

ANIMALS = (
    "cat dog horse cow sheep goat pig mouse rabbit fox wolf bear deer lion tiger monkey donkey duck goose hen owl eagle "
    "crow frog snake turtle whale shark camel zebra giraffe elephant"
).split()
OBJECTS = (
    "chair table door window lamp cup plate spoon bottle box bag coat shoe hat book pen clock bed desk shelf basket "
    "bucket candle mirror blanket pillow kettle ladder hammer brush towel drum"
).split()
FRAMES = [
    "The {} was seen near the river.",
    "A {} stood by the gate.",
    "We found the {} behind the barn.",
    "Her {} lay beside the wall.",
    "The old {} waited at the door.",
    "Nobody moved the {} that morning.",
]


def animal_corpus(n_docs: int = 300) -> list[str]:
    rng = np.random.default_rng(0)
    docs = []
    for _ in range(n_docs):
        nouns = [str(rng.choice(ANIMALS if rng.random() < 0.35 else OBJECTS)) for _ in range(4)]
        docs.append(" ".join(str(rng.choice(FRAMES)).format(n) for n in nouns))
    return docs


def is_animal(words: list[str], idx: int) -> bool:
    return words[idx].strip().lower() in ANIMALS


@pytest.fixture(scope="module")
def animal_run(tmp_path_factory):
    cfg, planted, words = planted_pipeline(tmp_path_factory.mktemp("animals"), planted_delta=3.0, docs=animal_corpus(), is_planted=is_animal)
    return cfg, planted_rows(cfg, planted, words)


def test_a_class_no_rule_states_is_one_finding_said_by_its_words(animal_run):
    from bbox_sae.labeling import run_label
    from bbox_sae.labeling.finding_statements import labeled_findings

    cfg, planted = animal_run
    run_label(cfg)
    findings = labeled_findings(cfg.paths)
    covered = read_table(cfg.paths.finding_words).to_pandas()

    def held_out_words(finding: int) -> np.ndarray:
        return covered[(covered["finding"] == finding) & (covered["split"] == "holdout")]["row"].to_numpy()

    holdout = read_table(cfg.paths.index)["split"].to_numpy(zero_copy_only=False) == "holdout"
    assert findings, "the planted class must come out"
    for f in findings:
        rows = held_out_words(f["finding"])
        # Every finding is the planted class (nothing else differs), tested on every held-out word of its set.
        assert planted[rows].mean() >= 0.8, f"finding {f['statement']!r} is {planted[rows].mean():.0%} animals"
        assert f["better_model"] == "A" and f["holdout_median_dlogp"] == pytest.approx(3.0, abs=0.05)
    # One finding per difference, covering the class, said as a group of its words (no rule states it).
    assert len(findings) == 1, [f["statement"] for f in findings]
    (f,) = findings
    rows = held_out_words(f["finding"])
    assert np.isin(np.flatnonzero(planted & holdout), rows).mean() >= 0.7
    assert f["kind"] == "latent" and f["rule"] is None and f["statement_source"] == "word set"
    assert f["statement"].startswith("a group of ") and f["detection"] >= 0.85
    tested = read_table(cfg.paths.rules).to_pandas()
    assert {"rule", "latent"} >= set(tested["kind"]) and (tested["kind"] == "latent").any()
    assert_statements_true(cfg)


def test_an_llm_names_a_latent_finding_and_its_name_is_tested_on_held_out_words(animal_run):
    """With an endpoint, a latent finding is offered to the LLM (contrastive: its words against the
    same forms outside it, the offline statement as a hint); the LLM's name is kept only after a
    judge reading just the name picks the finding's held-out words from the near misses."""
    import re

    from bbox_sae.labeling import run_label
    from bbox_sae.labeling.finding_statements import labeled_findings
    from helpers.fake_openai import FakeOpenAI, json_reply, user_text

    cfg, _ = animal_run

    def numbered(text: str) -> list[tuple[int, str]]:
        return [(int(i), line) for i, line in re.findall(r"^(\d+)\. (.*)$", text, re.MULTILINE)]

    def judge(body: dict, index: int):
        text = user_text(body)
        if '"matches"' in text:
            marked = [(i, re.search(r"<<(.*?)>>", line).group(1).strip().lower()) for i, line in numbered(text)]
            return json_reply({"matches": [i for i, word in marked if word in ANIMALS]})
        return json_reply({"coherent": True, "description": "names of animals"})

    label = {"labeler": "llm", "model": "judge", "api_key_env": "BBOX_TEST_UNSET_KEY", "fuzz_examples": 0}
    with FakeOpenAI(judge) as server:
        llm_cfg = cfg.model_copy(update={"label": cfg.label.model_copy(update={**label, "base_url": server.base_url})})
        run_label(llm_cfg)
    (finding,) = labeled_findings(cfg.paths)
    assert finding["statement"] == "names of animals" and finding["statement_source"] == "llm:judge"
    assert finding["detection"] >= 0.85
    prompts = [user_text(b) for b in server.requests if '"matches"' not in user_text(b)]
    # The finding's label prompt shows its train words against near misses and the offline statement as a hint.
    assert any("a group of" in p and "Counter-examples" in p for p in prompts)


def test_units_in_one_left_context_with_a_latent_in_common_are_one_finding():
    """'lord' after 'my' (its own latent and a broad one) and the kin words after 'my' (three
    others and the same broad one) are one finding; the broad latent alone does not bring in '?';
    one named word before joins without a shared latent too (`finding_groups`), but never across
    winners."""
    from bbox_sae.features.candidates import Tested
    from bbox_sae.features.rules import Rule
    from bbox_sae.features.tested_findings import finding_groups
    from bbox_sae.features.word_sets import WordSet

    after_my = Rule(None, None, "form", "f:my")
    kin = WordSet(("father", "brother"), (5, 3), left=after_my)

    def unit(latents, start, sign=1, rule=None, word_set=None):
        rows = np.arange(start, start + 10)
        return Tested("rule" if rule else "latent", ("a", "b"), sign, latents, rows, rows, rule=rule, word_set=word_set)

    units = [
        unit([367, 405], 0, rule=Rule("form", "f:lord", "form", "f:my")),
        unit([26, 405, 454], 10, word_set=kin),
        unit([405], 20, rule=Rule("form", "f:?")),
        unit([999], 30, word_set=kin),
        unit([405], 40, sign=-1, rule=Rule("form", "f:lady", "form", "f:my")),
    ]
    assert finding_groups(units, 0.5) == [[0, 1, 3], [2], [4]]
