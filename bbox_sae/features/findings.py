"""From latents to findings: one difference, however many latents express it.

Latents propose context rules (`propose_rules`, from their train top words); with `features.test:
rule` those rules and the latents' own groups of words (`features/latent_sets.py`) are tested on
held-out text, and kept ones whose held-out words nest form one finding (`nested_groups`, said
by `group_head` among nested rules; a group a rule `states` is said by that rule). With `test:
top`, kept latents of the same pair and winner join one finding when they share their best
context rule (`bbox_sae.features.rules`) or fire on each other's top words (`group_latents`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from bbox_sae.features import context
from bbox_sae.features.rules import LISTED_LEFT_CLASSES, Rule, RuleFit, WordAttributes, best_rule, common_cues, fit_rule, normalize_form, ranked_rules


@dataclass(frozen=True)
class LatentRule:
    train: RuleFit  # chosen on the train top words, precision over train words
    holdout: RuleFit  # the same rule measured on the holdout top words and holdout words


def mine_rule(
    attrs: WordAttributes,
    top_train: np.ndarray,
    top_holdout: np.ndarray,
    fires: np.ndarray,
    train_scope: np.ndarray,
    holdout_scope: np.ndarray,
    min_share: float,
) -> LatentRule | None:
    """The best rule on train, and its held-out fit (the label-free coherence measure)."""
    chosen = best_rule(attrs, top_train, fires, train_scope, min_share)
    if chosen is None:
        return None
    return LatentRule(chosen, fit_rule(chosen.rule, attrs, top_holdout, fires, holdout_scope))


class UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        self.parent[self.find(i)] = self.find(j)


def group_latents(keys: list[tuple], rules: list[str | None], top_holdout: list[np.ndarray], fires: np.ndarray, overlap: float) -> list[list[int]]:
    """Groups of positions into `keys` (pair and winner per kept latent) that express one difference.

    `fires[:, i]` is where latent i fires over all rows; i and j (same key) join when their rule
    descriptions are equal or one fires on at least `overlap` of the other's holdout top words."""
    uf = UnionFind(len(keys))
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            if keys[i] != keys[j]:
                continue
            same_rule = rules[i] is not None and rules[i] == rules[j]
            cofire = max(fires[top_holdout[i], j].mean() if len(top_holdout[i]) else 0.0, fires[top_holdout[j], i].mean() if len(top_holdout[j]) else 0.0)
            if same_rule or cofire >= overlap:
                uf.union(i, j)
    groups: dict[int, list[int]] = {}
    for i in range(len(keys)):
        groups.setdefault(uf.find(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def top_forms(words: np.ndarray, n: int = 5) -> str:
    forms = Counter(normalize_form(w) for w in words)
    shown = lambda f: f if f.strip() else ("\\n" * f.count("\n") if "\n" in f else "␣")  # noqa: E731
    return " | ".join(f"{shown(w)} ({c})" for w, c in forms.most_common(n))


# ---------------------------------------------------------------- rules as tested hypotheses


def _effect(lp_a: np.ndarray, lp_b: np.ndarray, rows: np.ndarray, sign: int) -> tuple[float, float]:
    """Median Δlog p and median Δp on `rows`, oriented so that positive means `sign`'s model wins."""
    if len(rows) == 0:
        return 0.0, 0.0
    return sign * float(np.median(lp_a[rows] - lp_b[rows])), sign * float(np.median(np.exp(lp_a[rows]) - np.exp(lp_b[rows])))


def _relaxations(rule: Rule, attrs: WordAttributes, covered: np.ndarray) -> list[Rule]:
    """Rules one step broader: a form becomes its class (alone, or with its words' usual left class),
    a condition is dropped (one always stays)."""

    def common(col: np.ndarray) -> str:
        return attrs.vocab[Counter(col[covered].tolist()).most_common(1)[0][0]]

    out = []
    if rule.word_kind == "form":
        out.append(Rule("class", common(attrs.cls), rule.left_kind, rule.left_value))
        if not rule.left_kind:
            # A form's class, kept to the left context its words share: 'oliver' may become "a
            # capitalised word right after a lower-case word", a name mid-sentence.
            out.append(Rule("class", common(attrs.cls), "class", common(attrs.left_cls)))
    if rule.word_kind and rule.left_kind and not (rule.left_kind == "context" and rule.left_value in context.COMPLEMENTS):
        out.append(Rule(None, None, rule.left_kind, rule.left_value))
    if rule.left_kind == "form":
        out.append(Rule(rule.word_kind, rule.word_value, "class", common(attrs.left_cls)))
    if rule.left_kind and rule.word_kind:
        out.append(Rule(rule.word_kind, rule.word_value, None, None))
    return out


@dataclass(frozen=True)
class Difference:
    """Where a rule's words are looked up and measured: the train words in scope, and the two
    models' log-probs with the direction (`sign`) of the difference sought."""

    attrs: WordAttributes
    train_scope: np.ndarray
    lp_a: np.ndarray
    lp_b: np.ndarray
    sign: int

    def words(self, rule: Rule) -> np.ndarray:
        return rule_words(rule, self.attrs, self.train_scope)

    def effect(self, rows: np.ndarray) -> tuple[float, float]:
        return _effect(self.lp_a, self.lp_b, rows, self.sign)


def generalize(rule: Rule, diff: Difference, covered: np.ndarray, min_abs_dlogp: float, min_abs_dp: float, keep: float = 0.8) -> Rule | None:
    """The broadest rule, `rule` or up to two steps of relaxation, whose train words beyond `rule`'s
    (all of them, not only a latent's top words) show the difference at `keep` of `rule`'s size or
    more; None when `rule`'s own words do not pass the effect rule. Relaxing only while the added
    words differ too keeps a rule from swallowing words where nothing differs ("'be' after a modal"
    must not become "'be'", nor speech starts "an all-capitals word")."""
    attrs = diff.attrs
    base_dlogp, base_dp = diff.effect(diff.words(rule))
    if not (base_dlogp > min_abs_dlogp or base_dp > min_abs_dp):
        return None

    def holds(r: Rule, parent: Rule) -> bool:
        # The words each step adds must differ too: a median over all of a rule's words would let up
        # to half of them be words where nothing differs.
        added = np.setdiff1d(diff.words(r), diff.words(parent), assume_unique=True)
        dlogp, dp = diff.effect(added)
        return len(added) == 0 or (dlogp >= keep * base_dlogp and dp >= keep * base_dp)

    best, frontier = rule, [rule]
    for _ in range(2):
        frontier = [r for f in frontier for r in _relaxations(f, attrs, covered) if holds(r, f)]
        for r in frontier:
            if len(diff.words(r)) > len(diff.words(best)):
                best = r
    return best


def specialize(rule: Rule, diff: Difference, covered: np.ndarray, min_share: float, drop: float = 0.2) -> Rule:
    """`rule` with one more condition, when the train words that condition removes carry less than
    `drop` of the difference: "an all-capitals word" becomes "an all-capitals word after a blank
    line" when only speech starts differ. Conditions come from the covered words (>= `min_share`)."""
    attrs = diff.attrs
    base_words = diff.words(rule)
    base_dlogp, _ = diff.effect(base_words)
    options = []
    n = len(covered)
    if rule.left_kind is None:
        for kind, col in (("form", attrs.left_form), ("class", attrs.left_cls), ("form2", attrs.left2_form)):
            options += [(kind, attrs.vocab[v]) for v, c in Counter(col[covered].tolist()).items() if c >= min_share * n]
        options += [
            ("layout", name) for name, col in (("line_start", attrs.line_start), ("after_blank", attrs.after_blank)) if col[covered].sum() >= min_share * n
        ]
        options += [("context", flag) for flag in context.ALONE if attrs.context[covered, context.FLAGS.index(flag)].sum() >= min_share * n]
        options += [(scope.kind, attrs.vocab[v]) for scope in context.CUE_SCOPES for v in common_cues(attrs, covered, min_share, scope.kind)]
        candidates = [Rule(rule.word_kind, rule.word_value, k, v) for k, v in options]
    elif rule.word_kind is None:
        for kind, col in (("form", attrs.form), ("class", attrs.cls)):
            options += [(kind, attrs.vocab[v]) for v, c in Counter(col[covered].tolist()).items() if c >= min_share * n]
        candidates = [Rule(k, v, rule.left_kind, rule.left_value) for k, v in options]
    else:
        return rule
    best, best_n = rule, -1
    for cand in candidates:
        kept_words = diff.words(cand)
        removed = np.setdiff1d(base_words, kept_words, assume_unique=True)
        if len(removed) == 0 or len(kept_words) == 0:
            continue
        if diff.effect(removed)[0] < drop * base_dlogp and len(kept_words) > best_n:
            best, best_n = cand, len(kept_words)
    return best


def propose_rules(
    attrs: WordAttributes,
    top_train: np.ndarray,
    fires: np.ndarray,
    train_scope: np.ndarray,
    lp_a: np.ndarray,
    lp_b: np.ndarray,
    sign: int,
    min_share: float,
    max_rules: int,
    min_abs_dlogp: float,
    min_abs_dp: float,
    max_tries: int = 5,
) -> list[tuple[Rule, RuleFit]]:
    """Up to `max_rules` rules for the words that carry a latent's difference in direction `sign` (its
    train top words on which that model wins by more than `min_abs_dlogp`), greedily: the best rule,
    then the best for the words it left out, ... each narrowed to the words that differ (`specialize`)
    and generalized as far as the train data allow (`generalize`). A latent mixing unrelated groups yields one rule per group; none when fewer than
    `min_share` of its top words carry a difference."""
    carrying = top_train[sign * (lp_a[top_train] - lp_b[top_train]) > min_abs_dlogp]
    diff = Difference(attrs, train_scope, lp_a, lp_b, sign)
    out: list[tuple[Rule, RuleFit]] = []
    remaining = carrying
    for _ in range(max_rules):
        if len(remaining) < max(3, min_share * len(top_train)):
            break
        found = None
        # The best-fitting rule may be broader than the difference ("a word after 'configuration'"
        # where only "configuration file(s)" differs): its own train words then fail the effect rule
        # and the next-best rule is tried, down to the first that states a difference (of the
        # `max_tries` best: further down, rules fit the latent too poorly to describe it).
        for fit in ranked_rules(attrs, remaining, fires, train_scope, min_share)[:max_tries]:
            covered = fit.rule.mask(attrs, remaining)
            if covered.sum() < min_share * len(carrying):
                continue
            narrow = specialize(fit.rule, diff, remaining[covered], min_share)
            rule = generalize(narrow, diff, remaining[covered], min_abs_dlogp, min_abs_dp)
            if rule is not None:
                found = (rule, fit, covered)
                break
        if found is None:
            break
        rule, fit, covered = found
        if all(rule != r for r, _ in out):
            out.append((rule, fit))
        remaining = remaining[~covered]
    return out


def expresses(finding_train_words: np.ndarray, top_rows: np.ndarray, min_share: float) -> bool:
    """Whether a latent is a feature of a finding: the finding's train words hold at least
    `min_share` of the latent's train top words. A latent can propose a confirmed finding from a
    minority of its top words (the ones that carry its difference) while the rest are unrelated:
    the finding stands, but such a mixture is not a feature a person can name."""
    return len(top_rows) > 0 and float(np.isin(top_rows, finding_train_words).mean()) >= min_share


def rule_words(rule: Rule, attrs: WordAttributes, scope: np.ndarray) -> np.ndarray:
    return scope[rule.mask(attrs, scope)]


def in_sorted(rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Which of `rows` are in `ids` (sorted ascending): a binary search per row, O(rows × log ids),
    where a set intersection is O(rows + ids) in Python objects or a sort of both. At 3M words some
    units hold 100k held-out rows, and every unit is compared with every other."""
    if len(ids) == 0:
        return np.zeros(len(rows), dtype=bool)
    at = np.minimum(np.searchsorted(ids, rows), len(ids) - 1)
    return ids[at] == rows


def shared_count(a: np.ndarray, b: np.ndarray) -> int:
    """How many row ids of `a` are in `b`, both sorted ascending (the smaller searched in the larger)."""
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    return int(np.count_nonzero(in_sorted(small, large)))


def memberships(word_sets: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every (row, set) membership of some sets of row ids (each without repeats), sorted by row."""
    sizes = [len(w) for w in word_sets]
    owner = np.repeat(np.arange(len(word_sets)), sizes)
    rows = np.concatenate(word_sets) if word_sets else np.zeros(0, dtype=np.int64)
    order = np.argsort(rows, kind="stable")
    return rows[order], owner[order]


def shared_counts(word_sets: list[np.ndarray]) -> dict[tuple[int, int], int]:
    """How many rows each pair (i < j) of sets (row ids without repeats) shares, for every pair
    sharing any: from the sets' memberships sorted by row, so the cost grows with the memberships,
    not with the square of the number of sets (the rule search makes thousands at 3M words)."""
    rows, owner = memberships(word_sets)
    n = len(word_sets)
    codes = []
    for d in range(1, len(rows)):
        same = rows[d:] == rows[:-d]
        if not same.any():
            break  # runs of one row are contiguous: no run is longer than d
        a, b = owner[:-d][same], owner[d:][same]
        codes.append(np.minimum(a, b).astype(np.int64) * n + np.maximum(a, b))
    if not codes:
        return {}
    pairs, counts = np.unique(np.concatenate(codes), return_counts=True)
    return {(int(c // n), int(c % n)): int(k) for c, k in zip(pairs, counts)}


def nested_groups(word_sets: list[np.ndarray], signs: list[tuple], containment: float) -> list[list[int]]:
    """Groups of units (kept rules, kept latent sets) of the same pair and sign where one's words lie
    (>= `containment`) inside another's: one difference said at two levels of detail ("'4'" inside
    "a number"; 'heart' and 'eyes' inside a latent's group of 50 body words). Never on how similar
    the words' embeddings are, nor on a latent that fires on both: a latent that fires wherever one
    model wins, whatever the context, would join unrelated differences."""
    uf = UnionFind(len(word_sets))
    sets = [np.unique(w) for w in word_sets]
    for (i, j), shared in shared_counts(sets).items():
        if signs[i] == signs[j] and shared >= containment * min(len(sets[i]), len(sets[j])):
            uf.union(i, j)
    groups: dict[int, list[int]] = {}
    for i in range(len(sets)):
        groups.setdefault(uf.find(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def nested_trees(word_sets: list[np.ndarray], keys: list[tuple], containment: float) -> list[list[int]]:
    """`nested_groups` without chains through a small unit: each unit, largest first, joins a group
    one of whose larger units (same pair and sign) holds at least `containment` of its words, else
    opens a group; inside several groups, the one with the most such units (then the most of its
    words, then the largest group). A unit inside two groups that do not nest joins one, no longer
    making them one: on planted Shakespeare, "'hundred'" lay inside four groups of number words and
    inside one latent's group of body words that listed 'hundred' and 'fifty', and the two planted
    classes came back as one finding of 66 forms at precision 0.70 and 0.30."""
    sets = [np.unique(w) for w in word_sets]
    shared_with: dict[int, dict[int, int]] = {}
    for (i, j), shared in shared_counts(sets).items():
        if keys[i] == keys[j]:
            shared_with.setdefault(i, {})[j] = shared_with.setdefault(j, {})[i] = shared
    group_of: dict[int, int] = {}
    for i in sorted(range(len(sets)), key=lambda i: (-len(sets[i]), i)):
        votes: dict[int, tuple[int, int]] = {}
        for j, k in shared_with.get(i, {}).items():
            if j in group_of and k >= containment * len(sets[i]):
                units, most = votes.get(group_of[j], (0, 0))
                votes[group_of[j]] = (units + 1, max(most, k))
        group_of[i] = max(votes, key=lambda g: (*votes[g], len(sets[g]), -g)) if votes else i
    groups: dict[int, list[int]] = {}
    for i in range(len(sets)):
        groups.setdefault(group_of[i], []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def headed_groups(
    group: list[int],
    train_rows: list[np.ndarray],
    holdout_rows: list[np.ndarray],
    keys: list[tuple],
    lp_a: np.ndarray,
    lp_b: np.ndarray,
    sign: int,
    prefer: list[tuple],
    containment: float,
) -> list[tuple[list[int], int]]:
    """A nested group cut into (members, head) pairs: the head's members are the rules whose
    held-out words lie (>= `containment`) inside its own; the others are grouped again. Nesting
    chains: on planted Shakespeare with context attributes, speech starts, a passage's first words
    and long-range repeats (B better) were one chain of 495 rules through forms like "'and' right
    after a blank line", said by its head, the repeats, and the other two differences were lost."""
    out: list[tuple[list[int], int]] = []
    pending = [group]
    while pending:
        g = pending.pop()
        head = group_head(g, train_rows, lp_a, lp_b, sign, prefer=[prefer[group.index(i)] for i in g])
        inside = [i for i in g if i == head or shared_count(holdout_rows[i], holdout_rows[head]) >= containment * len(holdout_rows[i])]
        out.append((inside, head))
        rest = [i for i in g if i not in set(inside)]
        if rest:
            for sub in nested_groups([holdout_rows[i] for i in rest], [keys[i] for i in rest], containment):
                pending.append([rest[j] for j in sub])
    return out


def rule_units(passed: list, lp_by_row: dict[str, np.ndarray], containment: float) -> list[tuple[list[int], int]]:
    """(members, head) of passed rule candidates (`candidates.Tested`): nested groups of one pair
    and sign, each cut at its head (`headed_groups`), the head said as `saying_order` prefers."""
    train_rows, holdout_rows, keys = [t.train_rows for t in passed], [t.holdout_rows for t in passed], [t.key for t in passed]
    out: list[tuple[list[int], int]] = []
    for nested in nested_groups(holdout_rows, keys, containment):
        t = passed[nested[0]]
        prefer = [saying_order(passed[i].rule) for i in nested]
        out += headed_groups(nested, train_rows, holdout_rows, keys, lp_by_row[t.pair[0]], lp_by_row[t.pair[1]], t.sign, prefer, containment)
    return out


SAME_WORDS = 0.9  # of two nested rules, one holding this share of the other's train words says the same words


def group_head(
    group: list[int], words_train: list[np.ndarray], lp_a: np.ndarray, lp_b: np.ndarray, sign: int, keep: float = 0.8, prefer: list[tuple] | None = None
) -> int:
    """The rule that says a nested group: the broadest (most train words) whose words beyond all the
    other members' show the difference at `keep` of theirs or more, in log-prob or in probability
    (either, as in the effect rule: a Δp ratio alone moves with the words' base probabilities); else
    the narrowest. Broadest alone would say speech starts ("a word after a blank line") as "an
    all-capitals word", a rule that also passes, carried by its speech starts, while a quarter of
    its words (capitals mid-line) differ in nothing. Train words only: the holdout half stays the
    test. Beyond means beyond the members (nearly) inside it. Members that say nearly the same
    words as the chosen one (`SAME_WORDS` each way: "',' right after 'marry'" and "punctuation
    right after 'marry'") are one statement said two ways, and the one `prefer` (a sort key per
    member, lowest first) ranks first says it."""
    by_size = sorted(group, key=lambda i: -len(words_train[i]))
    head = by_size[-1]
    for i in by_size:
        # The core is the members (nearly) inside this one. Not one holding nearly all its words: it
        # says the same words, beyond it nothing is added whatever the difference is. Not a broader
        # one: "a lower-case word after a conjunction", whose other words differ in nothing, made
        # the core's median 0, and then 'you' everywhere "added the difference" of 'you' after one.
        others = [words_train[j] for j in group if j != i and _inside(words_train[j], words_train[i]) and not _same_words(words_train[j], words_train[i])]
        if not others or adds_the_difference(words_train[i], np.unique(np.concatenate(others)), lp_a, lp_b, sign, keep):
            head = i
            break
    if prefer is None:
        return head
    same = [j for j in group if _same_words(words_train[j], words_train[head]) and _same_words(words_train[head], words_train[j])]
    return min(same, key=lambda j: prefer[group.index(j)])


def saying_order(rule: Rule) -> tuple:
    """Of rules with the same words, which says them best (lowest first): one naming the word's
    form ("'?'", not "punctuation"), then one without a context attribute (a word's sentence or
    place, said only where it tells words apart), then one with fewer conditions."""
    return (rule.word_kind != "form", rule.left_kind == "context", rule.left_kind is not None)


def _inside(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether nearly all of `a`'s words (`SAME_WORDS`) lie in `b` (sorted row ids)."""
    return shared_count(a, b) >= SAME_WORDS * len(a)


def _same_words(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether `a` holds at least `SAME_WORDS` of `b`'s words (sorted row ids)."""
    return shared_count(a, b) >= SAME_WORDS * len(b)


def adds_the_difference(words: np.ndarray, core: np.ndarray, lp_a: np.ndarray, lp_b: np.ndarray, sign: int, keep: float = 0.8) -> bool:
    """Whether the train `words` beyond `core` show the difference at `keep` of core's or more, in
    log-prob or in probability (either, as in the effect rule: a Δp ratio alone moves with the
    words' base probabilities); true when there are none."""
    added = np.setdiff1d(words, core)
    if len(added) == 0:
        return True
    core_dlogp, core_dp = _effect(lp_a, lp_b, core, sign)
    dlogp, dp = _effect(lp_a, lp_b, added, sign)
    return dlogp >= keep * core_dlogp or dp >= keep * core_dp


# A member of a left class is listed in a narrowed statement only with this many train words: fewer
# say nothing about whether its words differ.
MIN_MEMBER_WORDS = 3


def narrower_left_forms(
    rule: Rule, attrs: WordAttributes, train_rows: np.ndarray, lp_a: np.ndarray, lp_b: np.ndarray, sign: int, keep: float = 0.8
) -> list[str] | None:
    """The left forms that carry the difference of a rule after a class of named words, when the
    class's other forms do not: None when the rule names no such class or its difference is the
    whole class's. A member carries when its own train median reaches half the class's; the others
    do not differ when, together, they fall short of `keep` of the carrying members' difference
    (`adds_the_difference`, the measure that picks a nested group's head). Planted: "an ending after
    an auxiliary verb" where only the forms of 'be' differ, a pronoun "right after a conjunction"
    where three conjunctions do; both were said one class too broad (precision 0.72). Train only."""
    if rule.left_kind != "class" or rule.left_value not in LISTED_LEFT_CLASSES or len(train_rows) == 0:
        return None
    d = sign * (lp_a[train_rows] - lp_b[train_rows])
    left = attrs.left_form[train_rows]
    whole = float(np.median(d))
    forms, inverse, counts = np.unique(left, return_inverse=True, return_counts=True)
    carrying = [j for j in range(len(forms)) if counts[j] >= MIN_MEMBER_WORDS and np.median(d[inverse == j]) >= 0.5 * whole]
    if not carrying or len(carrying) == len(forms):
        return None
    core = train_rows[np.isin(inverse, carrying)]
    if adds_the_difference(train_rows, core, lp_a, lp_b, sign, keep):
        return None
    return [attrs.vocab[int(forms[j])] for j in sorted(carrying, key=lambda j: -counts[j])]


def states(rule_words: np.ndarray, set_words: np.ndarray, share: float = 0.8) -> bool:
    """Whether a rule says a word set: at least `share` of the set is the rule's, and of the rule's
    words the set's (held-out rows of both, sorted)."""
    if len(rule_words) == 0 or len(set_words) == 0:
        return False
    common = shared_count(rule_words, set_words)
    return common >= share * len(set_words) and common >= share * len(rule_words)
