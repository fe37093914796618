"""Describe features in plain words and check each description by detection.

Two labelers write the same columns of `features.parquet`:

- `llm`: any OpenAI-compatible chat endpoint reads a feature's train-split contexts and says
  whether they form one group and what it is, in one sentence.
- `heuristic`: an offline, deterministic rule extracted from the same contexts (dominant word
  forms, a shared neighbouring n-gram or the class of the neighbouring word), and its wording.

Every description is then scored on examples the labeler never saw (delphi-style detection):
the feature's holdout top activations are the positives, its `negative` contexts the
negatives, and a judge (the LLM, or the heuristic rule itself) says which ones fit. Balanced
accuracy, precision and recall of that judgement say how much to trust the label.

LLM requests are cached on disk as soon as their answer arrives, so a re-run (or a run after
a crash) never pays twice for the same question.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import re
import unicodedata
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence, TypeVar

import openai
import pyarrow as pa
import pyarrow.compute as pc

from bbox_sae.artifacts import atomic_write_json, atomic_write_table, read_table, require_columns
from bbox_sae.config import Config, LabelConfig
from bbox_sae.errors import ConfigError, EndpointError
from bbox_sae.retry import backoff_delay, retry_after_seconds
from bbox_sae.rules import Rule, normalize_form, rules_from_json, word_attributes
from bbox_sae.words import split_words

log = logging.getLogger(__name__)

# Bump when a prompt changes: it is part of every cache key, so old answers are not reused.
PROMPT_VERSION = "1"

FEATURE_COLUMNS = ["latent", "model_a", "model_b", "kept", "better_model", "median_dlogp"]
CONTEXT_COLUMNS = ["latent", "split", "rank", "left", "word", "right"]
# column -> (LabelResult attribute, Arrow type)
LABEL_COLUMNS = {
    "label": ("label", pa.string()),
    "label_source": ("source", pa.string()),
    "label_reason": ("reason", pa.string()),
    "label_coherent": ("coherent", pa.bool_()),
    "label_score": ("score", pa.float64()),
    "label_precision": ("precision", pa.float64()),
    "label_recall": ("recall", pa.float64()),
}

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Inputs and results


@dataclass(frozen=True)
class Context:
    left: str
    word: str
    right: str


@dataclass(frozen=True)
class Comparison:
    model_a: str
    model_b: str
    better_model: str | None
    median_dlogp: float | None


@dataclass(frozen=True)
class FeatureExamples:
    latent: int
    train: tuple[Context, ...]
    holdout: tuple[Context, ...]
    negative: tuple[Context, ...]
    comparisons: tuple[Comparison, ...]
    rules: tuple[Rule, ...] = ()  # the context rules of the latent's findings (or its own best rule)


@dataclass(frozen=True)
class DetectionScores:
    balanced_accuracy: float | None
    precision: float | None
    recall: float | None


@dataclass(frozen=True)
class LabelResult:
    label: str | None
    source: str
    reason: str | None = None
    coherent: bool | None = None
    score: float | None = None
    precision: float | None = None
    recall: float | None = None


@dataclass
class Stats:
    requests: int = 0
    cache_hits: int = 0
    retries: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def select_latents(features: pa.Table, only_kept: bool) -> list[int]:
    latents = features["latent"]
    if only_kept:
        latents = pc.filter(latents, pc.fill_null(features["kept"], False))
    return sorted(set(latents.to_pylist()))


def feature_examples(
    features: pa.Table, contexts: pa.Table, latents: Sequence[int], n_train: int, n_validation: int, findings: pa.Table | None = None
) -> list[FeatureExamples]:
    """Group the contexts (rank order, capped per split) and the pair comparisons of each latent."""
    wanted = pa.array(latents, pa.int64())
    rows = contexts.filter(pc.is_in(pc.cast(contexts["latent"], pa.int64()), value_set=wanted))
    by_split: dict[tuple[int, str], list[tuple[int, Context]]] = defaultdict(list)
    for r in rows.select(CONTEXT_COLUMNS).to_pylist():
        by_split[(r["latent"], r["split"])].append((r["rank"], Context(r["left"] or "", r["word"] or "", r["right"] or "")))
    comparisons: dict[int, list[Comparison]] = defaultdict(list)
    finding_rules = {f["finding"]: rules_from_json(f["rule_json"]) for f in (findings.to_pylist() if findings is not None else []) if f["rule_json"]}
    rules: dict[int, list[Rule]] = defaultdict(list)
    columns = FEATURE_COLUMNS + [c for c in ("rule_json", "findings") if c in features.column_names]
    for r in features.filter(pc.is_in(pc.cast(features["latent"], pa.int64()), value_set=wanted)).select(columns).to_pylist():
        comparisons[r["latent"]].append(Comparison(r["model_a"], r["model_b"], r["better_model"], r["median_dlogp"]))
        mine = [rule for f in (r.get("findings") or "").split(",") if f and int(f) in finding_rules for rule in finding_rules[int(f)]]
        if not mine and r.get("rule_json"):
            mine = rules_from_json(r["rule_json"])
        rules[r["latent"]].extend(m for m in mine if m not in rules[r["latent"]])

    def top(latent: int, split: str, n: int) -> tuple[Context, ...]:
        return tuple(c for _, c in sorted(by_split[(latent, split)], key=lambda rc: rc[0])[:n])

    return [
        FeatureExamples(
            latent=latent,
            train=top(latent, "train", n_train),
            holdout=top(latent, "holdout", n_validation),
            negative=top(latent, "negative", n_validation),
            comparisons=tuple(comparisons[latent]),
            rules=tuple(rules.get(latent, ())),
        )
        for latent in latents
    ]


# ---------------------------------------------------------------------------------------------
# Detection scoring


def validation_set(feature: FeatureExamples, seed: int) -> tuple[list[Context], list[bool]]:
    """Holdout positives and negatives, shuffled the same way on every run (stable cache keys)."""
    labelled = [(c, True) for c in feature.holdout] + [(c, False) for c in feature.negative]
    random.Random(f"{seed}:{feature.latent}").shuffle(labelled)
    return [c for c, _ in labelled], [t for _, t in labelled]


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def detection_scores(truth: Sequence[bool], predicted: Sequence[bool]) -> DetectionScores:
    """Balanced accuracy, precision and recall; a metric whose denominator is empty is None, not 0."""
    if len(truth) != len(predicted):
        raise ValueError(f"{len(truth)} truths but {len(predicted)} judgements")
    tp = sum(t and p for t, p in zip(truth, predicted))
    fp = sum(not t and p for t, p in zip(truth, predicted))
    fn = sum(t and not p for t, p in zip(truth, predicted))
    tn = sum(not t and not p for t, p in zip(truth, predicted))
    recall = _ratio(tp, tp + fn)
    specificity = _ratio(tn, tn + fp)
    balanced = None if recall is None or specificity is None else (recall + specificity) / 2
    return DetectionScores(balanced_accuracy=balanced, precision=_ratio(tp, tp + fp), recall=recall)


# ---------------------------------------------------------------------------------------------
# Prompts and replies


class MalformedReply(Exception):
    """The endpoint answered, but not in the format asked for (retryable: sampling may fix it)."""


@dataclass(frozen=True)
class LabelAnswer:
    coherent: bool
    description: str


SYSTEM_PROMPT = (
    "You study where two language models differ. You read short text excerpts, each with one word "
    "marked <<like this>>, and answer with JSON only."
)
_EXAMPLES_NOTE = "Each example is an excerpt with one word marked <<like this>>; line breaks are shown as \\n."


def _visible(text: str) -> str:
    # Raw newlines would break the one-example-per-line layout the judge answers by number.
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def show_context(ctx: Context) -> str:
    return f"{_visible(ctx.left)}<<{_visible(ctx.word)}>>{_visible(ctx.right)}"


def _numbered(contexts: Sequence[Context]) -> str:
    return "\n".join(f"{i}. {show_context(c)}" for i, c in enumerate(contexts, 1))


def comparison_line(c: Comparison) -> str:
    if c.better_model is None or c.median_dlogp is None:
        return f"- {c.model_a} and {c.model_b} predict these words equally well."
    worse = c.model_b if c.better_model == c.model_a else c.model_a
    return (
        f"- {c.better_model} predicts these words better than {worse} "
        f"(median log-probability difference {abs(c.median_dlogp):.2f} nats)."
    )


def _messages(user: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def label_messages(feature: FeatureExamples) -> list[dict]:
    comparisons = "\n".join(comparison_line(c) for c in feature.comparisons)
    user = (
        f"The marked words below were grouped together while comparing language models:\n{comparisons}\n\n"
        f"{_EXAMPLES_NOTE}\n\nExamples:\n{_numbered(feature.train)}\n\n"
        "Do the marked words form one coherent group? Describe what they have in common in one specific "
        "sentence, including the context that matters (for example \"conditional 'were' after 'if you'\", "
        "not \"verbs\"). Describe the words, not the models.\n"
        'Answer with JSON: {"coherent": true or false, "description": "..."}'
    )
    return _messages(user)


def detection_messages(description: str, examples: Sequence[Context]) -> list[dict]:
    user = (
        f"Description: {description}\n\n{_EXAMPLES_NOTE}\n\nExamples:\n{_numbered(examples)}\n\n"
        "Which examples have a marked word that fits the description?\n"
        'Answer with JSON: {"matches": [numbers of the fitting examples]} (an empty list if none fit).'
    )
    return _messages(user)


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def _json_payload(text: str) -> object:
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        # Without JSON mode many models still wrap the JSON in a code fence.
        text = fenced.group(1)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise MalformedReply(f"reply is not JSON ({err.msg}): {text[:80]!r}") from None


def parse_label_reply(text: str) -> LabelAnswer:
    obj = _json_payload(text)
    if not isinstance(obj, dict):
        raise MalformedReply("label reply is not a JSON object")
    coherent, description = obj.get("coherent"), obj.get("description")
    if not isinstance(coherent, bool):
        raise MalformedReply(f"label reply: 'coherent' must be true or false, got {coherent!r}")
    if not isinstance(description, str) or not description.strip():
        raise MalformedReply(f"label reply: 'description' must be a non-empty string, got {description!r}")
    return LabelAnswer(coherent, " ".join(description.split()))


def parse_detection_reply(text: str, n: int) -> frozenset[int]:
    """The 1-based example numbers the judge picked."""
    obj = _json_payload(text)
    matches = obj.get("matches") if isinstance(obj, dict) else obj
    if not isinstance(matches, list):
        raise MalformedReply('detection reply needs {"matches": [numbers]}')
    bad = [m for m in matches if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= n]
    if bad:
        raise MalformedReply(f"detection reply names {bad[:5]}, not example numbers 1..{n}")
    return frozenset(matches)


# ---------------------------------------------------------------------------------------------
# Requests: cache, concurrency limit, retries


def cache_key(kind: str, model: str, messages: list[dict]) -> str:
    payload = {"kind": kind, "model": model, "prompt_version": PROMPT_VERSION, "messages": messages}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class RequestFailed(Exception):
    """A request that failed for good; its message becomes the feature's `label_reason`."""


