"""`features.test: rule`: findings are candidates that latents propose, tested on held-out text.

Two kinds of candidate: context rules (`findings.propose_rules`, chosen on train only) and, with
`features.latent_sets`, each difference-carrying latent's own word set, defined by the context
alone (`latent_sets`). Each is tested on *all* held-out words it covers, a set chosen without
looking at any held-out Δ: Wilcoxon p, BH q across every candidate, the effect-size rule on the
held-out median and the proposing sign. Kept candidates form findings; a finding is said by its
rules when they cover its held-out words, else by what its words share (`word_sets.WordSet`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from bbox_sae.config import FeaturesConfig
from bbox_sae.features import context
from bbox_sae.features.activations import top_words
from bbox_sae.features.baseline import baseline_differences, baseline_table, searched_candidates, single_rule_states
from bbox_sae.features.candidates import Tested, propose_candidates, proposer_text, test_candidates, tested_row
from bbox_sae.features.evidence import artifact_of
from bbox_sae.features.feature_table import pair_stats
from bbox_sae.features.findings import (
    LatentRule,
    UnionFind,
    adds_the_difference,
    expresses,
    in_sorted,
    narrower_left_forms,
    nested_trees,
    rule_units,
    shared_count,
    states,
    top_forms,
)
from bbox_sae.features.grouping import FindingInputs, FindingTables, finding_stats, number_by_effect, rule_columns
from bbox_sae.features.latent_sets import FORM_CARRIES, form_wins
from bbox_sae.features.places import JOINING_CONTEXTS, carrying_latents, unit_place
from bbox_sae.features.rule_search import MAX_CUE_SHARE, TOPIC_SCOPES
from bbox_sae.features.rule_statements import describe_rules
from bbox_sae.features.rules import WORD_KINDS, Rule, RuleFit, WordAttributes, any_mask, fit_rule, fit_rules, rules_from_json, rules_to_json
from bbox_sae.features.word_sets import WordSet, describe_words_covered, suffix_word_set
from bbox_sae.schemas import latent_ids


def _rule_units(kept: list[Tested], attrs: WordAttributes, lp_by_row: dict[str, np.ndarray], fcfg: FeaturesConfig) -> list[Tested]:
    """Kept rules whose words nest (one inside another) are one unit, said by its head
    (`findings.group_head`: the broadest rule that adds no words where nothing differs), with
    every member's proposers; rules a chain of nesting brought in but the head does not hold form
    units of their own (`findings.headed_groups`)."""
    units = [_unit(kept, g, kept[h]) for g, h in rule_units(kept, lp_by_row, fcfg.finding_overlap)]
    for u in units:
        _narrow(u, attrs, lp_by_row)
    return units


def _narrow(unit: Tested, attrs: WordAttributes, lp_by_row: dict[str, np.ndarray]) -> None:
    """A unit whose head (a rule, or a latent's group of words) says "right after <a class>" where
    only some of the class's words carry the difference keeps those words only, said by the
    carrying left forms: one rule per form, or the group with those forms to its left."""
    said = unit.rule if unit.rule is not None else unit.word_set.left if unit.word_set is not None else None
    if said is None:
        return
    forms = narrower_left_forms(said, attrs, unit.train_rows, lp_by_row[unit.pair[0]], lp_by_row[unit.pair[1]], unit.sign)
    if forms is None:
        return
    if unit.rule is not None:
        rules = tuple(Rule(unit.rule.word_kind, unit.rule.word_value, "form", f) for f in forms)
        holds = lambda rows: any_mask(list(rules), attrs, rows)  # noqa: E731
        unit.said_by = unit.members = rules
    else:
        unit.word_set = replace(unit.word_set, left_forms=tuple(forms))
        holds = lambda rows: unit.word_set.mask(attrs, rows)  # noqa: E731
    unit.train_rows = unit.train_rows[holds(unit.train_rows)]
    unit.holdout_rows = unit.holdout_rows[holds(unit.holdout_rows)]


def _ending_after_forms(unit: Tested, attrs: WordAttributes, lp_by_row: dict[str, np.ndarray], rows_by_split, min_abs_dlogp: float) -> None:
    """An ending set narrowed to its left forms (`_narrow`) says which forms of the ending it is not
    where those forms stand: the forms it excluded were judged after the whole class. Planted
    "-ed right after a form of 'be'" came back excluding 301 forms on which the model does not win
    after 'have' or 'did' ("have loved"), half the planted words (recall 0.49). Train only: the
    held-out words are then every word the set says, as for any set."""
    forms = [attrs.code.get(f, -1) for f in unit.word_set.left_forms]
    train = rows_by_split["train"]
    scope = train[np.isin(attrs.left_form[train], forms)]
    ending = WordSet((), (), suffix=unit.word_set.suffix)
    total, wins = form_wins(attrs, scope, lp_by_row[unit.pair[0]] - lp_by_row[unit.pair[1]], unit.sign, min_abs_dlogp)
    narrowed = suffix_word_set(attrs, scope[ending.mask(attrs, scope)], unit.word_set.suffix, total, wins, FORM_CARRIES)
    unit.word_set = replace(narrowed, left=unit.word_set.left, left_forms=unit.word_set.left_forms)
    unit.train_rows = train[unit.word_set.mask(attrs, train)]
    holdout = rows_by_split["holdout"]
    unit.holdout_rows = holdout[unit.word_set.mask(attrs, holdout)]


def _unit(kept: list[Tested], g: list[int], head: Tested) -> Tested:
    """One unit: the head's rule and words, with every member's proposers and the largest q."""
    latents = sorted({m for i in g for m in kept[i].latents})
    members = (head.rule, *(kept[i].rule for i in g if kept[i] is not head))
    return Tested(
        "rule", head.pair, head.sign, latents, head.train_rows, head.holdout_rows, rule=head.rule, stats=head.stats,
        q_value=max(kept[i].q_value for i in g), passed=True, searched=any(kept[i].searched for i in g), members=members,
    )  # fmt: skip


def _absorb_stated_sets(rule_units: list[Tested], latent_units: list[Tested]) -> list[Tested]:
    """Latent sets a kept rule states (`findings.states`) join that rule's unit: the rule says the
    same words, in words a reader can check. The other sets are returned."""
    left = []
    for s in latent_units:
        stated_by = next((u for u in rule_units if u.key == s.key and states(u.holdout_rows, s.holdout_rows)), None)
        if stated_by is None:
            left.append(s)
        else:
            stated_by.latents = sorted(set(stated_by.latents) | set(s.latents))
            stated_by.q_value = max(stated_by.q_value, s.q_value)
    return left


def _more_than_its_rules(group: Tested, rule_units: list[Tested], attrs: WordAttributes, lp_by_row: dict[str, np.ndarray], fcfg: FeaturesConfig) -> bool:
    """Whether a latent's group is a difference beyond the kept rules nested in it: its train words
    outside them differ too (`findings.adds_the_difference`), and, when the rules hold nearly all of
    it, it is one kind of token. 'heart' and 'eyes' inside a group of body words that all differ:
    one finding, said by the group. 'oliver' and 'gloster' inside a group of 147 forms where Gemma
    is otherwise barely better: the rules are the findings, and the group, whose test their words
    carried, is not one. '?' and 'thou' inside one latent's group (a planted question mark and
    planted thou-forms, one winner): with every form a rule of the rule search, the group adds no
    word and joins two differences a person keeps apart, a punctuation mark and words."""
    inside = [u.train_rows for u in rule_units if u.key == group.key and _nests(u.holdout_rows, group.holdout_rows, fcfg.finding_overlap)]
    if not inside:
        return True
    in_rules = np.zeros(len(group.train_rows), dtype=bool)
    for rows in inside:
        in_rules |= in_sorted(group.train_rows, rows)
    core = group.train_rows[in_rules]
    if in_rules.mean() >= RULE_STATES and mixes_kinds(attrs, group.train_rows):
        return False
    return len(core) == 0 or adds_the_difference(group.train_rows, core, lp_by_row[group.pair[0]], lp_by_row[group.pair[1]], group.sign)


# The kinds of token a person keeps apart: classes of `rules.word_class` by what they are.
TOKEN_KINDS = {"c:punctuation": "punctuation", "c:number": "number", "c:space": "layout", "c:newline": "layout", "c:blank": "layout"}


def _kinds(attrs: WordAttributes, rows: np.ndarray) -> Counter:
    return Counter(TOKEN_KINDS.get(attrs.vocab[c], "word") for c in attrs.cls[rows].tolist())


def mixes_kinds(attrs: WordAttributes, rows: np.ndarray, share: float = 0.2) -> bool:
    """Whether two kinds of token (punctuation, numbers, layout, words) each make up at least `share` of `rows`."""
    return sum(c >= share * len(rows) for c in _kinds(attrs, rows).values()) >= 2


def token_kind(attrs: WordAttributes, rows: np.ndarray) -> str | None:
    """The kind of token most of `rows` are."""
    kinds = _kinds(attrs, rows)
    return kinds.most_common(1)[0][0] if kinds else None


def _nests(a: np.ndarray, b: np.ndarray, share: float) -> bool:
    """Whether at least `share` of the words of the smaller of two held-out word sets (sorted row
    ids) lie in the other."""
    return len(a) > 0 and len(b) > 0 and shared_count(a, b) >= share * min(len(a), len(b))


def _place(unit: Tested) -> tuple[str, str] | None:
    """The left context a unit says of its words, when it says one with a word part: 'my' of
    "'lord' right after 'my'" or of "a group of 8 word forms ... right after 'my'"; for a rule unit
    whose place was worked out from all its rules (`unit_place`), that one."""
    if unit.place is not None:
        return unit.place
    if unit.rule is not None:
        return (unit.rule.left_kind, unit.rule.left_value) if unit.rule.word_kind and unit.rule.left_kind else None
    left = unit.word_set.left if unit.word_set is not None else None
    return (left.left_kind, left.left_value) if left is not None else None


def finding_groups(units: list[Tested], containment: float) -> list[list[int]]:
    """Units that nest (`findings.nested_trees`), and groups whose units say words in the same
    place for the same winner, when the place is a layout (the start of a line, after a blank
    line) or one named word before ('lord', 'mother' and 'master' right after 'my'), or when a
    latent proposes or carries both: the words that open a verse line where one model wins are one
    finding. A shared latent alone is not enough (one that fires wherever model B wins would join
    everything B wins on), nor a shared left class alone ("'not' after an auxiliary" and a verb after
    one are different differences unless a latent carries both). A layout or a word joins without a
    latent because the demo's SAE gives each line-opening form its own latent, and the latents
    firing on all of them fire on two thirds of all words; on the planted corpus the kin words
    after 'my' came back as four findings so (docs/findings.md). One form right after several named
    words joins the same way: the demo's line breaks after '?', '!' and '.--' were three findings."""
    groups = nested_trees([u.holdout_rows for u in units], [u.key for u in units], containment)
    uf = UnionFind(len(groups))
    first_with: dict[tuple, int] = {}
    for gi, g in enumerate(groups):
        for i in g:
            head = units[i].rule
            if head is not None and head.word_kind == "form" and head.left_kind and units[i].token_kind == "punctuation":
                # One mark in several contexts, one winner: '.]' after 'exeunt' and '.]' among the
                # text's first words (the demo). Not a word form: its contexts are places that join
                # on their own or are kept apart on purpose ('then' at a line start, 'then' after a comma).
                uf.union(gi, first_with.setdefault((units[i].key, "the mark", head.word_value), gi))
            if head is not None and head.left_kind in context.CUE_KINDS:
                # One word part with several cues of one scope, one winner: a topic is told by
                # several of its words ('arms' after 'war', after 'battle'), a register by several
                # forms ('thou', 'thee', 'thy'); through a shared cue the forms join too (below). A
                # topic's set of forms with one cue joins the sets with its other cues by any form.
                for part in WORD_KINDS[head.word_kind].parts(head.word_value) if head.word_kind else [None]:  # a register: any word
                    uf.union(gi, first_with.setdefault((units[i].key, "cues of", head.left_kind, part), gi))
            place = _place(units[i])
            if place is None:
                continue
            joiners = {PLACE} if place[0] in PLACES_THAT_JOIN or place in JOINING_CONTEXTS else {*units[i].latents, *units[i].carriers}
            places = [place]
            if place[0] == "form" and head is not None and head.word_kind == "form":
                places.append(("after a form", head.word_value))  # a line break after '?', after '!'
            for where in places:
                for joiner in joiners:
                    # Of one kind of token: "'?' right after 'thou'" and "'thy' right after 'thou'" say two differences.
                    uf.union(gi, first_with.setdefault((units[i].key, where, joiner, units[i].token_kind), gi))
    merged: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        merged.setdefault(uf.find(i), []).extend(g)
    return sorted((sorted(g) for g in merged.values()), key=lambda g: g[0])


