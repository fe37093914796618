"""Describe features in plain words and check each description by detection.

Two labelers write the same columns of `labels.parquet` (one row per features.parquet row,
joined back by `labeled_features`):

- `llm`: any OpenAI-compatible chat endpoint reads a feature's train-split contexts and says
  whether they form one group and what it is, in one sentence.
- `heuristic`: an offline, deterministic rule extracted from the same contexts (the latent's
  context rules, or dominant word forms, a shared neighbouring n-gram, the neighbour's class).

Every description is then scored on examples the labeler never saw (delphi-style detection):
the feature's holdout top activations are the positives, the negatives this stage draws
(holdout words where the latent is inactive, `labels/negatives.parquet`) the negatives, and a
judge (the LLM, or the heuristic rule itself) says which ones fit. Balanced accuracy, precision
and recall of that judgement say how much to trust the label.

LLM requests are cached on disk as soon as their answer arrives, so a re-run (or a run after
a crash) never pays twice for the same question.

Modules: `prompts/` (the prompt texts), `messages` (prompts filled in, replies parsed),
`client` (the asker: cache, retries), `llm` and `heuristic` (the labelers), `scoring`
(detection), `negatives`, `table` (labels.parquet and its reader), `stage` (`run_label`).
"""

from bbox_sae.labeling.heuristic import context_matches, describe, heuristic_label, heuristic_rule, rule_matches
from bbox_sae.labeling.messages import MalformedReply, parse_detection_reply, parse_label_reply
from bbox_sae.labeling.records import Context, FeatureExamples, LabelResult
from bbox_sae.labeling.scoring import detection_scores
from bbox_sae.labeling.stage import run_label
from bbox_sae.labeling.table import LABEL_COLUMNS, labeled_features

__all__ = [
    "Context",
    "FeatureExamples",
    "LABEL_COLUMNS",
    "LabelResult",
    "MalformedReply",
    "context_matches",
    "describe",
    "detection_scores",
    "heuristic_label",
    "heuristic_rule",
    "labeled_features",
    "parse_detection_reply",
    "parse_label_reply",
    "rule_matches",
    "run_label",
]