# 401/403/404 mean a wrong key, model or URL: every other request would fail the same way.
_FATAL_STATUS = {401, 403, 404}
_RETRY_STATUS = {408, 409, 429}


def _classify(err: MalformedReply | openai.APIError) -> str:
    if isinstance(err, openai.APIStatusError):
        if err.status_code in _FATAL_STATUS:
            return "fatal"
        return "retry" if err.status_code in _RETRY_STATUS or err.status_code >= 500 else "fail"
    # Connection errors include timeouts; anything else (e.g. a body the client cannot parse) is final.
    return "retry" if isinstance(err, (MalformedReply, openai.APIConnectionError)) else "fail"


def _describe(err: MalformedReply | openai.APIError) -> str:
    if isinstance(err, openai.APIStatusError):
        detail = err.body.get("message") if isinstance(err.body, dict) else None
        return f"HTTP {err.status_code}" + (f": {str(detail)[:200]}" if detail else "")
    if isinstance(err, openai.APITimeoutError):
        return "timed out"
    return str(err)


def _reply_text(response: object) -> str:
    try:
        content = response.choices[0].message.content  # type: ignore[attr-defined]
    except (AttributeError, IndexError, TypeError):
        raise MalformedReply("response has no choices") from None
    if not isinstance(content, str):
        raise MalformedReply("response has no text content")
    return content