# A finding whose train words stand at least this share where a topic finding's cue was named
# earlier in the text, for the same winner, is that topic's word (`joined_with_topics`).
IN_TOPIC = 0.8
# A topic's scope: its most specific cues, taken until their texts hold this share of its own train words.
TOPIC_COVER = 0.9


def joined_with_topics(
    groups: list[list[int]], units: list[Tested], attrs: WordAttributes, train: np.ndarray, lp_by_row: dict[str, np.ndarray], fcfg: FeaturesConfig
) -> list[list[int]]:
    """Groups joined to a topic group (a word part with a cue earlier in the text: "'rome' with
    'titus' earlier in the text", `rule_search.search_topic_rules`) of the same winner when `IN_TOPIC` of their train words stand
    after one of its cues. Planted network words of the Handbook came back as the topic,
    "'servers'" and "a lower-case word right after 'ip'": a form that is mostly in those texts
    passes alone, and is the topic's. A topic is where its principal cues were named
    (`topic_scope`); one whose scope is more than `MAX_CUE_SHARE` of the train words names no
    topic, and a group that says no word part ("a word with 'you' earlier in its sentence") is a
    register, not a topic's word. A form said anywhere that joins is said in the topic's texts
    when its words elsewhere do not differ (`_in_topic_texts`)."""
    topics = {}
    for gi, g in enumerate(groups):
        cues = {r.left_value for i in g for r in units[i].stating_rules + units[i].members if r.word_kind and r.left_kind in TOPIC_SCOPES}
        if not cues:
            continue
        own = np.unique(np.concatenate([units[i].train_rows for i in g]))
        scope, named = topic_scope(sorted(cues), attrs, train, own)
        if scope.mean() <= MAX_CUE_SHARE:
            topics[gi] = (train[scope], named)
    if not topics:
        return groups
    uf = UnionFind(len(groups))
    for gi, g in enumerate(groups):
        if gi in topics or any(units[i].rule is not None and not units[i].rule.word_kind for i in g):
            continue
        rows = np.unique(np.concatenate([units[i].train_rows for i in g]))
        lefts = {place[1] for i in g if (place := _place(units[i])) is not None and place[0] == "form"}
        for ti, (scope, named) in topics.items():
            # "A word right after 'ip'" stands where 'ip' was named by what it says: a phrase of
            # the cue, which differs whatever the text is about, not the topic's word.
            if units[groups[ti][0]].key == units[g[0]].key and not lefts & named and np.isin(rows, scope).mean() >= IN_TOPIC:
                uf.union(ti, gi)
                for i in g:
                    _in_topic_texts(units[i], sorted(named), scope, attrs, lp_by_row, fcfg)
                break
    merged: dict[int, list[int]] = {}
    for gi, g in enumerate(groups):
        merged.setdefault(uf.find(gi), []).extend(g)
    return sorted((sorted(g) for g in merged.values()), key=lambda g: g[0])


