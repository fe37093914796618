"""Findings as the report shows them (report.html, report.md and W&B alike): the statistics, how
the finding was tested, its held-out contexts and member latents; and for each latent, which
findings it belongs to and why it is (or is not) kept."""

from __future__ import annotations

import math
import re

from bbox_sae.config import FeaturesConfig
from bbox_sae.report.gap import GapAccount
from bbox_sae.report.inputs import ReportInputs
from bbox_sae.report.markup import num
from bbox_sae.schemas import latent_ids


def how_to_read(fcfg: FeaturesConfig, family: int | None, against_search: str | None = None) -> str:
    """One paragraph explaining every statistic the report shows, and how the findings compare with
    the rule search (`finding_inputs.against_search`)."""
    over = f"all {family} candidates tested" if family else "every candidate tested"
    words = "the held-out top words of its latents" if fcfg.test == "top" else "every held-out word it covers"
    kept = (
        f"a latent is kept when it proposed a finding's rule and that finding's words cover at least {fcfg.member_min_share:.0%} of its own top words, "
        "so a kept latent can have a large q on its own top words: the finding it carries was tested, not the latent"
        if fcfg.test == "rule"
        else f"a latent is kept when its own top words pass the test (q < {fcfg.q_threshold}, effect size) and its rule fits them (F1 ≥ {fcfg.min_rule_f1})"
    )
    return (
        "How to read this. Δlog p of a word is log p(first model of the pair) − log p(second model), in nats: above 0 the first model "
        "predicts the word better, below 0 the second; 'better' names the model the sign favours. A finding's Δ is the median of Δlog p "
        f"over {words} (held-out text was not used to choose it), with a bootstrap 95% confidence interval (CI) "
        "of that median; n is how many held-out words that is. p is a two-sided Wilcoxon signed-rank test of those Δ against 0, and q is "
        f"its Benjamini–Hochberg adjusted value over {over} (a finding joins one or more candidates, each passing q < {fcfg.q_threshold}; "
        "its q is the largest of theirs). Detection is the balanced accuracy of a judge that reads only the statement and picks the "
        "finding's held-out words among as many other held-out words, half of them near misses (0.5 is chance, 1 perfect); a latent's "
        "detection score is the same for its label. With the offline labeller the judge applies the statement's own definition, so its "
        "detection is a definition check (1.0: the statement is exact about its words), not a validation by an independent reader; an "
        "LLM judge (label.base_url, label.model) gives that. Rule precision is the share of held-out words "
        "the rule matches on which the member latents fire; rule recall the share of the latents' held-out top words the rule matches; "
        f"F1 combines them. A low rule F1 means the latents fire on much more than the rule, not that the rule's difference is weak. Kept: {kept}."
        + (f" {against_search}" if against_search else "")
    )


def tested_line(f: dict, fcfg: FeaturesConfig, family: int | None) -> str:
    over = f"BH over all {family} candidates" if family else "BH over every candidate"
    if fcfg.test == "top":
        return f"tested on the {f['holdout_n']} held-out top words of its latents: Wilcoxon signed-rank, BH over every latent"
    words = "its rules cover" if f.get("kind") == "rule" else "its word group covers"
    proposed = f"; proposed by {f['proposer']}" if f.get("proposer") else ""
    return f"tested on all {f['holdout_n']} held-out words {words}: Wilcoxon signed-rank, {over}{proposed}"


def feature_key(latent: int, a: str, b: str) -> str:
    return f"sae:{latent}:{a}:{b}"


def gap_of(inputs: ReportInputs, a: str, b: str) -> GapAccount | None:
    return next((acc for acc in inputs.gap if (acc.model_a, acc.model_b) == (a, b)), None)


def finding_view(f: dict, inputs: ReportInputs, fcfg: FeaturesConfig) -> dict:
    a, b = f["model_a"], f["model_b"]
    account = gap_of(inputs, a, b)
    share = next((s for s in account.findings if s.finding == f["finding"]), None) if account else None
    features = {x["key"]: x for x in inputs.features}
    members = []
    for latent in latent_ids(f["latents"]):
        feature = features.get(feature_key(latent, a, b))
        members.append({"latent": latent, "key": feature_key(latent, a, b), "kept": bool(feature and feature["kept"]), "listed": feature is not None})
    contexts = [{**c, "logprob_a": c["logprob"].get(a), "logprob_b": c["logprob"].get(b)} for c in inputs.finding_contexts.get(f["finding"], [])]
    return {
        **f,
        "q_value": inputs.finding_q.get(f["finding"]),
        "tested": tested_line(f, fcfg, inputs.candidate_family),
        "contexts": contexts,
        "members": members,
        # Its share of its winner's advantage, and its Δ by domain (`gap`); None without a build index.
        "gap_share": share.share if share else None,
        "by_domain": account.finding_domains.get(f["finding"]) if account else None,
        "n_words": len(inputs.finding_words.get(f["finding"], [])),
        "n_counter": sum(counter_example(f, w) for w in inputs.finding_words.get(f["finding"], [])),
    }


