"""Planted rules: which words each rule marks, and model B's log-probs with the rules' Δ planted."""

from __future__ import annotations

import math
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
    """A word matches when every given regex matches: `word` on the stripped word, `prev` on the raw
    previous word ("" at a document start), `left` on the previous `left_words` words joined.
    Only the word and its left context: a causal LM's prediction cannot depend on what follows."""

    name: str
    delta: float
    kind: str = ""
    word: str | None = None
    prev: str | None = None
    left: str | None = None
    left_words: int = 3

    def matches(self, words: list[str]) -> np.ndarray:
        n = len(words)
        hit = np.ones(n, dtype=bool)
        checks = [(self.word, lambda i: words[i].strip()), (self.prev, lambda i: words[i - 1] if i else "")]
        checks.append((self.left, lambda i: "".join(words[max(0, i - self.left_words) : i])))
        for pattern, text_of in checks:
            if pattern is None:
                continue
            compiled = regex.compile(pattern)
            hit &= np.array([bool(compiled.search(text_of(i))) for i in range(n)], dtype=bool)
        return hit


def planted_rules_path(cfg: Config, override: str | None) -> Path | Traversable:
    """--rules, else the config's `planted_rules`, else the Shakespeare rules shipped with the package."""
    chosen = override or cfg.planted_rules
    return Path(chosen) if chosen else files("bbox_sae.evaluation").joinpath(DEFAULT_RULES)


_PATTERNS = ("word", "prev", "left")


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
    if not any(r.get(p) is not None for p in _PATTERNS):
        raise ConfigError(f"{where}: rule '{name}' names no `word`, `prev` or `left` pattern: it would match every word")
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
    for s, e in zip(bounds[:-1], bounds[1:]):
        for r in rules:
            masks[r.name][s:e] = r.matches(word_list[s:e])
    return masks


def planted_logprobs(lp_a: np.ndarray, masks: dict[str, np.ndarray], rules: list[PlantedRule], noise_std: float, seed: int) -> np.ndarray:
    """Model B = A + N(0, noise) + the planted Δ of each matching rule, kept a valid log-prob (<= 0)."""
    rng = np.random.default_rng(seed)
    lp_b = lp_a + rng.normal(0.0, noise_std, size=len(lp_a))
    for r in rules:
        lp_b = lp_b + r.delta * masks[r.name]
    return np.minimum(lp_b, 0.0)