def _in_topic_texts(unit: Tested, named: list[str], scope: np.ndarray, attrs: WordAttributes, lp_by_row: dict[str, np.ndarray], fcfg: FeaturesConfig) -> None:
    """A form said anywhere ("'address'") that joins a topic keeps its words in the topic's texts
    (after one of its `named` cues) when its train words elsewhere (not in `scope`, train rows)
    do not differ, said so ("'address' with 'ip', 'dns' or ... earlier in the text"): joined
    whole, planted Handbook 'address' brought its words of texts about mail into the network
    topic (precision 0.797). Train only; the finding is tested again on its own held-out words."""
    rule = unit.rule
    if rule is None or not rule.word_kind or rule.left_kind or unit.said_by:
        return
    elsewhere = unit.train_rows[~np.isin(unit.train_rows, scope)]
    if differs(elsewhere, lp_by_row[unit.pair[0]], lp_by_row[unit.pair[1]], unit.sign, fcfg):
        return
    cues = tuple(Rule(rule.word_kind, rule.word_value, TOPIC_SCOPES[0], cue) for cue in named)
    unit.said_by = cues
    unit.train_rows = unit.train_rows[np.isin(unit.train_rows, scope)]
    unit.holdout_rows = unit.holdout_rows[any_mask(list(cues), attrs, unit.holdout_rows)]


