"""The LLM labeler (delphi-grade): one label request per feature, shown activating excerpts with
both models' probabilities, counter-examples of the same word forms and the offline label as a
hint; then the label is scored by detection and by fuzzing, and the better-scoring of the LLM's
label and the offline one is kept."""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from tqdm.auto import tqdm

from bbox_sae.config import LabelConfig
from bbox_sae.errors import printable
from bbox_sae.labeling.client import Asker, BudgetSpent, RequestFailed, Stats, open_client
from bbox_sae.labeling.heuristic import heuristic_label
from bbox_sae.labeling.messages import (
    MAX_LABEL_CHARS,
    detection_messages,
    fuzz_messages,
    label_messages,
    parse_detection_reply,
    parse_fuzz_reply,
    parse_label_reply,
)
from bbox_sae.labeling.records import Context, FeatureExamples, LabelResult, validation_set
from bbox_sae.labeling.scoring import detection_scores, fuzz_set

log = logging.getLogger(__name__)

# (examples, seed, fuzz examples) -> the offline label, judged by itself
OfflineLabeler = Callable[[FeatureExamples, int, int], LabelResult]


async def _judge(asker: Asker, kind: str, messages: list[dict], examples: Sequence[Context], truth: Sequence[bool]):
    parse = parse_detection_reply if kind == "detect" else parse_fuzz_reply
    picked = await asker.ask(kind, messages, lambda text: parse(text, len(examples)))
    return detection_scores(truth, [i in picked for i in range(1, len(examples) + 1)])


async def _scored(asker: Asker, feature: FeatureExamples, description: str, coherent: bool, seed: int, note: str | None = None) -> LabelResult:
    """The description judged by detection, then by fuzzing; a judgement whose request failed ends
    the scoring with its reason (else the reason is `note`)."""
    result = LabelResult(description, f"llm:{asker.cfg.model}", reason=note, coherent=coherent)
    examples, truth = validation_set(feature, seed)
    fuzzed, correct = fuzz_set(feature, asker.cfg.fuzz_examples, seed)
    judgements = [("detect", detection_messages, examples, truth, "validated", "validation"), ("fuzz", fuzz_messages, fuzzed, correct, "fuzzed", "fuzzing")]
    for kind, messages, shown, expected, done, step in judgements:
        if not shown:
            continue
        try:
            scores = await _judge(asker, kind, messages(description, shown), shown, expected)
        except RequestFailed as err:
            log.warning("latent %d not %s: %s", feature.latent, done, err)
            return replace(result, reason=f"{step} failed: {err}")
        if kind == "detect":
            result = replace(result, score=scores.balanced_accuracy, precision=scores.precision, recall=scores.recall)
        else:
            result = replace(result, fuzz=scores.balanced_accuracy)
    return result


def _better(llm: LabelResult, offline: LabelResult) -> LabelResult:
    """The offline label when it scores higher on detection (a tie keeps the LLM's, which read it)."""
    if offline.label is None or offline.score is None or (llm.score is not None and llm.score >= offline.score):
        return llm
    why = f"{offline.source} label scored higher than {llm.source}'s (detection {offline.score:.2f} vs "
    why += f"{'n/a' if llm.score is None else format(llm.score, '.2f')}): {llm.label}"
    return replace(offline, reason=why)


async def _llm_label_one(asker: Asker, feature: FeatureExamples, seed: int, offline_label: OfflineLabeler) -> LabelResult:
    if not feature.train:
        return LabelResult(None, "unlabeled", reason="no train contexts")
    offline = offline_label(feature, seed, asker.cfg.fuzz_examples)
    try:
        answer = await asker.ask("label", label_messages(feature, offline.label), parse_label_reply)
    except RequestFailed as err:
        if not isinstance(err, BudgetSpent):
            stats = asker.stats
            stats.labels_failed += 1
            stats.label_errors[str(err)] = stats.label_errors.get(str(err), 0) + 1
        log.info("latent %d: llm:%s gave no label (%s); the offline one is kept", feature.latent, asker.cfg.model, err)
        # The offline label keeps its own source (`rule` / `heuristic`), so tables show which labeler said it.
        return replace(offline, reason=f"llm:{asker.cfg.model} gave no label, the offline one is kept: {err}")
    stats = asker.stats
    stats.labels_answered += 1
    note = None
    if answer.cut_from is not None:
        stats.labels_cut += 1
        note = f"llm:{asker.cfg.model}'s label was {answer.cut_from:,} characters, cut to {MAX_LABEL_CHARS}"
        if stats.labels_cut == 1:
            log.warning("%s (latent %d; labels.json: labels_cut counts them)", note, feature.latent)
    llm = await _scored(asker, feature, answer.description, answer.coherent, seed, note)
    if llm.score is None and offline.score is not None:
        # Its judge's replies failed or were malformed: a statement nobody checked never
        # replaces one that was.
        why = llm.reason or "no held-out examples to judge it on"
        return replace(offline, reason=f"{llm.source}'s label was not validated ({why}), the offline one is kept: {llm.label}")
    return _better(llm, offline)


async def label_with_llm(
    features: Sequence[FeatureExamples],
    cfg: LabelConfig,
    cache_dir: Path,
    seed: int,
    offline_label: OfflineLabeler = heuristic_label,
    stats: Stats | None = None,
    what: str = "latent",
) -> tuple[dict[int, LabelResult], Stats]:
    """LLM labels, each kept only where it detects at least as well as `offline_label`'s (a
    latent's rule or heuristic label, or a finding's offline statement), which is the hint too.
    `stats` carries the spending (and `label.max_tokens_total`) over from an earlier call. A
    progress bar counts the `what`s (latents, findings) whose label and scoring are done."""
    stats = stats if stats is not None else Stats()
    async with open_client(cfg, os.environ.get(cfg.api_key_env)) as client:
        asker = Asker(client, cfg, cache_dir, stats, random.Random(seed))
        with tqdm(total=len(features), desc=f"label: {what}s ({cfg.model})", unit=what, leave=False) as bar:

            async def one(feature: FeatureExamples) -> LabelResult:
                result = await _llm_label_one(asker, feature, seed, offline_label)
                bar.update()
                return result

            results = await asyncio.gather(*(one(f) for f in features))
    return {f.latent: r for f, r in zip(features, results)}, stats


def print_prompts(features: Sequence[FeatureExamples], seed: int, n_fuzz: int) -> None:
    for f in features:
        print(f"=== latent {f.latent}: label prompt ===")
        for message in label_messages(f, heuristic_label(f, seed, n_fuzz).label):
            # The prompt quotes corpus text: its line breaks stay, its terminal escapes do not.
            print(f"[{message['role']}]\n{printable(message['content'], keep=chr(10))}")
    print("(detection and fuzzing prompts are built from the labels, so a dry run cannot show them)")
