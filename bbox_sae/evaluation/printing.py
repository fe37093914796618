"""The evaluation's tables on the terminal."""

from __future__ import annotations


def fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}" if isinstance(x, float) else str(x)


def print_table(title: str, columns: list[str], rows: list[list]) -> None:
    from rich.console import Console
    from rich.table import Table

    from bbox_sae.pipeline import shown

    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for r in rows:
        table.add_row(*[shown(str(x)) for x in r])  # statements may be an LLM's
    Console().print(table)


def print_planted(results: dict) -> None:
    """`bbox eval planted`'s tables: recovery per rule, the summary per variant, the null pair."""
    full = results["variants"]["full"]
    print_table(
        f"Planted-difference recovery ({results['words']} words)",
        [
            "rule",
            "kind",
            "planted Δ (B − A)",
            "frequency",
            "train occurrences",
            "recovered",
            "precision",
            "recall",
            "detection",
            "splits",
            "finding",
            "statement (kind)",
            "best latent (its top words: rule share / share of the rule)",
        ],
        [
            [
                n,
                results["rules"][n]["kind"],
                results["rules"][n]["delta"],
                f"{100 * results['rules'][n]['frequency']:.2f}%",
                v["train_occurrences"],
                "yes" if v["recovered"] else "no",
                f"{v['precision']:.2f}",
                f"{v['recall']:.2f}",
                fmt(v.get("detection")),
                v["splits"],
                fmt(v["finding"]),
                f"{v['label']} ({v.get('kind')})" if v.get("label") else "-",
                f"{v['latent']}: {v['latent_precision']:.2f} / {v['latent_recall']:.2f}" if v.get("latent") is not None else "-",
            ]
            for n, v in full["per_rule"].items()
        ],
    )
    print_table(
        "Summary",
        ["variant", "rules recovered", "mean recall", "FDR", "kept findings", "kept latents", "max splits"],
        [
            [n, f"{v['rules_recovered']}/{v['rules']}", f"{v['mean_recall']:.2f}", f"{v['fdr']:.2f}", v["kept_findings"], v["kept_latents"], v["max_splits"]]
            for n, v in results["variants"].items()
        ],
    )
    if results.get("null"):
        print_table(
            "Null pair (B = A + noise, nothing planted)",
            ["seed", "kept findings", "what"],
            [[r["seed"], r["kept_findings"], "; ".join((f["statement"] or f["top_words"] or "")[:40] for f in r["findings"][:3])] for r in results["null"]],
        )