def topic_scope(cues: list[str], attrs: WordAttributes, train: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, set[str]]:
    """Which `train` words stand after the topic's principal cues, and those cues: greedily, the cue
    whose texts are most the topic's (the largest share of the words it adds to the scope are the
    topic's own train words, `own`), until `TOPIC_COVER` of them are held. A set extends to every cue that tells it
    (`rule_search._more_cues`): the planted network topic of the Handbook came back with 38 cues,
    'contains', 'important' and 'several' among them, whose texts together are most of the corpus;
    'ip', 'dns' and 'network' say where it is."""
    masks = {cue: Rule(left_kind=TOPIC_SCOPES[0], left_value=cue).mask(attrs, train) for cue in cues}
    is_own = np.isin(train, own)
    scope = np.zeros(len(train), dtype=bool)

    def specificity(cue: str) -> float:
        added = masks[cue] & ~scope
        return (added & is_own).sum() / max(added.sum(), 1)

    named = set()
    while masks and (scope & is_own).sum() < TOPIC_COVER * is_own.sum():
        cue = max(masks, key=specificity)
        if not (masks[cue] & is_own & ~scope).any():
            break
        scope |= masks.pop(cue)
        named.add(cue)
    return scope, named


PLACE = "place"  # what joins units of one such place in `finding_groups`, in place of a latent
# Places that join alone: a layout, one named word before ('lord' and 'mother' right after 'my'), or
# one cue word before, in any scope ('were' and 'be' with 'if' among the words before). A class
# before ("after an auxiliary", "after punctuation") is too broad to: it needs a latent.
PLACES_THAT_JOIN = ("layout", "form", *context.CUE_KINDS)


