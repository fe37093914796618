"""Planted rules: which words each rule marks, and model B's log-probs with the rules' Δ planted."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

import numpy as np
import pyarrow as pa
import regex
import yaml

from bbox_sae.config import Config
from bbox_sae.errors import ConfigError

# Shipped inside the package, so an installed wheel has it too; configs/ holds the same file for
# users to read and copy.
DEFAULT_RULES = "planted-rules-shakespeare.yaml"


@dataclass(frozen=True)
class PlantedRule:
    """A word matches when every given condition holds: `word` (regex) on the stripped word,
    `prev` on the raw previous word ("" at a document start), `left` on the previous `left_words`
    words joined, or with `left_in` ("sentence" or "text") anywhere in the word's sentence or text
    so far (a register, a topic); and, for differences that live further back in the document, `sentence_start`
    (regex) on the first word of the word's sentence, `inside` ("brackets" or "quotes") an open
    bracket or quotation, `first_words` (the word is among the document's first N words),
    `repeat_gap` (its form was used earlier in the document, last more than N words back) and
    `corpus_count_max` (its form occurs at most N times in the corpus). Words are the units with a
    letter or digit. Only the word and what precedes it: a causal LM cannot see what follows."""

    name: str
    delta: float
    kind: str = ""
    word: str | None = None
    prev: str | None = None
    left: str | None = None
    left_words: int = 3
    left_in: str | None = None
    sentence_start: str | None = None
    inside: str | None = None
    first_words: int | None = None
    repeat_gap: int | None = None
    corpus_count_max: int | None = None

    def matches(self, words: list[str], corpus_counts: Counter | None = None) -> np.ndarray:
        n = len(words)
        hit = np.ones(n, dtype=bool)
        checks = [(self.word, lambda i: words[i].strip()), (self.prev, lambda i: words[i - 1] if i else "")]
        if self.left_in is None:
            checks.append((self.left, lambda i: "".join(words[max(0, i - self.left_words) : i])))
        else:
            hit &= self._left_in_scope(words)
        for pattern, text_of in checks:
            if pattern is None:
                continue
            compiled = regex.compile(pattern)
            hit &= np.array([bool(compiled.search(text_of(i))) for i in range(n)], dtype=bool)
        if any(v is not None for v in (self.sentence_start, self.inside, self.first_words, self.repeat_gap, self.corpus_count_max)):
            hit &= self._in_document(words, corpus_counts or Counter())
        return hit

    def _left_in_scope(self, words: list[str]) -> np.ndarray:
        """Whether `left` matches inside the word's sentence (or text) before the word: some match
        ends at or before the word's first character and starts at or after its sentence's."""
        offsets = np.cumsum([0] + [len(w) for w in words])
        spans = sorted((m.end(), m.start()) for m in regex.finditer(self.left, "".join(words), overlapped=True))
        ends = np.array([e for e, _ in spans], dtype=np.int64)
        latest_start = np.maximum.accumulate(np.array([b for _, b in spans], dtype=np.int64)) if spans else ends
        out = np.zeros(len(words), dtype=bool)
        sentence_start = 0
        for i, raw in enumerate(words):
            k = np.searchsorted(ends, offsets[i], side="right")
            out[i] = k > 0 and (self.left_in == "text" or latest_start[k - 1] >= sentence_start)
            if raw.strip().rstrip(")]\"'\u201d\u2019")[-1:] in (".", "?", "!") or raw.count("\n") > 1:
                sentence_start = offsets[i + 1]
        return out

    def _in_document(self, words: list[str], corpus_counts: Counter) -> np.ndarray:
        """The document-level conditions, read left to right."""
        opener = regex.compile(self.sentence_start) if self.sentence_start else None
        out = np.ones(len(words), dtype=bool)
        seen: dict[str, int] = {}
        n_words, depth, quotes, first = 0, 0, 0, None
        for i, raw in enumerate(words):
            text = raw.strip()
            is_word = bool(regex.search(r"[\p{L}\p{N}]", text))
            if is_word and first is None:
                first = text
            ok = True
            if opener is not None:
                ok &= first is not None and bool(opener.search(first))
            if self.inside == "brackets":
                ok &= depth > 0
            elif self.inside == "quotes":
                ok &= quotes % 2 == 1
            if self.first_words is not None:
                ok &= n_words < self.first_words
            if self.repeat_gap is not None:
                ok &= is_word and text.lower() in seen and n_words - seen[text.lower()] > self.repeat_gap
            if self.corpus_count_max is not None:
                ok &= is_word and corpus_counts[text.lower()] <= self.corpus_count_max
            out[i] = ok
            if is_word:
                seen[text.lower()] = n_words
                n_words += 1
            depth = max(0, depth + sum(text.count(c) for c in "([") - sum(text.count(c) for c in ")]"))
            quotes += sum(text.count(c) for c in '"\u201c\u201d')
            if (text and text.rstrip(")]\"'\u201d\u2019")[-1:] in (".", "?", "!")) or raw.count("\n") > 1:
                first = None
        return out


def planted_rules_path(cfg: Config, override: str | None) -> Path | Traversable:
    """--rules, else the config's `planted_rules`, else the Shakespeare rules shipped with the package."""
    chosen = override or cfg.planted_rules
    return Path(chosen) if chosen else files("bbox_sae.evaluation").joinpath(DEFAULT_RULES)


_PATTERNS = ("word", "prev", "left", "sentence_start")
_COUNTS = ("first_words", "repeat_gap", "corpus_count_max")
_INSIDE = ("brackets", "quotes")
_LEFT_IN = ("sentence", "text")


def _number(value: object, where: str, what: str) -> float:
    """A finite number: `delta: .nan` made every planted log-prob NaN, reported as a build error."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: '{what}': expected a finite number, got {value!r}")
    return float(value)


def _rule(r: object, where: str) -> PlantedRule:
    if not isinstance(r, dict):
        raise ConfigError(f"{where}: expected a mapping (name, delta, and word / prev / left), got {type(r).__name__}")
    if "next" in r:
        raise ConfigError(f"{where}: `next` conditions on the following word, which a causal LM cannot see; use `word`, `prev` or `left`")
    unknown = sorted(str(k) for k in set(r) - set(PlantedRule.__dataclass_fields__))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} (known: {sorted(PlantedRule.__dataclass_fields__)})")
    name = r.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: 'name': expected a non-empty string, got {name!r}")
    if not any(r.get(p) is not None for p in (*_PATTERNS, *_COUNTS, "inside")):
        raise ConfigError(
            f"{where}: rule '{name}' names no condition (`word`, `prev`, `left`, `sentence_start`, `inside`, {', '.join(_COUNTS)}): it would match every word"
        )
    if r.get("inside") is not None and r["inside"] not in _INSIDE:
        raise ConfigError(f"{where}: 'inside': expected one of {list(_INSIDE)}, got {r['inside']!r}")
    if r.get("left_in") is not None and (r["left_in"] not in _LEFT_IN or r.get("left") is None):
        raise ConfigError(f"{where}: 'left_in': expected one of {list(_LEFT_IN)} with a `left` pattern, got {r['left_in']!r}")
    for key in _COUNTS:
        value = r.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"{where}: '{key}': expected a whole number >= 0, got {value!r}")
    for key in (*_PATTERNS, "kind"):
        if r.get(key) is not None and not isinstance(r[key], str):
            raise ConfigError(f"{where}: '{key}': expected a string, got {r[key]!r}")
    left_words = r.get("left_words", 3)
    if isinstance(left_words, bool) or not isinstance(left_words, int) or left_words < 1:
        raise ConfigError(f"{where}: 'left_words': expected a whole number >= 1, got {left_words!r}")
    rule = PlantedRule(**{**r, "delta": _number(r.get("delta"), where, "delta")})
    for key in _PATTERNS:
        pattern = getattr(rule, key)
        if pattern is not None:
            try:
                regex.compile(pattern)
            except regex.error as err:
                raise ConfigError(f"{where}: '{key}': not a regex: {err}") from None
    return rule


def load_rules(path: str | Path | Traversable) -> tuple[list[PlantedRule], float, int]:
    """The rules of a planted-rules YAML file, its noise_std and its seed; a file that is not one
    is refused in one line naming the rule and the key, before anything runs."""
    try:
        raw = yaml.safe_load((Path(path) if isinstance(path, str) else path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read planted rules: {err}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("rules"), list):
        raise ConfigError(f"{path}: expected a mapping with a `rules` list")
    if not raw["rules"]:
        raise ConfigError(f"{path}: `rules` is empty: nothing would be planted, so there is nothing to recover")
    rules = [_rule(r, f"{path}: rules[{i}]") for i, r in enumerate(raw["rules"])]
    names = [r.name for r in rules]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{path}: rule name(s) {repeated} given twice: each rule's recovery is reported under its name")
    noise_std = _number(raw.get("noise_std", 0.1), str(path), "noise_std")
    if noise_std < 0:
        raise ConfigError(f"{path}: 'noise_std': must be >= 0, got {noise_std!r}")
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ConfigError(f"{path}: 'seed': expected a whole number 0 .. 2**32-1, got {seed!r}")
    return rules, noise_std, seed


def rule_masks(words: pa.Table, rules: list[PlantedRule]) -> dict[str, np.ndarray]:
    """Per rule, which rows of `words` (ordered by doc then word) it matches."""
    doc_ids = words["doc_id"].to_numpy(zero_copy_only=False)
    word_list = words["word"].to_pylist()
    bounds = np.flatnonzero(np.r_[True, doc_ids[1:] != doc_ids[:-1], True])
    masks = {r.name: np.zeros(len(word_list), dtype=bool) for r in rules}
    counts = Counter(w.strip().lower() for w in word_list) if any(r.corpus_count_max is not None for r in rules) else None
    for s, e in zip(bounds[:-1], bounds[1:]):
        for r in rules:
            masks[r.name][s:e] = r.matches(word_list[s:e], counts)
    return masks


def planted_logprobs(lp_a: np.ndarray, masks: dict[str, np.ndarray], rules: list[PlantedRule], noise_std: float, seed: int) -> np.ndarray:
    """Model B = A + N(0, noise) + the planted Δ of each matching rule, kept a valid log-prob (<= 0)."""
    rng = np.random.default_rng(seed)
    lp_b = lp_a + rng.normal(0.0, noise_std, size=len(lp_a))
    for r in rules:
        lp_b = lp_b + r.delta * masks[r.name]
    return np.minimum(lp_b, 0.0)