def word_delta(f: dict, word: dict) -> float | None:
    a, b = word["logprob"].get(f["model_a"]), word["logprob"].get(f["model_b"])
    return None if a is None or b is None else a - b


def counter_example(f: dict, word: dict) -> bool:
    """A held-out word of the finding on which the other model is better."""
    d = word_delta(f, word)
    return d is not None and (d < 0 if f["better_model"] == f["model_a"] else d > 0)


def finding_word_rows(f: dict, words: list[dict], domains: dict[str, str]) -> list[list]:
    """report.html's panel of a finding's held-out words, one compact row each:
    [Δ, log p a, log p b, domain, left, word, right, doc_id, what a expected, what b expected]."""
    return [
        [
            num(word_delta(f, w), 4),
            num(w["logprob"].get(f["model_a"]), 4),
            num(w["logprob"].get(f["model_b"]), 4),
            domains.get(w["doc_id"]),
            w["left"],
            w["word"],
            w["right"],
            w["doc_id"],
            expected_text(w.get("expected", {}).get(f["model_a"])),
            expected_text(w.get("expected", {}).get(f["model_b"])),
        ]
        for w in words
    ]


def expected_text(alternatives: list[tuple[str, float]] | None) -> str | None:
    """What a model expected at a word, most likely first: "'the' 31% · 'a' 12%"; None where its
    scores keep none. A token's leading space is not shown; a line break shows as ⏎."""
    if not alternatives:
        return None
    return " · ".join(f"'{one_line(token).strip() or one_line(token)}' {math.exp(lp):.0%}" for token, lp in alternatives if lp is not None)


def finding_views(inputs: ReportInputs, fcfg: FeaturesConfig) -> list[dict]:
    return [finding_view(f, inputs, fcfg) for f in inputs.findings]


def one_line(text: str) -> str:
    """Context text on one line: each line break shows as ⏎ (a finding may be about one), a run of
    spaces as one."""
    return re.sub(r"[ \t\r]+", " ", str(text or "").replace("\n", "⏎"))


def context_text(ctx: dict, a: str, b: str) -> str:
    """One context as plain text: `left [[word]] right (a: -3.20 / b: -5.10)`."""

    def lp(x):
        return "n/a" if x is None else f"{x:.2f}"

    text = one_line(f"{ctx['left']}[[{ctx['word']}]]{ctx['right']}")
    return f"{text} ({a}: {lp(ctx['logprob_a'])} / {b}: {lp(ctx['logprob_b'])})"


def finding_refs(feature: dict, findings: dict[int, dict]) -> list[dict]:
    ids = [int(x) for x in str(feature.get("findings") or feature.get("finding") or "").split(",") if x.strip()]
    return [
        {"finding": i, "statement": findings[i].get("statement") or findings[i].get("rule"), "better_model": findings[i]["better_model"]}
        for i in ids
        if i in findings
    ]


def kept_reason(feature: dict, refs: list[dict], fcfg: FeaturesConfig) -> str | None:
    """Why a latent is or is not kept, when that is not plain from its own statistics."""
    q = feature.get("q_value")
    own_passes = q is not None and q < fcfg.q_threshold
    names = ", ".join(f"finding {r['finding']}" for r in refs)
    lines = []
    if feature["kept"] and refs and fcfg.test == "rule":
        own = (
            f"its own top words are significant too (q = {q:.2g})"
            if own_passes
            else f"its own top words would not keep it (q = {'n/a' if q is None else f'{q:.2g}'})"
        )
        lines.append(f"Kept because it carries {names}: those words cover at least {fcfg.member_min_share:.0%} of its top words; {own}.")
    elif refs and not feature["kept"]:
        lines.append(f"Proposed {names}, but not kept: the finding's words cover too few of its top words to name the latent by them.")
    other = [f"finding {r['finding']} favours {r['better_model']}" for r in refs if r["better_model"] != feature.get("better_model")]
    if other and feature.get("better_model"):
        lines.append(f"Its top words as a whole lean towards {feature['better_model']}; {', '.join(other)}.")
    return " ".join(lines) or None