def _kept_units(tested: list[Tested], inputs: FindingInputs, fires: np.ndarray, column: dict[int, int]) -> list[Tested]:
    """What passed, as units of one difference each: nested rules joined, sets a rule states
    absorbed, and sets kept only where they add a difference beyond their rules."""
    fcfg, top = inputs.fcfg, inputs.top

    def coherent(t: Tested) -> bool:
        if t.kind != "rule" or fcfg.min_rule_f1 <= 0:
            return True
        union_fires = fires[:, [column[m] for m in t.latents]].any(axis=1)
        member_top = np.unique(np.concatenate([top_words(top, "holdout", m) for m in t.latents]))
        return fit_rule(t.rule, inputs.attrs, member_top, union_fires, inputs.rows_by_split["holdout"]).f1 >= fcfg.min_rule_f1

    kept = [t for t in tested if t.passed and coherent(t)]
    units = _rule_units([t for t in kept if t.kind == "rule"], inputs.attrs, inputs.lp_by_row, fcfg)
    for u, carriers in zip(units, carrying_latents(units, top, sorted(column), fcfg.rule_min_share)):
        u.carriers = [m for m in carriers if m not in u.latents]
        u.place = unit_place(u, inputs.attrs)
    sets = [
        s for s in _absorb_stated_sets(units, [t for t in kept if t.kind == "latent"]) if _more_than_its_rules(s, units, inputs.attrs, inputs.lp_by_row, fcfg)
    ]
    for s in sets:
        _narrow(s, inputs.attrs, inputs.lp_by_row)
        if s.word_set.suffix and s.word_set.left_forms:
            _ending_after_forms(s, inputs.attrs, inputs.lp_by_row, inputs.rows_by_split, fcfg.min_abs_median_dlogp)
        s.place = unit_place(s, inputs.attrs)
    for u in units + sets:
        u.token_kind = token_kind(inputs.attrs, u.holdout_rows)
    return units + sets


