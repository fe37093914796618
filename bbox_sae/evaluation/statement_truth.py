"""Whether each finding's statement is true of the held-out words it covers, read independently.

A finding stores its statement's definition (`rule_json`: rules joined by "or"; `word_set_json`:
listed forms or an ending, with a left condition). This reader applies that definition to the raw
words of `words/` with code of its own: forms, classes, the word before and the layout here, the
document conditions (a long-range repeat, brackets, quotes, the sentence's first word, the text's
opening, a rare form) through the planted rules' reader (`planting.PlantedRule`), never with the
features stage's `Rule.mask`. A statement that says more than its words shows as a share below 1:
"a group of 9 names at the start of a line" that holds 'learning' is still true (the form is
listed); "'years' right after a lower-case word" that covers "twenty years" is not.
"""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import regex

from bbox_sae.artifacts import read_table
from bbox_sae.evaluation.planting import PlantedRule
from bbox_sae.features import context
from bbox_sae.features.rules import FUNCTION_CLASSES

_WH = "|".join(sorted(context.WH_WORDS))
# The statement's words for each flag, as the planted rules' conditions.
FLAG_READERS = {
    "repeat_far": PlantedRule("repeat_far", 0.0, repeat_gap=context.REPEAT_GAP),
    "in_brackets": PlantedRule("in_brackets", 0.0, inside="brackets"),
    "in_quotes": PlantedRule("in_quotes", 0.0, inside="quotes"),
    "doc_opening": PlantedRule("doc_opening", 0.0, first_words=context.OPENING_WORDS),
    "rare": PlantedRule("rare", 0.0, corpus_count_max=context.RARE_COUNT),
    "sentence_wh": PlantedRule("sentence_wh", 0.0, sentence_start=f"(?i)^(?:{_WH})$"),
    "sentence_other": PlantedRule("sentence_other", 0.0, sentence_start=f"(?i)^(?!(?:{_WH})$)"),
}


def form_of(word: str | None) -> str:
    """What a statement's quoted form means: the word without its spaces, in lower case; a run of
    spaces, a line break and a blank line are one form each; "" before the text's first word."""
    if word is None:
        return ""
    text = word.strip()
    if text:
        return text.lower()
    return "\n\n" if word.count("\n") > 1 else "\n" if "\n" in word else " "


def class_of(word: str) -> str:
    """What a statement's class names ("an all-capitals word", "punctuation", "a number") mean."""
    text = word.strip()
    if not text:
        return "blank" if word.count("\n") > 1 else "newline" if "\n" in word else "space"
    if all(unicodedata.category(ch)[0] == "N" for ch in text):
        return "number"
    if not regex.search(r"[\p{L}\p{N}]", text):
        return "punctuation"
    if text[0].isupper():
        return "allcaps" if len(text) > 1 and text == text.upper() else "capitalised"
    return "word"


def left_class_of(word: str | None) -> str:
    """A left class: the start of the text, a function word's role ("a preposition"), else its class."""
    if word is None:
        return "start"
    return next((name for name, members in FUNCTION_CLASSES if form_of(word) in members), None) or class_of(word)


@dataclass
class _Document:
    words: list[str]
    flags: dict[str, np.ndarray]  # per flag the statement names, read once per document


def _holds(rule: dict, doc: _Document, i: int) -> bool:
    """One rule of a statement at word `i` of `doc`."""
    words = doc.words
    prev = words[i - 1] if i else None
    kind, value = rule.get("word_kind"), rule.get("word_value")
    if kind == "form" and form_of(words[i]) != value[2:]:
        return False
    if kind == "forms" and form_of(words[i]) not in {v[2:] for v in value.split("|")}:
        return False
    if kind == "class" and class_of(words[i]) != value[2:]:
        return False
    kind, value = rule.get("left_kind"), rule.get("left_value")
    if kind == "form":
        return form_of(prev) == value[2:]
    if kind == "form2":
        return form_of(words[i - 2] if i >= 2 else None) == value[2:]
    if kind == "class":
        return left_class_of(prev) == value[2:]
    if kind == "layout":
        return prev is None or (prev.count("\n") > 1 if value == "after_blank" else "\n" in prev)
    if kind == "context":
        return bool(doc.flags[value][i])
    if kind == "cue":
        return value[2:] in _words_before(words, i, context.CUE_WINDOW)
    if kind == "cue_sentence":
        return value[2:] in _words_before(words, i, len(words), sentence=True)
    if kind == "cue_text":
        return value[2:] in _words_before(words, i, len(words))
    return True


