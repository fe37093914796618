"""bbox-sae: find where one language model beats another, word by word (BehaviorBox).

One folder per pipeline stage, in the order `bbox run` runs them (`stages.py` is the registry
that runs each one, records it in `manifest.json` and decides what is up to date):

    corpus/      ingest: corpus files → documents and their canonical words (character spans)
    scoring/     score: each model's per-word log-probs (in process, GGUF, an OpenAI-compatible
                 server, or the user's own Parquet), tokens aligned to words by character offsets
    embedding/   embed: a contextual encoder's vector per word
    build/       build: the performance-aware matrix [context vector, the models' performance]
    train/       train: a TopK or BatchTopK SAE with sae-lens; dictionary-size sweeps
    features/    features: latents propose findings (context rules, latents' word sets), tested
                 on held-out words; the feature and finding tables
    labeling/    label: a statement for every latent and finding, scored on held-out examples
    report/      report: HTML feature browser, report.md, W&B tables
    evaluation/  `bbox eval`: planted differences and their recovery, stability across seeds

Shared by all: `config` (the one typed schema), `layout` (every artifact path), `artifacts`
(atomic writes, sharded tables), `schemas` (table schemas), `errors`, `stages`, `pipeline`
(`bbox run` and its lock), `cli`, `models` (devices, dtypes, packaged weights), `retry`,
`tracking` (W&B).
"""

__version__ = "0.1.0"
