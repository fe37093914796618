"""The LLM labeler: one label request per feature, then a detection request that scores it."""

from __future__ import annotations

import asyncio
import logging
import os
import random
from pathlib import Path
from typing import Sequence

from bbox_sae.config import LabelConfig
from bbox_sae.labeling.client import Asker, RequestFailed, Stats, open_client
from bbox_sae.labeling.messages import detection_messages, label_messages, parse_detection_reply, parse_label_reply
from bbox_sae.labeling.records import FeatureExamples, LabelResult, validation_set
from bbox_sae.labeling.scoring import detection_scores

log = logging.getLogger(__name__)


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
    async with open_client(cfg, os.environ.get(cfg.api_key_env)) as client:
        asker = Asker(client, cfg, cache_dir, stats, random.Random(seed))
        results = await asyncio.gather(*(_llm_label_one(asker, f, seed) for f in features))
    return {f.latent: r for f, r in zip(features, results)}, stats


def print_prompts(features: Sequence[FeatureExamples]) -> None:
    for f in features:
        print(f"=== latent {f.latent}: label prompt ===")
        for message in label_messages(f):
            print(f"[{message['role']}]\n{message['content']}")
    print("(detection prompts are built from the labels, so a dry run cannot show them)")
