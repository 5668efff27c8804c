"""Raw texts (`verispec.train.texts`) on a small tree made here: which Python files are read,
how they are cut, the guard against benchmark data, the rounds, and data grown from them
without a prompt or a generated answer, every position scored."""

from __future__ import annotations

import sysconfig
import time
from pathlib import Path

import pytest

from verispec.bench.quick import tiny_llama, tiny_tokenizer
from verispec.train.data import DataCache, ResponseRecipe, compute_features, data_recipe, grow
from verispec.train.documents import Passage
from verispec.train.texts import TextRecipe, Texts, code_passages

END = 2  # <|im_end|> of the tiny tokenizer


def function(name: str, lines: int = 12) -> str:
    """A Python function of about 40 characters a line."""
    body = "\n".join(f"    total = total + {i} * value  # step {i}" for i in range(lines))
    return f"def {name}(value):\n    total = 0\n{body}\n    return total\n"


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "alpha.py").write_text("\n\n".join(function(f"alpha_{i}") for i in range(5)))
    (root / "pkg" / "beta.py").write_text(function("beta") + "\n\n" + function("beta_two"))
    (root / "pkg" / "notes.txt").write_text(function("not_python"))
    for skipped in ("test", "site-packages", "__pycache__"):
        (root / skipped).mkdir()
        (root / skipped / "gamma.py").write_text(function(f"skipped_{skipped.strip('_').replace('-', '_')}"))
    (root / "shared" / "data").mkdir(parents=True)
    (root / "shared" / "data" / "bench.py").write_text(function("benchmark"))
    (root / "pkg" / "linked.py").symlink_to(root / "shared" / "data" / "bench.py")
    return root


def test_code_passages_come_from_python_files_outside_skipped_and_benchmark_directories(source):
    recipe = TextRecipe(python_roots=(str(source),), code_min_chars=200, code_max_chars=700, code_per_file=3, documents=None)
    passages = code_passages(recipe)
    names = [p.text.split("(")[0].removeprefix("def ") for p in passages]
    # alpha.py is cut into one passage per function (each ~600 characters), at most 3 of them.
    assert names == ["alpha_0", "alpha_1", "alpha_2", "beta", "beta_two"]
    assert [p.source for p in passages] == ["source:alpha.py"] * 3 + ["source:pkg/beta.py"] * 2
    assert all(200 <= len(p.text) <= 700 for p in passages)
    with pytest.raises(ValueError, match="benchmark data"):
        code_passages(TextRecipe(python_roots=(str(source / "shared"),), documents=None))


def test_rounds_deal_every_passage_once_as_a_function_of_the_seed(source):
    passages = [Passage("x", f"text {i}") for i in range(10)]
    texts = Texts(TextRecipe(python_roots=(str(source),), batch=4, documents=None), passages)
    assert texts.rounds == 3
    dealt = [texts.texts(7, r) for r in range(4)]
    assert [len(d) for d in dealt] == [4, 4, 2, 0]
    assert sorted(t for d in dealt for t in d) == sorted(p.text for p in passages)
    assert dealt == [texts.texts(7, r) for r in range(4)] and dealt != [texts.texts(8, r) for r in range(4)]


def test_default_recipe_reads_the_standard_library_and_records_its_corpus(source):
    assert TextRecipe().roots() == (sysconfig.get_paths()["stdlib"],)
    texts = Texts(TextRecipe(python_roots=(str(source),), code_min_chars=200, code_max_chars=700, documents=None))
    record = texts.as_dict()
    assert record["method"].startswith("texts:") and record["passages"] == record["code_passages"] == 7
    assert record["python_roots"] == [str(source)] and len(record["passages_sha256"]) == 64
    assert data_recipe("m", 0, texts, ResponseRecipe())["responses"] is None
    with pytest.raises(ValueError, match="no Python source"):
        Texts(TextRecipe(python_roots=(str(source / "pkg" / "none"),), documents=None))


