"""bbox-sae: find where one language model beats another, word by word (BehaviorBox).

One folder per pipeline stage, in the order `bbox run` runs them (`stages.py` is the table of
stages: what each reads, takes and writes; `bookkeeping.py` runs one, records it in `manifest.json`
and decides what is up to date):

    corpus/      ingest: corpus files → documents and their canonical words (character spans)
    scoring/     score: each model's per-word log-probs (in process, GGUF, an OpenAI-compatible
                 server, or the user's own Parquet), tokens aligned to words by character offsets
    embedding/   embed: a contextual encoder's vector per word
    build/       build: the performance-aware matrix [context vector, the models' performance]
    train/       train: a TopK or BatchTopK SAE with sae-lens; the sweep files
    features/    features: latents propose findings (context rules, latents' word sets), tested
                 on held-out words; the feature and finding tables
    labeling/    label: a statement for every latent and finding, scored on held-out examples
    report/      report: HTML feature browser, report.md, W&B tables
    evaluation/  `bbox eval`: planted differences and their recovery, stability across seeds

Below the stages: `config` (the one typed schema), `layout` (every artifact path), `artifacts`
(atomic writes, sharded tables), `schemas` (table schemas), `manifest` (the typed records of a
run's finished stages), `bookkeeping` (stage keys, running and recording a stage, the run lock),
`errors`, `models` (devices, dtypes, packaged weights), `retry`, `tracking` (W&B). Above them:
`stages` (the table), `pipeline` (`bbox run`), `variants` (runs made from a run: baselines, the
evaluation's null seeds and ablation), `sweep` (`bbox sweep`), `feasibility` (memory a config
would need), `prepare` (`make setup`'s model conversion), `cli`.
"""

__version__ = "0.1.0"
