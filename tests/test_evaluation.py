import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from bbox_sae.corpus.words import split_words
from bbox_sae.errors import ConfigError
from bbox_sae.evaluation import PlantedRule, load_rules, planted_logprobs, rule_masks

REPO = Path(__file__).resolve().parents[1]


def test_shipped_rules_match_what_they_say():
    rules, noise, seed = load_rules("configs/planted-rules-shakespeare.yaml")
    by_name = {r.name: r for r in rules}
    text = (
        "ROMEO.\nIf it were so, thou art fair? I do not know, my lord, not I; two men.\n\nJULIET.\nThey were here, and thy father too; truly, his hand is cold."
    )
    words = split_words(text)
    hits = {n: [words[i] for i in np.flatnonzero(r.matches(words))] for n, r in by_name.items()}
    assert hits["speech-start"] == ["ROMEO", "JULIET"]
    assert hits["thou-forms"] == [" thou", " thy"]
    assert hits["not-after-auxiliary"] == [" not"]
    assert hits["question-mark"] == ["?"]
    assert hits["number-word"] == [" two"]
    assert hits["my-kin-or-title"] == [" lord"]
    assert hits["body-part"] == [" hand"]
    assert hits["ly-word"] == [" truly"]
    assert noise == 0.1 and seed == 0
    assert len({r.kind for r in rules}) == 8 and {np.sign(r.delta) for r in rules} == {-1, 1}


def test_context_rules_match_what_they_say():
    """The six context rules read the document further left than the word before; the eight are the shipped ones."""
    filler = " ".join(f"w{i}" for i in range(31))
    text = f"[Enter ROMEO.]\nWhy, how sweet it is! {filler} O woe! {filler} sweet"
    rules, words, hits = _context_hits("shakespeare", text, "sweet")
    assert hits["inside-brackets"] == ["Enter", "ROMEO", ".]"]
    assert hits["wh-exclamation"] == ["!"] and hits["other-exclamation"] == ["!"]
    assert hits["text-opening"] == ["[", "Enter", "ROMEO", ".]", "Why", ",", "how", "sweet"]
    assert hits["long-range-repeat"] == ["sweet"]  # the last word: 'sweet' last used 65 words back
    assert "ROMEO" in hits["rare-word"] and "sweet" not in hits["rare-word"]
    assert [words[i] for i in np.flatnonzero(rules[2].matches(words))].count("!") == 1


def test_handbook_rules_match_what_they_say():
    rules, _, _ = load_rules("configs/planted-rules-handbook.yaml")
    text = "Packages (see 2 of them) can be found.\n\nFor example, the package must be 10 MB; for instance, a configuration file. The disk is mounted."
    words = split_words(text)
    hits = {r.name: [words[i].strip() for i in np.flatnonzero(r.matches(words))] for r in rules}
    assert hits == {
        "package-forms": ["Packages", "package"],
        "be-after-modal": ["be", "be"],
        "paragraph-start": ["Packages", "For"],
        "opening-bracket": ["("],
        "number": ["2", "10"],
        "fixed-phrase": ["example", "instance", "file"],
        "hardware": ["disk"],
        "passive-participle": ["mounted"],
    }