def test_grown_texts_are_their_own_tokens_scored_from_the_first_position(source, tmp_path):
    """No prompt and nothing generated (the model is never called): each sequence is the
    passage's tokens, all of them scored; resumed rounds equal one run; growth stops when
    every passage was dealt."""
    tokenizer = tiny_tokenizer()
    texts = Texts(TextRecipe(python_roots=(str(source),), code_min_chars=200, code_max_chars=700, batch=3, documents=None))
    whole, parts = DataCache(tmp_path / "whole"), DataCache(tmp_path / "parts")
    grown = grow(whole, None, tokenizer, (END,), 1, time.monotonic() + 600, texts)
    first = grow(parts, None, tokenizer, (END,), 1, time.monotonic() + 600, texts, max_sequences=2)
    resumed = grow(parts, None, tokenizer, (END,), 1, time.monotonic() + 600, texts)
    assert len(first) == 3 and grown == resumed == parts.conversations()
    assert sorted(c.instruction for c in grown) == sorted(p.text for p in texts.passages)
    for c in grown:
        assert c.prompt_ids == [] and c.answer_ids == list(tokenizer(c.instruction).input_ids) and not c.sampled
    stored, _ = compute_features(tiny_llama(len(tokenizer)), grown[:2])
    assert stored["answer_starts"].tolist() == [0, 0]


def test_cli_trains_on_raw_texts_with_turns_scored(source, tmp_path, monkeypatch):
    """`--prompts texts` makes data without generating (a tiny model saved here), `--score
    turns` is recorded, and the head's config names the texts recipe with no response recipe."""
    from verispec.cli import main
    from verispec.heads import read_config
    from verispec.train import texts as texts_module

    tokenizer = tiny_tokenizer()
    model_dir = tmp_path / "tiny-model"
    tiny_llama(len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    recipe = TextRecipe(python_roots=(str(source),), code_min_chars=200, code_max_chars=700, batch=3, documents=None)
    monkeypatch.setattr(texts_module, "TextRecipe", lambda: recipe)
    out = tmp_path / "head"
    args = ["train", "--model", str(model_dir), "--head", "eagle", "--prompts", "texts", "--minutes", "5", "--out", str(out),
            "--work", str(tmp_path / "work"), "--steps", "3", "--vocab", "32", "--taps", "final", "--score", "turns",
            "--threads", "1", "--dtype", "float32"]
    assert main(args) == 0
    training = read_config(out).training
    assert training["data"]["instructions"]["method"].startswith("texts:") and training["data"]["responses"] is None
    assert training["data"]["sequences"] == 7 and training["settings"]["score"] == "turns" and training["steps"] == 3


def test_cli_refuses_turns_but_trains_on_texts_for_a_model_without_a_chat_template(source, tmp_path, monkeypatch, capsys):
    from verispec.cli import main
    from verispec.train import texts as texts_module

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    model_dir = tmp_path / "plain-model"
    tiny_llama(len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    recipe = TextRecipe(python_roots=(str(source),), code_min_chars=200, code_max_chars=700, batch=3, documents=None)
    monkeypatch.setattr(texts_module, "TextRecipe", lambda: recipe)
    capsys.readouterr()
    args = ["train", "--model", str(model_dir), "--head", "eagle", "--prompts", "texts", "--minutes", "5",
            "--out", str(tmp_path / "head"), "--work", str(tmp_path / "work"), "--steps", "1", "--vocab", "32",
            "--taps", "final", "--score", "turns", "--threads", "1", "--dtype", "float32"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert [line for line in err if line.startswith("error: ")] == err[-1:] and "--score answers" in err[-1]
    assert not (tmp_path / "head").exists() and not (tmp_path / "work" / "data" / "sequences.jsonl").exists()
    args[args.index("turns")] = "answers"  # raw texts need no template: EOS alone closes a text
    assert main(args) == 0 and (tmp_path / "head" / "config.json").is_file()
