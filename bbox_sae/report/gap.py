"""The gap account: how far apart a pair's models are on held-out words, how much of that the
findings carry, and where the rest lives (by word frequency, kind of word, place and domain).

Held-out words are the build index's `holdout` rows: the words the features stage tests findings
on (`features.source.open_rows`). Δ is log p(model_a) − log p(model_b) per word, the findings'
sign. A model's *advantage* is the sum of |Δ| over the words it predicts better; a finding's
share of its winner's advantage is the sum of its words' Δ (signed towards the winner) over that
advantage. Shares add: findings with no word in common sum to their union's share, and the
union's share and what is left make 100%. A breakdown's slices partition the words, so their
shares of the net gap (their summed Δ over all words' summed Δ) add to 100% as well. Confidence
intervals resample whole documents: the words of one text are not independent draws.

The math is pure functions over arrays; `load_held_out` and `word_facets` read the run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bbox_sae.artifacts import read_table
from bbox_sae.features.context import CLOSERS, FLAGS, OPENING_WORDS, RARE_COUNT, SENTENCE_ENDS
from bbox_sae.features.domains import NO_DOMAIN
from bbox_sae.features.rules import FUNCTION_CLASSES, normalize_form, word_attributes, word_class
from bbox_sae.layout import RunLayout, logprob_column

BOOTSTRAP = 1000  # document resamples per confidence interval
SEED = 0  # fixed: the report's numbers are the same on every re-run of the same tables
CHUNK_CELLS = 1 << 22  # resample weights held at once (replicates × documents)
CARRY_SHARE = 0.5  # one domain giving more than this share of a finding's summed Δ carries it

FUNCTION_WORDS = frozenset().union(*(members for _, members in FUNCTION_CLASSES))
LAYOUT_CLASSES = frozenset({"blank", "newline", "space"})
KINDS = ("function", "content", "capitalised", "number", "punctuation", "layout")
PLACES = (f"a text's opening (first {OPENING_WORDS} words)", "after a blank line", "at a line start", "at a sentence start (mid-line)", "elsewhere")
AXES = {"frequency": "word frequency (corpus count of its form)", "kind": "kind of word", "place": "place", "domain": "domain"}


# ---------------------------------------------------------------- the math


def perplexity(logprob: np.ndarray) -> float:
    return float(np.exp(-logprob.mean()))


def group_means(values: np.ndarray, doc: np.ndarray, group: np.ndarray, n_groups: int, n_docs: int, n_boot: int = BOOTSTRAP, seed: int = SEED):
    """Per group: the mean of `values`, and a 95% percentile interval of it over `n_boot`
    resamples of whole documents (every group's mean taken on the same resample). Returns
    (count, documents, mean, low, high) arrays of length `n_groups`; a group without words has a
    NaN mean, and one whose words lie in fewer than two documents NaN bounds: resampling a single
    document always gives back its own mean, an interval of width 0 that would claim certainty."""
    key = doc.astype(np.int64) * n_groups + group
    sums = np.bincount(key, weights=values, minlength=n_docs * n_groups).reshape(n_docs, n_groups)
    counts = np.bincount(key, minlength=n_docs * n_groups).reshape(n_docs, n_groups).astype(np.float64)
    total = counts.sum(0)
    documents = (counts > 0).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = sums.sum(0) / total
    rng = np.random.default_rng(seed)
    chunk = max(1, CHUNK_CELLS // max(n_docs, 1))
    replicates = []
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        draws = rng.integers(0, n_docs, size=(k, n_docs)) + np.arange(k)[:, None] * n_docs
        weights = np.bincount(draws.ravel(), minlength=k * n_docs).reshape(k, n_docs).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            replicates.append((weights @ sums) / (weights @ counts))
    boot = np.concatenate(replicates)
    low, high = np.full(n_groups, np.nan), np.full(n_groups, np.nan)
    spread = documents >= 2
    if spread.any():
        low[spread], high[spread] = np.nanpercentile(boot[:, spread], [2.5, 97.5], axis=0)
    return total.astype(np.int64), documents, mean, low, high


def bound(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def advantage(delta: np.ndarray, sign: int) -> float:
    """The sum of |Δ| over the words the model of `sign` (+1: model_a, −1: model_b) predicts better."""
    return float(np.clip(sign * delta, 0.0, None).sum())


def share_of(delta: np.ndarray, positions: np.ndarray, sign: int, total: float) -> float | None:
    """The words at `positions`' summed Δ, signed towards the model of `sign`, over `total`."""
    return float(sign * delta[positions].sum() / total) if total > 0 else None


def frequency_bands(counts: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Each word's band by its form's corpus count, rare to common: seen at most `RARE_COUNT`
    times (the rule grammar's rare form), then decades up to the commonest form."""
    top = int(counts.max()) if len(counts) else RARE_COUNT
    edges = [RARE_COUNT, 10]
    while edges[-1] < top:
        edges.append(edges[-1] * 10)
    names = [f"seen 1–{RARE_COUNT} times"] + [f"seen {lo + 1:,}–{hi:,} times" for lo, hi in zip(edges, edges[1:])]
    return np.searchsorted(edges, counts, side="left"), names


def word_kind(word: str) -> str:
    """One of KINDS. A function word is one whatever its case ('The'); a capitalised word that is
    none is a name or a content word opening a sentence or a verse line."""
    cls = word_class(word)
    if cls in LAYOUT_CLASSES:
        return "layout"
    if cls in ("punctuation", "number"):
        return cls
    if normalize_form(word) in FUNCTION_WORDS:
        return "function"
    return "capitalised" if cls in ("capitalised", "allcaps") else "content"


def sentence_starts(words: list[str]) -> np.ndarray:
    """Whether each word of one document (in order) is the first word with a letter or digit of
    its sentence; sentences end as `context.document_flags` ends them (at '.', '?' or '!', before
    closing brackets and quotes, or at a blank line)."""
    out = np.zeros(len(words), dtype=bool)
    at_start = True
    for i, raw in enumerate(words):
        text = raw.strip()
        if at_start and any(ch.isalnum() for ch in text):
            out[i], at_start = True, False
        if text.rstrip(CLOSERS)[-1:] in SENTENCE_ENDS or raw.count("\n") > 1:
            at_start = True
    return out


def place_codes(opening: np.ndarray, after_blank: np.ndarray, line_start: np.ndarray, sentence_start: np.ndarray) -> np.ndarray:
    """Each word's place, an index into PLACES: the first that holds, so the places partition the words."""
    return np.select([opening, after_blank, line_start, sentence_start], [0, 1, 2, 3], default=4)


# ---------------------------------------------------------------- the account


@dataclass(frozen=True)
class FindingShare:
    finding: int
    better_model: str
    words: int  # its held-out words
    dlogp_sum: float  # their summed Δ
    share: float | None  # of its winner's advantage


@dataclass(frozen=True)
class WinnerShare:
    """One model's advantage, and how much of it its findings carry together."""

    model: str
    words_better: int
    advantage: float
    findings: int
    union_words: int
    union_share: float | None  # its findings' words, each counted once

    @property
    def left(self) -> float | None:
        return None if self.union_share is None else 1.0 - self.union_share


@dataclass(frozen=True)
class Slice:
    """The held-out words of one band, kind, place or domain."""

    axis: str
    name: str
    words: int
    documents: int
    mean_dlogp: float
    ci_low: float | None  # None: its words lie in one document
    ci_high: float | None
    gap_share: float | None  # its summed Δ over the net gap


@dataclass(frozen=True)
class FindingDomain:
    domain: str
    words: int
    median_dlogp: float
    share: float | None  # of the finding's summed Δ
    holds: bool  # its median has the finding's sign


@dataclass(frozen=True)
class FindingDomains:
    finding: int
    shown: list[FindingDomain]  # domains with enough words, most words first
    other_domains: int  # domains with too few of its words to say
    carried_by: str | None  # the domain giving more than CARRY_SHARE of its summed Δ
    carried_share: float | None


@dataclass(frozen=True)
class GapAccount:
    model_a: str
    model_b: str
    words: int
    documents: int
    perplexity: dict[str, float]
    mean_dlogp: float
    ci_low: float | None
    ci_high: float | None
    share_a_better: float
    net: float  # summed Δ over the held-out words
    findings_words: int  # held-out words of any finding of the pair, each counted once
    findings_net_share: float | None  # their summed Δ over `net`
    findings: list[FindingShare]
    winners: list[WinnerShare]
    slices: list[Slice] = field(default_factory=list)
    finding_domains: dict[int, FindingDomains] = field(default_factory=dict)

    @property
    def pair(self) -> str:
        return f"{self.model_a} vs {self.model_b}"

    @property
    def overall_winner(self) -> str | None:
        return self.model_a if self.mean_dlogp > 0 else self.model_b if self.mean_dlogp < 0 else None


def gap_account(
    logprob_a: np.ndarray, logprob_b: np.ndarray, doc: np.ndarray, n_docs: int, model_a: str, model_b: str, findings: list[tuple[int, str, np.ndarray]]
) -> GapAccount:
    """The headline account of one pair. `findings`: (finding, better model, positions of its
    held-out words in these arrays) for the pair's findings."""
    delta = logprob_a - logprob_b
    _, _, mean, low, high = group_means(delta, doc, np.zeros(len(delta), dtype=np.int64), 1, n_docs)
    sign_of = {model_a: 1, model_b: -1}
    advantages = {m: advantage(delta, s) for m, s in sign_of.items()}
    shares = [
        FindingShare(f, better, len(pos), float(delta[pos].sum()), share_of(delta, pos, sign_of[better], advantages[better])) for f, better, pos in findings
    ]
    winners = []
    for model, sign in sign_of.items():
        own = [pos for _, better, pos in findings if better == model]
        union = np.unique(np.concatenate(own)) if own else np.zeros(0, dtype=np.int64)
        winners.append(
            WinnerShare(model, int((sign * delta > 0).sum()), advantages[model], len(own), len(union), share_of(delta, union, sign, advantages[model]))
        )
    every = np.unique(np.concatenate([pos for *_, pos in findings])) if findings else np.zeros(0, dtype=np.int64)
    net = float(delta.sum())
    return GapAccount(
        model_a=model_a,
        model_b=model_b,
        words=len(delta),
        documents=int(len(np.unique(doc))),
        perplexity={model_a: perplexity(logprob_a), model_b: perplexity(logprob_b)},
        mean_dlogp=float(mean[0]),
        ci_low=bound(low[0]),
        ci_high=bound(high[0]),
        share_a_better=float((delta > 0).mean()),
        net=net,
        findings_words=len(every),
        findings_net_share=float(delta[every].sum() / net) if net else None,
        findings=shares,
        winners=winners,
    )


def slices(delta: np.ndarray, doc: np.ndarray, n_docs: int, facets: dict[str, tuple[np.ndarray, list[str]]]) -> list[Slice]:
    """Where the gap lives: per axis of `facets` (axis -> (group code per word, group names)), each
    non-empty group's mean Δ, its document-resampled CI and its share of the net gap."""
    net = float(delta.sum())
    out = []
    for axis, (codes, names) in facets.items():
        count, documents, mean, low, high = group_means(delta, doc, codes, len(names), n_docs)
        sums = np.bincount(codes, weights=delta, minlength=len(names))
        for g, name in enumerate(names):
            if count[g]:
                out.append(
                    Slice(axis, name, int(count[g]), int(documents[g]), float(mean[g]), bound(low[g]), bound(high[g]), float(sums[g] / net) if net else None)
                )
    return out


def finding_domains(finding: int, delta: np.ndarray, domains: np.ndarray, sign: int, min_words: int, n_corpus_domains: int) -> FindingDomains | None:
    """One finding's held-out words (their Δ and domains) by domain: the median Δ where a domain
    has at least `min_words` of them, and the domain carrying it, if one does. None when the
    corpus has fewer than two domains (nothing to compare)."""
    if n_corpus_domains < 2 or not len(delta):
        return None
    total = float(sign * delta.sum())
    names, codes = np.unique(domains, return_inverse=True)
    sums = np.bincount(codes, weights=sign * delta, minlength=len(names))
    shares = sums / total if total > 0 else None
    rows = []
    for i, name in enumerate(names):
        d = delta[codes == i]
        if len(d) >= min_words:
            median = float(np.median(d))
            rows.append(FindingDomain(str(name), len(d), median, None if shares is None else float(shares[i]), bool(np.sign(median) == sign)))
    rows.sort(key=lambda r: (-r.words, r.domain))
    top = int(np.argmax(sums)) if shares is not None else None
    carried = top is not None and shares[top] > CARRY_SHARE
    return FindingDomains(
        finding=finding,
        shown=rows,
        other_domains=len(names) - len(rows),
        carried_by=str(names[top]) if carried else None,
        carried_share=float(shares[top]) if carried else None,
    )


# ---------------------------------------------------------------- reading the run


@dataclass(frozen=True)
class HeldOut:
    """The held-out words of a run, in build index row order."""

    rows: np.ndarray
    doc: np.ndarray  # document code per word
    n_docs: int
    doc_ids: pa.Array  # per word
    word_idx: pa.Array  # per word
    domain: np.ndarray  # per word (object; NO_DOMAIN where its document has none)
    logprob: dict[str, np.ndarray]

    def positions(self, rows: np.ndarray) -> np.ndarray:
        """Positions of the held-out build rows among `rows` (others are dropped)."""
        at = np.searchsorted(self.rows, rows)
        inside = at < len(self.rows)
        at, rows = at[inside], rows[inside]
        return at[self.rows[at] == rows]


def load_held_out(paths: RunLayout, models: list[str], domains: dict[str, str]) -> HeldOut | None:
    """The build index's held-out rows with every model's log-prob; None when the run has no build
    index or no held-out word scored by every model."""
    if not paths.index.exists():
        return None
    table = read_table(paths.index, columns=["row", "doc_id", "word_idx", "split", *(logprob_column(m) for m in models)])
    table = table.filter(pc.equal(table["split"], "holdout")).sort_by("row")
    logprob = {m: table[logprob_column(m)].to_numpy(zero_copy_only=False).astype(np.float64) for m in models}
    scored = np.logical_and.reduce([np.isfinite(v) for v in logprob.values()]) if logprob else np.zeros(table.num_rows, dtype=bool)
    if not scored.any():
        return None
    table = table.filter(pa.array(scored))
    doc_ids = table["doc_id"].combine_chunks()
    encoded = pc.dictionary_encode(doc_ids)
    doc = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    domain_of_doc = np.array([domains.get(d, NO_DOMAIN) for d in encoded.dictionary.to_pylist()], dtype=object)
    return HeldOut(
        rows=table["row"].to_numpy(),
        doc=doc,
        n_docs=len(encoded.dictionary),
        doc_ids=doc_ids,
        word_idx=table["word_idx"].combine_chunks(),
        domain=domain_of_doc[doc],
        logprob={m: v[scored] for m, v in logprob.items()},
    )


def word_facets(paths: RunLayout, held: HeldOut) -> dict[str, tuple[np.ndarray, list[str]]]:
    """Each held-out word's frequency band, kind and place (and domain, when the corpus has more
    than one), as (code per word, names). Places are read off the whole held-out documents, as
    the rules read them (`features.rules.word_attributes`)."""
    words = read_table(paths.words, columns=["doc_id", "word_idx", "word", "split"])
    encoded = pc.dictionary_encode(words["word"].combine_chunks())
    forms = [normalize_form(w) for w in encoded.dictionary.to_pylist()]
    form_counts = Counter()
    for form, n in zip(forms, np.bincount(encoded.indices.to_numpy(zero_copy_only=False), minlength=len(forms))):
        form_counts[form] += int(n)
    held_words = words.filter(pc.is_in(words["doc_id"], value_set=pc.unique(held.doc_ids)))
    # Documents are contiguous in words/ and in word order within each: what word_attributes reads.
    held_words = held_words.append_column("position", pa.array(np.arange(held_words.num_rows)))
    texts = held_words["word"].to_pylist()
    doc_col = held_words["doc_id"].to_numpy(zero_copy_only=False)
    bounds = np.flatnonzero(np.r_[True, doc_col[1:] != doc_col[:-1], True])
    docs = [texts[s:e] for s, e in zip(bounds[:-1], bounds[1:])]
    attrs = word_attributes(docs, rare=frozenset())
    sentence = np.concatenate([sentence_starts(d) for d in docs]) if docs else np.zeros(0, dtype=bool)
    places = place_codes(attrs.context[:, FLAGS.index("doc_opening")], attrs.after_blank, attrs.line_start, sentence)
    wanted = pa.table({"doc_id": held.doc_ids, "word_idx": held.word_idx, "at": pa.array(np.arange(len(held.rows)))})
    joined = wanted.join(held_words.select(["doc_id", "word_idx", "position", "word"]), keys=["doc_id", "word_idx"]).sort_by("at")
    if joined.num_rows != len(held.rows):
        raise ValueError(f"{paths.words}: {len(held.rows) - joined.num_rows} held-out word(s) of the build index are not in words/")
    position = joined["position"].to_numpy()
    # Classified once per distinct word string, not once per word.
    held_forms = pc.dictionary_encode(joined["word"].combine_chunks())
    distinct = held_forms.dictionary.to_pylist()
    of_word = held_forms.indices.to_numpy(zero_copy_only=False)
    kind_of = {k: i for i, k in enumerate(KINDS)}
    bands, band_names = frequency_bands(np.array([form_counts[normalize_form(w)] for w in distinct], dtype=np.int64)[of_word])
    facets = {
        "frequency": (bands, band_names),
        "kind": (np.array([kind_of[word_kind(w)] for w in distinct], dtype=np.int64)[of_word], list(KINDS)),
        "place": (places[position], list(PLACES)),
    }
    domain_names, domain_codes = np.unique(held.domain, return_inverse=True)
    if len(domain_names) > 1:
        facets["domain"] = (domain_codes.astype(np.int64), [str(d) for d in domain_names])
    return facets


def finding_positions(paths: RunLayout, held: HeldOut) -> dict[int, np.ndarray]:
    """Per finding, the positions of its held-out words (`finding_words.parquet`) among `held`'s."""
    if not paths.finding_words.exists():
        return {}
    words = read_table(paths.finding_words, columns=["finding", "split", "row"])
    words = words.filter(pc.equal(words["split"], "holdout"))
    finding, rows = words["finding"].to_numpy(), words["row"].to_numpy()
    return {int(f): held.positions(np.unique(rows[finding == f])) for f in np.unique(finding)}


def gap_accounts(
    paths: RunLayout, pairs: list[tuple[str, str]], findings: list[dict], domains: dict[str, str], breakdown: bool = True, min_words: int = 3
) -> list[GapAccount]:
    """One account per pair; with `breakdown`, where its gap lives and each finding by domain
    (`min_words`: a domain with fewer of a finding's words is too few to say). Empty when the run
    has no build index (nothing held out to account for)."""
    held = load_held_out(paths, sorted({m for p in pairs for m in p}), domains)
    if held is None:
        return []
    positions = finding_positions(paths, held)
    facets = word_facets(paths, held) if breakdown and paths.words.exists() else {}
    n_domains = len(set(held.domain.tolist()))
    none = np.zeros(0, dtype=np.int64)
    accounts = []
    for a, b in pairs:
        own = [(f["finding"], f["better_model"], positions.get(f["finding"], none)) for f in findings if (f["model_a"], f["model_b"]) == (a, b)]
        account = gap_account(held.logprob[a], held.logprob[b], held.doc, held.n_docs, a, b, own)
        if breakdown:
            delta = held.logprob[a] - held.logprob[b]
            sign_of = {a: 1, b: -1}
            by_domain = {f: finding_domains(f, delta[pos], held.domain[pos], sign_of[better], min_words, n_domains) for f, better, pos in own}
            account = replace(
                account, slices=slices(delta, held.doc, held.n_docs, facets), finding_domains={f: d for f, d in by_domain.items() if d is not None}
            )
        accounts.append(account)
    return accounts