def rule_tested_findings(feats: Sequence[dict], inputs: FindingInputs) -> FindingTables:
    """Candidates proposed, tested in one BH family, kept ones joined into units and units that
    nest into findings; each finding's words are its units' words."""
    fcfg = inputs.fcfg
    # Any latent may propose: one that mixes words where a model wins with words where nothing
    # differs does not pass the effect rule on its top words, yet its winning words may form a group.
    proposers = sorted({r["latent"] for r in feats if r["n_top"] >= fcfg.min_activations})
    fires = inputs.fires_of(proposers)
    column = {latent: j for j, latent in enumerate(proposers)}
    tested, first_rule = propose_candidates(feats, inputs, fires, column)
    test_candidates(tested, inputs.lp_by_row, fcfg, inputs.seed, inputs.doc_by_row)
    units = _kept_units(tested, inputs, fires, column)
    groups = joined_with_topics(finding_groups(units, fcfg.finding_overlap), units, inputs.attrs, inputs.rows_by_split["train"], inputs.lp_by_row, fcfg)
    words_of = [finding_rows([units[i] for i in g], inputs.lp_by_row, fcfg.finding_overlap) for g in groups]
    own = own_differences(words_of, [units[g[0]].key for g in groups], inputs.lp_by_row, fcfg)
    made = [(_finding_row(g, units, rows, inputs, fires, column), rows) for g, rows, mine in zip(groups, words_of, own) if mine]
    made = [(f, rows) for f, rows in made if f is not None]
    findings = [dict(f, finding=i) for i, (f, _) in enumerate(made)]
    finding_words = [(i, split, rows[split]) for i, (_, rows) in enumerate(made) for split in ("train", "holdout")]
    findings, finding_words, _ = number_by_effect(findings, finding_words)
    features = _mark_members(feats, findings, finding_words, inputs, fires, column, first_rule)
    searched = searched_candidates(tested, inputs.attrs, inputs.rows_by_split, inputs.lp_by_row, inputs.pairs, fcfg)
    differences = baseline_differences(searched, inputs.lp_by_row, fcfg, inputs.seed, inputs.doc_by_row)
    holdout_words = {f: rows for f, split, rows in finding_words if split == "holdout"}
    findings = [dict(f, single_rule=single_rule_states(f, differences, holdout_words)) for f in findings]
    return FindingTables(features, findings, [tested_row(t) for t in tested], finding_words, baseline_table(differences, findings, holdout_words))


# A latent's group whose words kept rules hold at least this share of adds no word a reader needs
# (`_more_than_its_rules`).
RULE_STATES = 0.8
# A finding is said by its rules when they hold every one of its held-out words and, when it holds
# a latent's group, are at most this many; else by its words. At 80% of the words (the bound this
# replaced) a statement could be untrue of a fifth of them: on planted animals "a group of 25 word
# forms, most often 'wolf', 'deer', 'cat'" (one member's set) was true of 82% of its held-out words.
MAX_STATING_RULES = 3


def finding_rows(members: list[Tested], lp_by_row: dict[str, np.ndarray], containment: float) -> dict:
    """A finding's words ("train", "holdout": sorted row ids) and the members whose words it holds
    all of ("whole"), largest first: a member lying (>= `containment`) inside the words gathered so
    far adds its other words only when, on train, they differ too (`findings.adds_the_difference`).
    Planted Handbook passives: "a lower-case word right after 'be'" and "'stored'" lie mostly inside
    "a word ending in '-ed' right after an auxiliary verb", and joining all of their words put "be
    able", "be a" and 'stored' in a list into the finding, 31% of whose held-out words were then
    not passives. A member that does not lie inside (a form opening a line beside another) is
    another part of the finding and brings all its words."""
    a, b = members[0].pair
    order = sorted(range(len(members)), key=lambda i: -len(members[i].holdout_rows))
    train, holdout = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    whole = []
    for i in order:
        u = members[i]
        inside = len(holdout) > 0 and shared_count(u.holdout_rows, holdout) >= containment * len(u.holdout_rows)
        if inside and not adds_the_difference(u.train_rows, train, lp_by_row[a], lp_by_row[b], u.sign):
            continue
        train, holdout = np.union1d(train, u.train_rows), np.union1d(holdout, u.holdout_rows)
        whole.append(i)
    return {"train": train, "holdout": holdout, "whole": sorted(whole)}


# A finding sharing at least this share of its train words with a larger one of the same winner is
# its own difference only where its other words differ too (`own_differences`).
OWN_OVERLAP = 0.2


def own_differences(words_of: list[dict], keys: list[tuple], lp_by_row: dict[str, np.ndarray], fcfg: FeaturesConfig) -> list[bool]:
    """Per finding (its words, its pair and sign), whether it is a difference of its own: not when a
    part of its train words lies in a larger finding of the same pair and winner and the rest do not
    differ on train (their median fails the effect rule). Planted: "punctuation right after '3'" was
    half the words of the finding ')' and half words where nothing differs; its difference was the
    other finding's. Not a ratio to the shared words' difference: punctuation after 'lord', half of
    it commas, differs outside the commas too, by less than where both differences add up. Largest
    first, so that a finding dropped drops no other."""
    order = sorted(range(len(words_of)), key=lambda i: -len(words_of[i]["train"]))
    own = [True] * len(words_of)
    for rank, i in enumerate(order):
        mine = words_of[i]["train"]
        for j in order[:rank]:
            if not own[j] or keys[j] != keys[i] or not len(mine):
                continue
            shared = in_sorted(mine, words_of[j]["train"])
            (a, b), sign = keys[i]
            if shared.mean() >= OWN_OVERLAP and not differs(mine[~shared], lp_by_row[a], lp_by_row[b], sign, fcfg):
                own[i] = False
                break
    return own


