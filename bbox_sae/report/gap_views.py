"""The gap account in words, as every summary says it (report.html, report.md, W&B, the console):
the same statements everywhere, so no two of them can tell a different story."""

from __future__ import annotations

from bbox_sae.report.gap import AXES, FindingDomains, GapAccount, Slice
from bbox_sae.report.markup import fmt


def pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def headline(acc: GapAccount) -> list[str]:
    """The account of one pair as a few plain statements: perplexities, the mean Δ with its CI,
    how much of each model's advantage its findings carry, and what is left."""
    a, b = acc.model_a, acc.model_b
    winner = acc.overall_winner
    verdict = f"{winner} is better overall" if winner else "neither is better overall"
    lines = [
        f"{a} vs {b}, on the {acc.words:,} held-out words ({acc.documents:,} documents; the findings were tested on these): "
        f"perplexity {a} {acc.perplexity[a]:.2f}, {b} {acc.perplexity[b]:.2f}.",
        f"Mean Δlog p (log p {a} − log p {b}): {acc.mean_dlogp:+.3f} nats per word, 95% CI [{fmt(acc.ci_low, '+.3f')}, {fmt(acc.ci_high, '+.3f')}] "
        f"(resampling documents): {verdict}; {a} is better on {acc.share_a_better:.1%} of the words.",
    ]
    for w in acc.winners:
        lines.append(
            f"{w.model}'s advantage (its Δ summed over the {w.words_better:,} words it predicts better): {w.advantage:,.0f} nats. "
            f"Its {w.findings} finding(s) carry {pct(w.union_share)} of it ({w.union_words:,} words, each counted once); left: {pct(w.left)}."
        )
    if acc.findings:
        lines.append(
            f"All findings' words ({acc.findings_words:,} of {acc.words:,}) carry {acc.net * (acc.findings_net_share or 0.0):+,.0f} "
            f"of the net {acc.net:+,.0f} nats ({pct(acc.findings_net_share)})."
        )
    return lines


SHARE_NOTE = (
    "A finding's share: its held-out words' Δ summed (towards its winner) over its winner's advantage; "
    "shares of findings without common words add up, and a share is negative where its words, summed, favour the other model."
)
SLICE_NOTE = (
    "Each breakdown partitions the held-out words (a word takes the first place that holds): its slices' shares of the net gap "
    "(their Δ summed over all words' Δ summed) add up to 100%; a share above 100% or below 0 means the slice outweighs the "
    "others or goes against them. CIs resample documents (none for a slice whose words lie in one document)."
)


def slice_rows(acc: GapAccount) -> list[tuple[str, Slice]]:
    """(axis title, slice) in axis order, rare to common, KINDS, PLACES and domain name order."""
    return [(AXES[s.axis], s) for s in acc.slices]


def carried_lines(acc: GapAccount, statements: dict[int, str]) -> list[str]:
    """A statement per finding that one domain carries."""
    return [
        f"Finding {f} ({statements.get(f, '')}) is carried by one domain: {d.carried_by} gives {d.carried_share:.0%} of its summed Δ."
        for f, d in sorted(acc.finding_domains.items())
        if d.carried_by is not None
    ]


def domain_note(d: FindingDomains, min_words: int) -> str:
    carried = f" Carried by {d.carried_by}: {d.carried_share:.0%} of its summed Δ." if d.carried_by else " No one domain carries it."
    other = f" {d.other_domains} more domain(s) hold fewer than {min_words} of its words." if d.other_domains else ""
    return f"By domain (domains with at least {min_words} of its held-out words).{carried}{other}"
