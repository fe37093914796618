"""Feature extraction: latents become findings ("model A beats B on this group of words").

For every latent: its top-N activations on the train split and, apart, on the holdout split
(streamed), ranked by the activation on the full rows (`features.ranking: full`, the default), or on
*Δ-blind* rows (`blind`: the models' performance columns made equal, so the ranking never sees which
model won; `test: top` needs it). On the top words after the paper's percentile rule,
Δ = log p_A − log p_B statistics on train (median, mean, median Δp, sign consistency, bootstrap CI) select; the same statistics on the holdout top words
test (Wilcoxon p, BH q across latents, same sign and at least half the size). A latent passing
both gets its best context rule (`features.rules`), whose held-out F1 measures coherence; `kept`
latents (optionally with `min_rule_f1`) are grouped into findings (`features.findings`). With the
default `test: rule`, latents propose context rules and their own groups of words instead, each
tested on every held-out word it covers.

Modules: `source` (the rows, their words and the encoder, opened once per command), `encoders`
(SAE / baselines, Δ-blind ranking, the chunked pass over rows), `activations` (top activations,
firing), `feature_table` (Δ statistics and filters per latent), `significance` (the tests
themselves), `rules` (the rule space), `findings` (proposing rules, grouping latents),
`grouping` (the strategies' frozen inputs, and `test: top`), `candidates` and `tested_findings`
(`test: rule`: what latents propose, its test, the findings), `latent_sets` (a latent's groups
of words), `word_sets` (a group said in words, and its judge), `contexts` (text around a row's
word), `domains`, `stage` (`run_features`).
"""

from bbox_sae.features.activations import TopActivations, firing, top_activations, top_words
from bbox_sae.features.contexts import contexts_table, cut_context, word_attributes_by_position, words_by_row
from bbox_sae.features.encoders import Encoder, blind_rows, encode_rows, make_encoder, ranking_encoder
from bbox_sae.features.source import FeatureSource, Matrix, feature_source, open_rows
from bbox_sae.features.stage import run_features
from bbox_sae.schemas import FEATURE_SCHEMA, FINDING_SCHEMA, TESTED_RULE_SCHEMA

__all__ = [
    "Encoder",
    "FEATURE_SCHEMA",
    "FINDING_SCHEMA",
    "FeatureSource",
    "Matrix",
    "TESTED_RULE_SCHEMA",
    "TopActivations",
    "blind_rows",
    "contexts_table",
    "cut_context",
    "encode_rows",
    "feature_source",
    "firing",
    "make_encoder",
    "open_rows",
    "ranking_encoder",
    "run_features",
    "top_activations",
    "top_words",
    "word_attributes_by_position",
    "words_by_row",
]