def differs(rows: np.ndarray, lp_a: np.ndarray, lp_b: np.ndarray, sign: int, fcfg: FeaturesConfig) -> bool:
    """Whether `rows` show the difference in `sign`'s direction by the effect rule (median Δlog p or Δp)."""
    if len(rows) == 0:
        return False
    dlogp = sign * float(np.median(lp_a[rows] - lp_b[rows]))
    dp = sign * float(np.median(np.exp(lp_a[rows]) - np.exp(lp_b[rows])))
    return dlogp > fcfg.min_abs_median_dlogp or dp > fcfg.min_abs_median_dp


def union_holds(stats: dict, sign: int, fcfg: FeaturesConfig) -> bool:
    """Whether a finding's own held-out words, tested as one candidate, still show the difference:
    the effect rule on their median and its CI (documents resampled) on the winner's side. The
    members passed one by one; what joins them, or narrows a class to its carrying members, is
    chosen on train and must hold on the words it ends up with."""
    med, mdp = stats["holdout_median_dlogp"], stats["holdout_median_dp"]
    large = abs(med) > fcfg.min_abs_median_dlogp or abs(mdp) > fcfg.min_abs_median_dp
    low, high = stats["holdout_ci_low"], stats["holdout_ci_high"]
    return bool(large and np.sign(med) == sign and (low > 0 if sign > 0 else high < 0))


def _finding_row(group: list[int], units: list[Tested], rows: dict, inputs: FindingInputs, fires: np.ndarray, column: dict[int, int]) -> dict | None:
    attrs, top, fcfg, lp_by_row = inputs.attrs, inputs.top, inputs.fcfg, inputs.lp_by_row
    holdout = inputs.rows_by_split["holdout"]
    members = [units[i] for i in group]
    a, b = members[0].pair
    sign = members[0].sign
    train_rows, holdout_rows = rows["train"], rows["holdout"]
    # Said by the members whose words it holds whole: a member's rule where only part of its words
    # are the finding's would say words the finding does not hold.
    stating = [members[i] for i in rows["whole"]]
    proposers = _named_latents(members, train_rows, top, fcfg.member_min_share)
    latents = sorted({*proposers, *(m for u in members for m in u.carriers)})
    stats = pair_stats(train_rows, holdout_rows, lp_by_row[a], lp_by_row[b], fcfg.bootstrap_samples, inputs.seed, inputs.doc_by_row)
    if not union_holds(stats, sign, fcfg):
        return None
    # Most held-out words first: the statement names a finding's largest members first.
    rules = [r for u in stating for r in u.stating_rules]
    rules.sort(key=lambda r: -int(np.count_nonzero(r.mask(attrs, holdout_rows))))
    rules = _not_said_twice(rules, attrs, holdout_rows)
    # A latent's group that a long list of one-word rules happens to cover ('disk' or 'machine' or
    # ... 18 of them) reads better as the group: rules say it when they are few.
    few = len(rules) <= MAX_STATING_RULES or all(u.kind == "rule" for u in stating)
    by_rules = bool(rules) and few and bool(any_mask(rules, attrs, holdout_rows).all())
    row = {
        "model_a": a,
        "model_b": b,
        "better_model": a if sign > 0 else b,
        "kind": "rule" if by_rules else "latent",
        "latents": ",".join(str(x) for x in latents),
        "n_latents": len(latents),
        "proposer": proposer_text(any(u.searched for u in members), proposers, sorted({m for u in members for m in u.latents} - set(proposers))),
        "n_units": len(members),
        "q_value": max(u.q_value for u in members),
        "n_top": int(len(train_rows)),
        "holdout_n": int(len(holdout_rows)),
        **finding_stats(stats),
        "top_words": top_forms(inputs.words_by_row[train_rows]),
        "artifact": artifact_of(attrs, holdout_rows),
    }
    if by_rules:
        statement = describe_rules(rules)
        row.update(rule=statement, rule_json=rules_to_json(rules), rule_precision=None, rule_recall=None, rule_f1=None, statement=statement, word_set_json=None)
        if latents:  # how well the rules fit where its latents fire (none: the rule search alone found it)
            union_fires = fires[:, [column[m] for m in latents]].any(axis=1)
            member_top = np.unique(np.concatenate([top_words(top, "holdout", m) for m in latents]))
            fit = fit_rules(rules, attrs, member_top, union_fires, holdout)
            row.update(rule_precision=fit.precision, rule_recall=fit.recall, rule_f1=fit.f1)
    else:
        word_set = statement_word_set(stating, attrs, train_rows, holdout_rows)
        row.update(
            rule=None, rule_json=None, rule_precision=None, rule_recall=None, rule_f1=None, statement=word_set.describe(), word_set_json=word_set.to_json()
        )
    return row