def test_rules_may_not_look_right(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("rules:\n  - {name: x, delta: 1, word: ',', next: '^ [A-Z]'}\n")
    with pytest.raises(ConfigError, match="causal"):
        load_rules(p)


def test_planted_logprobs_add_the_delta_only_where_rules_match():
    words = pa.table({"doc_id": ["a"] * 4 + ["b"] * 2, "word": ["If", " it", " were", " so", "If", " were"]})
    rule = PlantedRule(name="w", delta=-3.0, word="(?i)^were$", left="(?i)\\bif\\b")
    masks = rule_masks(words, [rule])
    assert masks["w"].tolist() == [False, False, True, False, False, True]
    lp_a = np.full(6, -2.0)
    lp_b = planted_logprobs(lp_a, masks, [rule], noise_std=0.0, seed=0)
    assert lp_b.tolist() == [-2.0, -2.0, -5.0, -2.0, -2.0, -5.0]
    up = planted_logprobs(lp_a, masks, [PlantedRule(name="w", delta=3.0, word="x")], noise_std=0.0, seed=0)
    assert (up <= 0).all()  # still a valid log-prob


def test_bad_rules_file(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("rules:\n  - {name: x, delta: 1, word: '(unclosed'}\n")
    with pytest.raises(ConfigError, match=r"rules\[0\]"):
        load_rules(p)
    p.write_text("rules:\n  - {name: x, delta: 1, colour: red}\n")
    with pytest.raises(ConfigError, match="colour"):
        load_rules(p)


def test_the_default_rules_are_found_in_an_installed_wheel(tmp_path):
    """An installed wheel has no configs/ beside the package: the default rules ship inside it, the
    same file as the copy in configs/ that users read."""
    source = tmp_path / "source"
    shutil.copytree(REPO / "bbox_sae", source / "bbox_sae", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(tmp_path / "dist"), str(source)]
    subprocess.run(build, check=True, capture_output=True)
    site = tmp_path / "site"
    with zipfile.ZipFile(next((tmp_path / "dist").glob("*.whl"))) as wheel:
        wheel.extractall(site)
    probe = (
        "import types, bbox_sae.evaluation as e; path = e.planted_rules_path(types.SimpleNamespace(planted_rules=None), None); "
        "print(e.__file__); print(path); print(path.read_text() == open({!r}).read())".format(str(REPO / "configs" / "planted-rules-shakespeare.yaml"))
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    module, rules, same = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, check=True, capture_output=True, text=True).stdout.splitlines()
    assert Path(module).is_relative_to(site) and Path(rules).is_relative_to(site) and Path(rules).is_file()
    assert same == "True"


def test_a_split_rule_is_matched_to_the_part_that_recovers_most_of_it():
    """Planted Shakespeare's thou-forms came back as "'thou' or 'thy' or 'thee'" (precision 0.99,
    recall 0.95) and "'thine'" (precision 1.0, recall 0.05): the rule was reported by 'thine'."""
    from bbox_sae.evaluation.recovery import match_rank

    thou, thine, loose = match_rank(0.99, 0.95), match_rank(1.0, 0.05), match_rank(0.6, 1.0)
    assert max([thine, thou, loose]) == thou
    assert max([loose, match_rank(0.5, 1.0)]) == loose  # none recovers: the more precise
    assert match_rank(0.0, 0.0) == (False, 0.0)  # the starting point, beaten by any overlap


def test_handbook_context_rules_match_what_they_say():
    """The Handbook's six context rules beside its eight shipped ones: '.' by how its sentence began
    (the Handbook has few '?' and '!'), quotes, a capitalised word repeated from far back."""
    filler = " ".join(f"w{i}" for i in range(31))
    text = f"When Debian boots, it runs. Debian is “apt update” {filler} stable. {filler} Debian"
    _, _, hits = _context_hits("handbook", text, "debian")
    assert hits["wh-full-stop"] == ["."] and hits["other-full-stop"] == ["."]
    assert hits["inside-quotes"] == ["apt", "update", "”"]
    assert hits["text-opening"] == ["When", "Debian", "boots", ",", "it", "runs"]
    assert hits["long-range-repeat"] == ["Debian"]  # the last word: 'Debian' last used 64 words back
    assert "boots" in hits["rare-word"] and "Debian" not in hits["rare-word"]


def _context_hits(corpus: str, text: str, common: str):
    """A corpus's context rules file (its eight shipped rules first, then six), and per context
    rule the words of `text` it marks, `common` counted as if the corpus held it often."""
    from collections import Counter

    rules, _, _ = load_rules(f"configs/planted-rules-{corpus}-context.yaml")
    shipped, _, _ = load_rules(f"configs/planted-rules-{corpus}.yaml")
    assert rules[: len(shipped)] == shipped and len(rules) == len(shipped) + 6
    words = split_words(text)
    counts = Counter(w.strip().lower() for w in words) + Counter({common: 10})
    hits = {r.name: [words[i].strip() for i in np.flatnonzero(r.matches(words, counts))] for r in rules[len(shipped) :]}
    return rules[len(shipped) :], words, hits
