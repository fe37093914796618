"""Chat messages built from the prompt files in `prompts/`, and strict parsing of the replies."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from string import Template

from bbox_sae.labeling.records import Comparison, Context, FeatureExamples
from bbox_sae.retry import MalformedReply

# Bump when a prompt changes: it is part of every cache key, so old answers are not reused.
PROMPT_VERSION = "2"


@cache
def prompt(name: str) -> Template:
    """`prompts/<name>.txt`, shipped as package data; `$field`s are filled by the callers."""
    return Template(files("bbox_sae.labeling").joinpath("prompts", f"{name}.txt").read_text(encoding="utf-8").rstrip("\n"))


# A label is a phrase. One longer than this is a server gone wrong, not a better label: a 30 MB
# description made a 54 MB report.html and a final summary that took minutes to print.
MAX_LABEL_CHARS = 300


@dataclass(frozen=True)
class LabelAnswer:
    coherent: bool
    description: str
    cut_from: int | None = None  # the description's length, when it was cut to MAX_LABEL_CHARS


def _visible(text: str) -> str:
    # Raw newlines would break the one-example-per-line layout the judge answers by number.
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def show_context(ctx: Context) -> str:
    return f"{_visible(ctx.left)}<<{_visible(ctx.word)}>>{_visible(ctx.right)}"


def _numbered(contexts: Sequence[Context]) -> str:
    return "\n".join(f"{i}. {show_context(c)}" for i, c in enumerate(contexts, 1))


def _with_probs(ctx: Context) -> str:
    probs = ", ".join(f"p({model})={p:.2f}" for model, p in ctx.probs)
    return f"{show_context(ctx)}   [{probs}]" if probs else show_context(ctx)


def comparison_line(c: Comparison) -> str:
    if c.better_model is None or c.median_dlogp is None:
        return f"- {c.model_a} and {c.model_b} predict these words equally well."
    worse = c.model_b if c.better_model == c.model_a else c.model_a
    return f"- {c.better_model} predicts these words better than {worse} (median log-probability difference {abs(c.median_dlogp):.2f} nats)."


def _messages(user: str) -> list[dict]:
    return [{"role": "system", "content": prompt("system").template}, {"role": "user", "content": user}]


def label_messages(feature: FeatureExamples, hint: str | None = None) -> list[dict]:
    """The label request: activating excerpts with both models' probabilities, counter-examples
    of the same word forms (delphi's contrastive explainer), and the offline label as a hint."""
    comparisons = "\n".join(comparison_line(c) for c in feature.comparisons)
    examples = "\n".join(f"{i}. {_with_probs(c)}" for i, c in enumerate(feature.train, 1))
    blocks = []
    if feature.contrast:
        blocks.append(prompt("contrast").substitute(examples="\n".join(f"- {show_context(c)}" for c in feature.contrast)))
    if hint:
        blocks.append(prompt("hint").substitute(rule=hint))
    user = prompt("label").substitute(
        comparisons=comparisons, examples_note=prompt("examples_note").template, examples=examples, extra="".join(f"\n{b}\n" for b in blocks)
    )
    return _messages(user)


def detection_messages(description: str, examples: Sequence[Context]) -> list[dict]:
    note = prompt("examples_note").template
    return _messages(prompt("detection").substitute(description=description, examples_note=note, examples=_numbered(examples)))


def fuzz_messages(description: str, examples: Sequence[Context]) -> list[dict]:
    note = prompt("examples_note").template
    return _messages(prompt("fuzz").substitute(description=description, examples_note=note, examples=_numbered(examples)))


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
    description = " ".join(description.split())
    if len(description) > MAX_LABEL_CHARS:
        return LabelAnswer(coherent, description[: MAX_LABEL_CHARS - 1].rstrip() + "…", cut_from=len(description))
    return LabelAnswer(coherent, description)


def _picked_numbers(text: str, n: int, kind: str, key: str) -> frozenset[int]:
    obj = _json_payload(text)
    picked = obj.get(key) if isinstance(obj, dict) else obj
    if not isinstance(picked, list):
        raise MalformedReply(f'{kind} reply needs {{"{key}": [numbers]}}')
    bad = [m for m in picked if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= n]
    if bad:
        raise MalformedReply(f"{kind} reply names {bad[:5]}, not example numbers 1..{n}")
    return frozenset(picked)


def parse_detection_reply(text: str, n: int) -> frozenset[int]:
    """The 1-based example numbers the judge picked as fitting the description."""
    return _picked_numbers(text, n, "detection", "matches")


def parse_fuzz_reply(text: str, n: int) -> frozenset[int]:
    """The 1-based example numbers the judge says are marked correctly."""
    return _picked_numbers(text, n, "fuzzing", "correct")