def _named_latents(members: list[Tested], train_rows: np.ndarray, top, min_share: float) -> list[int]:
    """The latents a finding names as its proposers: a latent whose own group of words is a member,
    and a latent that proposed a rule only where the finding's train words hold at least `min_share`
    of its train top words (`findings.expresses`). On the demo 'liege' named latents whose top words
    were 'honour', 'cousin', 'page', 2-10% of them 'liege': they proposed it from a few carrying
    words, but a reader following the name would find another feature."""
    own = {m for u in members if u.kind == "latent" for m in u.latents}
    proposed = {m for u in members for m in u.latents}
    return sorted(m for m in proposed if m in own or expresses(train_rows, top_words(top, "train", m), min_share))


def _not_said_twice(rules: list, attrs: WordAttributes, rows: np.ndarray) -> list:
    """The rules (largest first) but those whose words among `rows` a rule before them already
    holds: "a word inside brackets", not "a word inside brackets or a lower-case word inside brackets"."""
    kept, masks = [], []
    for rule in rules:
        mask = rule.mask(attrs, rows)
        if not any((mask <= m).all() for m in masks):
            kept.append(rule)
            masks.append(mask)
    return kept


def statement_word_set(members: list[Tested], attrs: WordAttributes, train_rows: np.ndarray, holdout_rows: np.ndarray) -> WordSet:
    """What says a finding by its words: the largest member group's own word set when it holds
    every one of the finding's held-out words (an ending set keeps the exclusions it was tested
    with: re-described from the train words, "a word ending in '-ly'" lost them and its definition
    took in 'only', which the tested set left out), else what all its words are."""
    sets = sorted((u for u in members if u.word_set is not None), key=lambda u: -len(u.holdout_rows))
    if sets and sets[0].word_set.mask(attrs, holdout_rows).all():
        return sets[0].word_set
    return describe_words_covered(attrs, np.concatenate([train_rows, holdout_rows]))


def _mark_members(
    feats: Sequence[dict],
    findings: list[dict],
    finding_words: list[tuple[int, str, np.ndarray]],
    inputs: FindingInputs,
    fires: np.ndarray,
    column: dict[int, int],
    first_rule: dict[int, RuleFit],
) -> list[dict]:
    """The feature rows with each latent's findings, rule columns and `kept`: a latent proposing a
    finding is a kept feature when the finding's train words cover at least `member_min_share` of
    its train top words (a latent can propose a confirmed finding from a minority of its top words,
    the ones that carry its difference; the finding stands, but such a mixture is not a feature a
    person can name)."""
    top, attrs, holdout = inputs.top, inputs.attrs, inputs.rows_by_split["holdout"]
    train_words = {f: rows for f, split, rows in finding_words if split == "train"}
    mine: dict[int, list[int]] = {}
    for f in findings:
        for m in latent_ids(f["latents"]):
            mine.setdefault(m, []).append(f["finding"])
    by_id = {f["finding"]: f for f in findings}
    out = []
    for r in feats:
        latent = r["latent"]
        ids = sorted(mine.get(latent, []))
        rules = [rule for f in ids if by_id[f]["rule_json"] for rule in rules_from_json(by_id[f]["rule_json"])]
        rules = rules or ([first_rule[latent].rule] if latent in first_rule else [])
        if not rules:
            columns = rule_columns(None)
        else:
            held = fit_rules(rules, attrs, top_words(top, "holdout", latent), fires[:, column[latent]], holdout)
            columns = {**rule_columns(LatentRule(held, held)), "rule": describe_rules(rules), "rule_json": rules_to_json(rules)}
        kept = bool(ids) and expresses(np.concatenate([train_words[f] for f in ids]), top_words(top, "train", latent), inputs.fcfg.member_min_share)
        out.append({**r, **columns, "kept": kept, "finding": ids[0] if ids else None, "findings": ",".join(str(f) for f in ids) or None})
    return out