def _read_cache(path: Path) -> str | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))["content"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return None


class Asker:
    """Sends chat requests under one concurrency limit, with our retry policy and the answer cache."""

    def __init__(self, client: openai.AsyncOpenAI, cfg: LabelConfig, cache_dir: Path, stats: Stats, rng: random.Random):
        self.client, self.cfg, self.cache_dir, self.stats, self.rng = client, cfg, cache_dir, stats, rng
        self._slots = asyncio.Semaphore(cfg.concurrency)

    async def ask(self, kind: str, messages: list[dict], parse: Callable[[str], T]) -> T:
        path = self.cache_dir / f"{cache_key(kind, self.cfg.model, messages)}.json"
        cached = _read_cache(path)
        if cached is not None:
            try:
                value = parse(cached)
            except MalformedReply:
                pass  # written by another parser version: ask again
            else:
                self.stats.cache_hits += 1
                return value
        attempt = 0
        while True:
            attempt += 1
            try:
                content = await self._send(messages)
                value = parse(content)
            except (MalformedReply, openai.APIError) as err:
                action = _classify(err)
                if action == "fatal":
                    raise EndpointError(
                        f"{self.cfg.base_url}: {_describe(err)} for model '{self.cfg.model}'; "
                        f"check label.base_url, label.model and ${self.cfg.api_key_env}"
                    ) from None
                if action == "fail" or attempt > self.cfg.max_retries:
                    self.stats.failures += 1
                    raise RequestFailed(f"{kind} request failed after {attempt} attempt(s): {_describe(err)}") from None
                self.stats.retries += 1
                headers = getattr(getattr(err, "response", None), "headers", {})
                wait = backoff_delay(
                    attempt - 1, self.cfg.backoff_base_s, self.cfg.backoff_max_s, self.rng.random(), retry_after_seconds(headers)
                )
                await asyncio.sleep(wait)
                continue
            atomic_write_json(path, {"kind": kind, "model": self.cfg.model, "prompt_version": PROMPT_VERSION, "content": content})
            return value

    async def _send(self, messages: list[dict]) -> str:
        extra: dict = {}
        if self.cfg.json_mode:
            extra["response_format"] = {"type": "json_object"}
        if self.cfg.temperature is not None:
            extra["temperature"] = self.cfg.temperature
        async with self._slots:
            self.stats.requests += 1
            response = await self.client.chat.completions.create(model=self.cfg.model, messages=messages, **extra)
        usage = getattr(response, "usage", None)
        if usage is not None:
            self.stats.prompt_tokens += usage.prompt_tokens or 0
            self.stats.completion_tokens += usage.completion_tokens or 0
        return _reply_text(response)


async def _llm_label_one(asker: Asker, feature: FeatureExamples, seed: int) -> LabelResult:
    if not feature.train:
        return LabelResult(None, "unlabeled", reason="no train contexts in contexts.parquet")
    try:
        answer = await asker.ask("label", label_messages(feature), parse_label_reply)
    except RequestFailed as err:
        log.warning("latent %d unlabeled: %s", feature.latent, err)
        return LabelResult(None, "unlabeled", reason=str(err))
    source = f"llm:{asker.cfg.model}"
    examples, truth = validation_set(feature, seed)
    if not examples:
        return LabelResult(answer.description, source, coherent=answer.coherent)
    try:
        picked = await asker.ask(
            "detect", detection_messages(answer.description, examples), lambda text: parse_detection_reply(text, len(examples))
        )
    except RequestFailed as err:
        log.warning("latent %d not validated: %s", feature.latent, err)
        return LabelResult(answer.description, source, reason=f"validation failed: {err}", coherent=answer.coherent)
    scores = detection_scores(truth, [i in picked for i in range(1, len(examples) + 1)])
    return LabelResult(answer.description, source, None, answer.coherent, scores.balanced_accuracy, scores.precision, scores.recall)


async def label_with_llm(features: Sequence[FeatureExamples], cfg: LabelConfig, cache_dir: Path, seed: int) -> tuple[dict[int, LabelResult], Stats]:
    stats = Stats()
    # max_retries=0: the client's own retries would hide 429/5xx from our policy and its counters.
    client = openai.AsyncOpenAI(
        base_url=cfg.base_url, api_key=os.environ.get(cfg.api_key_env) or "EMPTY", max_retries=0, timeout=cfg.timeout_s
    )
    async with client:
        asker = Asker(client, cfg, cache_dir, stats, random.Random(seed))
        results = await asyncio.gather(*(_llm_label_one(asker, f, seed) for f in features))
    return {f.latent: r for f, r in zip(features, results)}, stats


# ---------------------------------------------------------------------------------------------
# Offline heuristic labeler

_MIN_SHARE = 0.6  # share of the examples a pattern must cover to be part of a description
_FORM_COVERAGE = 0.8  # list word forms until they cover this share of the examples...
_MAX_FORMS = 3  # ...or this many
_CONTEXT_WORDS = 3  # words on each side searched for a shared n-gram

_PUNCT_NAMES = {
    ",": "comma", ".": "period", "!": "exclamation mark", "?": "question mark", ";": "semicolon",
    ":": "colon", '"': "double quote", "'": "apostrophe", "(": "opening parenthesis",
    ")": "closing parenthesis", "-": "hyphen", "—": "em dash", "–": "en dash", "...": "ellipsis",
}
_FORM_NAMES = {"\n": "newlines", " ": "runs of spaces"}
_CLASS_PLURAL = {
    "newline": "newlines", "space": "runs of spaces", "number": "numbers",
    "punctuation": "punctuation", "capitalised": "capitalised words",
}
_CLASS_SINGULAR = {
    "newline": "a newline", "space": "a run of spaces", "number": "a number",
    "punctuation": "punctuation", "capitalised": "a capitalised word",
}


def char_class(word: str) -> str:
    stripped = word.strip()
    if not stripped:
        return "newline" if "\n" in word else "space"
    if all(unicodedata.category(ch).startswith("N") for ch in stripped):
        return "number"
    if not any(ch.isalnum() for ch in stripped):
        return "punctuation"
    return "capitalised" if stripped[0].isupper() else "word"


def _context_words(text: str, side: str) -> list[str]:
    words = [normalize_form(w) for w in split_words(text) if w.strip()]
    return words[-_CONTEXT_WORDS:] if side == "left" else words[:_CONTEXT_WORDS]


def _ngrams(words: Sequence[str]) -> set[tuple[str, ...]]:
    # Punctuation-only n-grams ('"', ',') are better said by the neighbour's class.
    return {
        tuple(words[i : i + n])
        for n in (1, 2)
        for i in range(len(words) - n + 1)
        if any(char_class(w) != "punctuation" for w in words[i : i + n])
    }


def _neighbour_class(text: str, side: str) -> str | None:
    words = split_words(text)
    if not words:
        return None
    return char_class(words[-1] if side == "left" else words[0])


@dataclass(frozen=True)
class Cue:
    """What the context on one side shares: an n-gram among the nearest words, or the adjacent word's class."""

    ngram: tuple[str, ...] = ()
    word_class: str | None = None


@dataclass(frozen=True)
class HeuristicRule:
    forms: tuple[str, ...]  # the word is one of these normalized forms (empty: any word of `word_class`)
    word_class: str | None
    left: Cue | None
    right: Cue | None
    coherent: bool


def _side_cue(texts: Sequence[str], side: str) -> Cue | None:
    n = len(texts)
    candidates: list[tuple[float, int, int, tuple[str, ...], Cue]] = []
    grams = Counter(g for t in texts for g in _ngrams(_context_words(t, side)))
    for gram, count in grams.items():
        # Sort key: coverage first; on ties an n-gram beats a class, a longer n-gram a shorter one.
        candidates.append((-count / n, 0, -len(gram), gram, Cue(ngram=gram)))
    classes = Counter(c for t in texts if (c := _neighbour_class(t, side)) not in (None, "word"))
    for cls, count in classes.items():
        candidates.append((-count / n, 1, 0, (cls,), Cue(word_class=cls)))
    if not candidates:
        return None
    best = min(candidates, key=lambda c: c[:4])
    return best[4] if -best[0] >= _MIN_SHARE else None


def heuristic_rule(train: Sequence[Context]) -> HeuristicRule:
    n = len(train)
    ranked = sorted(Counter(normalize_form(c.word) for c in train).items(), key=lambda kv: (-kv[1], kv[0]))
    forms: list[str] = []
    covered = 0
    for form, count in ranked[:_MAX_FORMS]:
        if count < min(2, n):
            break  # a form seen once is no pattern, however many such forms add up
        forms.append(form)
        covered += count
        if covered / n >= _FORM_COVERAGE:
            break
    left = _side_cue([c.left for c in train], "left")
    right = _side_cue([c.right for c in train], "right")
    if covered / n >= _MIN_SHARE:
        return HeuristicRule(tuple(forms), None, left, right, coherent=True)
    cls, count = min(Counter(char_class(c.word) for c in train).items(), key=lambda kv: (-kv[1], kv[0]))
    if cls != "word" and count / n >= _MIN_SHARE:
        return HeuristicRule((), cls, left, right, coherent=True)
    return HeuristicRule(tuple(f for f, _ in ranked[:_MAX_FORMS]), None, left, right, coherent=False)


def _show_form(form: str) -> str:
    if form in _FORM_NAMES:
        return _FORM_NAMES[form]
    if form in _PUNCT_NAMES:
        return f"'{form}' ({_PUNCT_NAMES[form]})"
    return f"'{form}'"


def _show_cue(cue: Cue, side: str) -> str:
    what = f"'{' '.join(cue.ngram)}'" if cue.ngram else _CLASS_SINGULAR[cue.word_class]
    return f"after {what}" if side == "left" else f"followed by {what}"


def describe(rule: HeuristicRule) -> str:
    if rule.forms:
        shown = [_show_form(f) for f in rule.forms]
        subject = " or ".join(shown) if rule.coherent else "mixed words such as " + ", ".join(shown)
    else:
        subject = _CLASS_PLURAL[rule.word_class]
    cues = [_show_cue(cue, side) for cue, side in ((rule.left, "left"), (rule.right, "right")) if cue]
    return " ".join([subject, *cues]) if len(cues) < 2 else f"{subject} {cues[0]} and {cues[1]}"


def _cue_matches(cue: Cue, text: str, side: str) -> bool:
    if cue.ngram:
        return cue.ngram in _ngrams(_context_words(text, side))
    return _neighbour_class(text, side) == cue.word_class


def rule_matches(rule: HeuristicRule, ctx: Context) -> bool:
    """The deterministic judge of a heuristic description: every part of the rule must hold."""
    if rule.forms and normalize_form(ctx.word) not in rule.forms:
        return False
    if not rule.forms and char_class(ctx.word) != rule.word_class:
        return False
    return all(_cue_matches(cue, text, side) for cue, text, side in ((rule.left, ctx.left, "left"), (rule.right, ctx.right, "right")) if cue)


def context_matches(rule: Rule, ctx: Context) -> bool:
    """Whether a context rule holds for a shown context (its word and the words to its left)."""
    left = split_words(ctx.left)
    attrs = word_attributes([[*left[-2:], ctx.word]])
    return bool(rule.mask(attrs)[-1])


def rule_label(feature: FeatureExamples, seed: int) -> LabelResult:
    """The context rules of the latent's findings, said in words ("... or ...") and checked on the
    validation contexts: a context fits the label when any of the rules holds for it."""
    examples, truth = validation_set(feature, seed)
    scores = detection_scores(truth, [any(context_matches(r, c) for r in feature.rules) for c in examples])
    label = " or ".join(r.describe() for r in feature.rules)
    return LabelResult(label, "rule", None, True, scores.balanced_accuracy, scores.precision, scores.recall)


def heuristic_label(feature: FeatureExamples, seed: int) -> LabelResult:
    if not feature.train:
        return LabelResult(None, "unlabeled", reason="no train contexts in contexts.parquet")
    if feature.rules:
        return rule_label(feature, seed)
    rule = heuristic_rule(feature.train)
    examples, truth = validation_set(feature, seed)
    scores = detection_scores(truth, [rule_matches(rule, c) for c in examples])
    return LabelResult(describe(rule), "heuristic", None, rule.coherent, scores.balanced_accuracy, scores.precision, scores.recall)


# ---------------------------------------------------------------------------------------------
# Stage


def with_labels(features: pa.Table, results: Mapping[int, LabelResult]) -> pa.Table:
    """Replace the label columns (so re-running is idempotent); a latent's label goes on all its pair rows."""
    table = features.drop_columns([c for c in LABEL_COLUMNS if c in features.column_names])
    rows = [results.get(latent) for latent in features["latent"].to_pylist()]
    for name, (attr, type_) in LABEL_COLUMNS.items():
        table = table.append_column(pa.field(name, type_), pa.array([getattr(r, attr) if r else None for r in rows], type_))
    return table


def _print_prompts(features: Sequence[FeatureExamples]) -> None:
    for f in features:
        print(f"=== latent {f.latent}: label prompt ===")
        for message in label_messages(f):
            print(f"[{message['role']}]\n{message['content']}")
    print("(detection prompts are built from the labels, so a dry run cannot show them)")


def run_label(cfg: Config) -> dict:
    features_path, contexts_path = cfg.out / "features.parquet", cfg.out / "contexts.parquet"
    features = read_table(features_path)
    require_columns(features, FEATURE_COLUMNS, str(features_path))
    contexts = read_table(contexts_path)
    require_columns(contexts, CONTEXT_COLUMNS, str(contexts_path))
    lc = cfg.label
    latents = select_latents(features, lc.only_kept)
    findings_path = cfg.out / "findings.parquet"
    findings = read_table(findings_path) if findings_path.exists() else None
    examples = feature_examples(features, contexts, latents, lc.examples, lc.validation_examples, findings)
    labeler = lc.resolved_labeler()

    if labeler == "llm":
        if not (lc.base_url and lc.model):
            raise ConfigError("label.labeler is 'llm' but label.base_url and label.model are not both set")
        if lc.dry_run:
            _print_prompts(examples)
            return {"dry_run": True, "labeler": "llm", "model": lc.model, "features": len(examples), "requests": 0}
        results, stats = asyncio.run(label_with_llm(examples, lc, cfg.out / "labels" / "cache", cfg.seed))
    else:
        results, stats = {f.latent: heuristic_label(f, cfg.seed) for f in examples}, Stats()

    atomic_write_table(features_path, with_labels(features, results))
    cost = stats.prompt_tokens / 1000 * lc.prompt_cost_per_1k + stats.completion_tokens / 1000 * lc.completion_cost_per_1k
    summary = {
        "labeler": labeler,
        "model": lc.model if labeler == "llm" else None,
        "prompt_version": PROMPT_VERSION,
        "features": len(examples),
        "labeled": sum(r.source != "unlabeled" for r in results.values()),
        "unlabeled": sum(r.source == "unlabeled" for r in results.values()),
        **asdict(stats),
        "cost": round(cost, 6),
    }
    atomic_write_json(cfg.out / "labels" / "labels.json", summary)
    return summary
