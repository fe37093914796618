"""Evidence: planted-difference recovery, the null pair, ablations, coherence and stability.

Modules: `planting` (the rules and model B's planted log-probs), `recovery` (which rules a run's
findings recover, and the false discoveries), `runs` (model B planted into a run whose every
stage runs through the stage table; its variants are `bbox_sae.variants`), `planted` (`bbox eval planted`), `ablation` (`bbox eval
ablation`), `coherence` (`bbox eval coherence`, stability across seeds), `printing` (the tables).
"""

from bbox_sae.evaluation.ablation import ablation_variants, run_ablation
from bbox_sae.evaluation.coherence import coherence_summary, run_coherence, stability
from bbox_sae.evaluation.planted import run_planted
from bbox_sae.evaluation.planting import PlantedRule, load_rules, planted_logprobs, planted_rules_path, rule_masks
from bbox_sae.evaluation.printing import print_planted
from bbox_sae.evaluation.recovery import row_attributes, rows_to_words, score_recovery

__all__ = [
    "PlantedRule",
    "ablation_variants",
    "coherence_summary",
    "load_rules",
    "planted_logprobs",
    "planted_rules_path",
    "print_planted",
    "row_attributes",
    "rows_to_words",
    "rule_masks",
    "run_ablation",
    "run_coherence",
    "run_planted",
    "score_recovery",
    "stability",
]
