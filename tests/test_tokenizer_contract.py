"""The tokenizer contract on small byte-level BPE tokenizers trained in code, and variants
made by editing their backend JSON: each kind of difference is found and named in words."""

from __future__ import annotations

import copy
import json
import re

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from verispec.cli import main
from verispec.models.tables import random_table
from verispec.proposers import DraftModel
from verispec.tokenizer_contract import check_tokenizers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def trained_json() -> dict:
    """A 300-token byte-level BPE tokenizer's backend JSON (training is deterministic)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = ["the cat sat on the mat", "a tokenizer for tests", "speculative decoding is exact"]
    tokenizer.train_from_iterator(text * 3, trainer)
    return json.loads(tokenizer.to_str())


BASE = trained_json()


def make(spec: dict | None = None, eos: str = "<|im_end|>", template: str | None = TEMPLATE) -> PreTrainedTokenizerFast:
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec or BASE)),
        bos_token="<|im_start|>",
        eos_token=eos,
        unk_token="<|endoftext|>",
        pad_token=eos,
    )
    tokenizer.chat_template = template
    return tokenizer


def variant(edit) -> dict:
    spec = copy.deepcopy(BASE)
    edit(spec)
    return spec


def swap_specials(spec: dict) -> None:
    """'<|endoftext|>' and '<|im_end|>' trade ids 0 and 2: same size, same token set."""
    vocab = spec["model"]["vocab"]
    vocab["<|endoftext|>"], vocab["<|im_end|>"] = vocab["<|im_end|>"], vocab["<|endoftext|>"]
    for added in spec["added_tokens"]:
        added["id"] = {0: 2, 2: 0}.get(added["id"], added["id"])


def test_identical_tokenizers() -> None:
    report = check_tokenizers(make(), make())
    assert report.identical and report.ok
    assert str(report) == f"target and draft tokenizers are identical ({len(BASE['model']['vocab'])} tokens)"


def test_swapped_special_ids_are_named_by_id() -> None:
    report = check_tokenizers(make(), make(variant(swap_specials)))
    assert not report.ok
    assert report.size[0] == report.size[1]
    assert report.mismatches[0] == (
        "target and draft tokenizers differ at id 0 ('<|endoftext|>' vs '<|im_end|>') and at 1 more id"
    )
    assert "eos tokens differ: target '<|im_end|>' (id 2) vs draft '<|im_end|>' (id 0)" in report.mismatches
    assert "unk tokens differ: target '<|endoftext|>' (id 0) vs draft '<|endoftext|>' (id 2)" in report.mismatches


def test_one_renamed_token() -> None:
    vocab = BASE["model"]["vocab"]
    in_merges = {piece for merge in BASE["model"]["merges"] for piece in (*merge, "".join(merge))}
    # A byte the training text never merges, so renaming it leaves the merges valid.
    token = max((t for t in vocab if t not in in_merges and t not in SPECIALS), key=vocab.get)
    spec = variant(lambda s: s["model"]["vocab"].update({"zzz": s["model"]["vocab"].pop(token)}))
    report = check_tokenizers(make(), make(spec), names=("A", "B"))
    assert report.mismatches[0] == f"A and B tokenizers differ at id {vocab[token]} ({token!r} vs 'zzz')"


def test_an_extra_token_and_its_count() -> None:
    extended = make()
    extended.add_tokens(["<tool>"], special_tokens=True)
    report = check_tokenizers(make(), extended)
    n = len(BASE["model"]["vocab"])
    assert report.mismatches[0] == (
        f"target and draft tokenizers differ at id {n} (no token vs '<tool>') ({n} vs {n + 1} tokens)"
    )
    assert any(m.startswith(f"special token ids differ: only draft marks {n} special") for m in report.mismatches)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda s: s.update(normalizer={"type": "Lowercase"}), 'normalizers differ: target null vs draft {"type": "Lowercase"}'),
        (
            lambda s: s["pre_tokenizer"].update(add_prefix_space=True),
            "pre-tokenizers differ at add_prefix_space: target false vs draft true",
        ),
        (
            lambda s: s.update(decoder={"type": "Fuse"}),
            # Components of different types are shown whole (long JSON is cut with "...").
            ('decoders differ: target {"type": "ByteLevel", ', '... vs draft {"type": "Fuse"}'),
        ),
        (lambda s: s["model"].update(byte_fallback=True), "tokenization models differ at byte_fallback: target false vs draft true"),
        (
            lambda s: s["added_tokens"][1].update(lstrip=True),
            "added-token settings differ at [1].lstrip: target false vs draft true",
        ),
    ],
)
def test_pipeline_differences_are_described(edit, expected: str | tuple[str, ...]) -> None:
    """expected: the sentence, or its literal parts around elided text."""
    parts = (expected,) if isinstance(expected, str) else expected
    report = check_tokenizers(make(), make(variant(edit)))
    assert len(report.mismatches) == 1
    assert re.fullmatch(".*".join(map(re.escape, parts)), report.mismatches[0])


def test_reordered_merges_with_the_same_vocabulary() -> None:
    def reorder(spec: dict) -> None:
        merges = spec["model"]["merges"]
        merges[3], merges[4] = merges[4], merges[3]

    report = check_tokenizers(make(), make(variant(reorder)))
    first, second = (" ".join(m) for m in BASE["model"]["merges"][3:5])
    n = len(BASE["model"]["merges"])
    assert report.mismatches == (f"BPE merges differ at merge 3 ({first!r} vs {second!r}; {n} vs {n} merges)",)


def test_a_different_chat_template_is_only_a_note() -> None:
    report = check_tokenizers(make(), make(template=None))
    assert report.ok and not report.identical
    assert len(report.notes) == 1 and report.notes[0].startswith("chat templates differ (sha256 ")
    assert report.notes[0].endswith(" vs draft none)")
    assert str(report).startswith("target and draft tokenizers match:\n- note: chat templates differ")


def test_draft_model_refuses_a_mismatched_pair() -> None:
    draft_lm = random_table(vocab=3, order=1, seed=0)
    with pytest.raises(ValueError, match=r"differ at id 0 \('<\|endoftext\|>' vs '<\|im_end\|>'\)"):
        DraftModel(draft_lm, tokenizers=(make(), make(variant(swap_specials))))
    assert DraftModel(draft_lm, tokenizers=(make(), make(template=None))).model is draft_lm


def test_cli_exit_codes_and_report(tmp_path, capsys) -> None:
    for name, tokenizer in [("a", make()), ("same", make()), ("swapped", make(variant(swap_specials)))]:
        tokenizer.save_pretrained(tmp_path / name)
    assert main(["check-tokenizers", str(tmp_path / "a"), str(tmp_path / "same")]) == 0
    assert "tokenizers are identical" in capsys.readouterr().out
    assert main(["check-tokenizers", str(tmp_path / "a"), str(tmp_path / "swapped")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("target and draft tokenizers do not match:\n- target and draft tokenizers differ at id 0")
    assert main(["check-tokenizers", str(tmp_path / "a"), str(tmp_path / "absent")]) == 2
    assert "error: no model" in capsys.readouterr().err