def _words_before(words: list[str], i: int, n: int, sentence: bool = False) -> set[str]:
    """The forms of the last `n` words with a letter or digit before word `i`, within its sentence
    when `sentence` (a sentence ends at '.', '?' or '!', also before a closer, or a blank line)."""
    found: list[str] = []
    for w in reversed(words[:i]):
        if sentence and (w.strip().rstrip(")]\"'\u201d\u2019")[-1:] in (".", "?", "!") or w.count("\n") > 1):
            break
        if regex.search(r"[\p{L}\p{N}]", w):
            found.append(form_of(w))
            if len(found) == n:
                break
    return set(found)


def _word_set_holds(word_set: dict, doc: _Document, i: int) -> bool:
    form = form_of(doc.words[i])
    listed = form in word_set["forms"]
    suffix = word_set.get("suffix")
    ends = bool(suffix) and form.endswith(suffix) and len(form) > len(suffix) + 1 and form not in word_set.get("excluded", ())
    if word_set.get("left_forms"):
        return (listed or ends) and form_of(doc.words[i - 1] if i else None) in {f[2:] for f in word_set["left_forms"]}
    left = word_set.get("left")
    return (listed or ends) and (left is None or _holds(left, doc, i))


def _flags_named(definition: dict) -> set[str]:
    rules = definition.get("rules") or ([definition["left"]] if definition.get("left") else [])
    return {r["left_value"] for r in rules if r and r.get("left_kind") == "context"}


@dataclass(frozen=True)
class StatementTruth:
    finding: int
    statement: str
    holdout_n: int
    true_of: int  # held-out words the statement holds for

    @property
    def share(self) -> float:
        return self.true_of / self.holdout_n if self.holdout_n else 1.0


def statement_truth(findings_dir: str | Path, words_dir: str | Path | None = None) -> list[StatementTruth]:
    """Per finding of a run (`findings_dir`: a run's output folder, or a sweep run's `features/`),
    how many of its held-out words its statement is true of; `words_dir` defaults to the nearest
    `words/` at or above `findings_dir`."""
    findings_dir = Path(findings_dir)
    words_dir = Path(words_dir) if words_dir else next(p / "words" for p in (findings_dir, *findings_dir.parents) if (p / "words").is_dir())
    findings = read_table(findings_dir / "findings.parquet").to_pylist()
    finding_words = read_table(findings_dir / "finding_words.parquet")
    finding_words = finding_words.filter(pc.equal(finding_words["split"], "holdout"))
    words = read_table(words_dir).select(["doc_id", "word_idx", "word"]).sort_by([("doc_id", "ascending"), ("word_idx", "ascending")])
    definitions = {f["finding"]: {"rules": json.loads(f["rule_json"])} if f.get("rule_json") else json.loads(f["word_set_json"] or "{}") for f in findings}
    flags_needed = set().union(*(_flags_named(d) for d in definitions.values())) if definitions else set()
    doc_ids = words["doc_id"].to_pylist()
    texts = words["word"].to_pylist()
    by_doc: dict[str, list[str]] = {}
    for d, w in zip(doc_ids, texts):
        by_doc.setdefault(d, []).append(w)
    counts = Counter(form_of(w) for w in texts) if "rare" in flags_needed else Counter()
    documents: dict[str, _Document] = {}

    def document(doc_id: str) -> _Document:
        if doc_id not in documents:
            doc_words = by_doc[doc_id]
            documents[doc_id] = _Document(doc_words, {f: FLAG_READERS[f].matches(doc_words, counts) for f in flags_needed})
        return documents[doc_id]

    out = []
    for f in findings:
        mine = finding_words.filter(pc.equal(finding_words["finding"], f["finding"]))
        definition = definitions[f["finding"]]
        true_of = 0
        for doc_id, i in zip(mine["doc_id"].to_pylist(), mine["word_idx"].to_pylist()):
            doc = document(doc_id)
            if "rules" in definition:
                true_of += any(_holds(r, doc, i) for r in definition["rules"])
            else:
                true_of += _word_set_holds(definition, doc, i)
        out.append(StatementTruth(f["finding"], f["statement"], len(mine), true_of))
    return out
