"""The trained heads (EAGLE, EAGLE-3, Medusa, and lookup+eagle) drafting for the static runtime,
through its eager path on the CPU: the head is built on the target's device and reads the
runtime's features, the engine equals the full-recompute reference (chains and trees), and
greedy speculative output is plain greedy output on the deterministic runtime.

Where the head computes (on a GPU: the target's device, in the target's dtype or float32 under
`weights=auto`) is checked without a GPU by running its forwards on the meta device, where any
tensor left on the host inside a head forward fails.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from test_eagle3 import eagle3_head
from test_heads import hf_head, tiny_llama

from verispec import GREEDY, SamplingParams, TorchRandom, generate
from verispec.batching import Scheduler
from verispec.heads import for_drafting, save_head
from verispec.heads.config import FINAL
from verispec.models.runtimes.static_llama import StaticLlama
from verispec.models.weight_format import WeightFormat
from verispec.policies import ConstantTree
from verispec.proposers import PromptLookup
from verispec.proposers.copy_or_head import CopyOrHead
from verispec.proposers.eagle import EagleProposer
from verispec.proposers.medusa import MedusaProposer
from verispec.proposers.trained import auto_head_format, drafting_format, head_proposer
from verispec.reference import reference_generate
from verispec.request import Request
from verispec.tree_shape import TreeShape

KINDS = ("eagle", "eagle3", "medusa", "lookup+eagle")


pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=5)


def proposer(kind: str, lm: StaticLlama, packed: str | None = "float"):
    """An untrained head of `kind` for `lm` (its drafts are often rejected: every repair path)."""
    if kind == "eagle3":
        head = eagle3_head(lm)
    else:
        head = hf_head("medusa" if kind == "medusa" else "eagle", lm, taps=(FINAL,) if kind == "medusa" else (FINAL, 2))
    head = for_drafting(head, packed) if packed else head
    drafter = (MedusaProposer if kind == "medusa" else EagleProposer)(head, lm)
    return CopyOrHead(PromptLookup(min_ngram=2), drafter) if kind == "lookup+eagle" else drafter


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(0.7, top_p=0.9)], ids=str)
def test_engine_equals_the_reference_with_a_head_on_the_static_runtime(model, kind, sampling) -> None:
    lm = StaticLlama.from_hf(model, rows=4, context=32, deterministic=False)
    prompt = [5, 6, 7, 5, 6, 9]
    options = dict(max_new_tokens=16, sampling=sampling, k=3)
    engine = generate(lm, proposer(kind, lm), prompt, seed=4, **options)
    assert engine.tokens == reference_generate(lm, proposer(kind, lm), prompt, rng=TorchRandom(4), **options)
    assert sum(engine.stats.drafted) > 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_greedy_with_a_head_is_plain_greedy(model, kind, dtype) -> None:
    lm = StaticLlama.from_hf(model, dtype=dtype, rows=4, context=32)
    drafter = proposer(kind, lm, packed=None if dtype == torch.bfloat16 else "float")
    for prompt in ([7, 3], [9, 8, 7, 6, 9, 8, 7]):
        plain = generate(lm, None, prompt, max_new_tokens=20, sampling=GREEDY, k=0).tokens
        for k in (1, 4):
            run = generate(lm, drafter, prompt, max_new_tokens=20, sampling=GREEDY, k=k)
            assert run.tokens == plain and sum(run.stats.drafted) > 0, (prompt, k)


def test_a_head_directory_loads_beside_the_static_runtime(model, tmp_path) -> None:
    lm = StaticLlama.from_hf(model, dtype=torch.bfloat16, rows=4, context=32)
    save_head(hf_head("eagle", lm, taps=(FINAL, 2)), tmp_path / "eagle")
    head = head_proposer("eagle", str(tmp_path / "eagle"), lm, "bfloat16")
    assert head.device == lm.device and head.head.dtype == torch.bfloat16
    prompt = [4, 8, 15, 16, 23]
    plain = generate(lm, None, prompt, max_new_tokens=16, sampling=GREEDY, k=0).tokens
    assert generate(lm, CopyOrHead(PromptLookup(), head), prompt, max_new_tokens=16, sampling=GREEDY, k=3).tokens == plain


def test_a_head_beside_a_gpu_target_drafts_in_its_dtype_and_never_in_int8() -> None:
    def target(device: str, dtype: torch.dtype) -> SimpleNamespace:
        return SimpleNamespace(input_embeddings=lambda: torch.empty(2, 2, dtype=dtype, device=device))

    assert auto_head_format("cuda", torch.bfloat16) is WeightFormat.BFLOAT16
    assert auto_head_format("cuda", torch.float16) is auto_head_format("cuda:1", torch.float32) is WeightFormat.FLOAT32
    assert drafting_format("auto", target("meta", torch.bfloat16)) is WeightFormat.BFLOAT16
    assert drafting_format("auto", target("cpu", torch.bfloat16)) is auto_head_format()
    with pytest.raises(ValueError, match="int8 on torch's CPU kernel and this target runs on meta; use weights=auto"):
        drafting_format("int8", target("meta", torch.bfloat16))


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "medusa"])
def test_a_head_forward_runs_on_the_targets_device(model, kind, monkeypatch) -> None:
    """The proposer's head forwards (a catch-up over several pairs, a drafting step, an EAGLE
    tree level) for a target on another device than the CPU: the meta device, where torch
    refuses any tensor of the host in an operation, so a tensor the head makes on the host
    fails here as it would on a GPU. Meta tensors hold no values: the logits' crossing to the
    host (`to_host`) is stood in for by empty host rows, the pruned vocabulary (read on the host)
    is left out, and no token is drawn."""
    for module in ("eagle", "medusa"):
        monkeypatch.setattr(f"verispec.proposers.{module}.to_host", lambda t: torch.empty_like(t, device="cpu"))
    monkeypatch.setattr("verispec.proposers.head.HeadVocab", lambda d2t, vocab_size: None)  # reads d2t's values
    lm = StaticLlama.from_hf(model, dtype=torch.bfloat16, device="meta", rows=4, context=32)
    if kind == "eagle3":  # a fresh EAGLE-3 head copies the target's rows into its own: built on the host, moved
        head = eagle3_head(StaticLlama.from_hf(model, rows=4, context=32)).to("meta")
        head.embedding = lm.input_embeddings()
        drafter = EagleProposer(for_drafting(head), lm)
    else:
        drafter = proposer(kind, lm)
    assert drafter.device.type == "meta"
    context = [5, 6, 7, 8, 9]
    drafter.begin(context, GREEDY)
    lm.prefill(context[:-1])
    if kind == "medusa":
        assert drafter.head(drafter._state(context)).device.type == "meta"
        return
    cache, logits, predicted = drafter._state(context)
    assert logits.device.type == "meta" and predicted.device.type == "meta"  # the host reads a draft, not the rows
    step = drafter.head(torch.tensor([[3]], device=drafter.device), predicted[None, None], cache)
    assert all(t.device.type == "meta" for t in step)
    if kind == "eagle":  # EAGLE-3 sizes its rotary tables from a tree level's positions, read back
        after = {(): (logits, predicted, ())}
        drafter._feed(cache, cache.get_seq_length(), after, [(3,), (4,)])
        assert after[(3,)][0].device.type == "cpu" and after[(4,)][1].device.type == "meta"


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(0.7, top_p=0.9)], ids=str)
def test_head_trees_on_the_static_runtime_equal_the_reference_and_plain(model, kind, sampling) -> None:
    """Trees (`TreeScoring` in the runtime's fixed shape): the engine equals the reference, and
    greedy tree decoding on the deterministic runtime is plain greedy decoding."""
    lm = StaticLlama.from_hf(model, rows=8, context=32)
    shape = ConstantTree(TreeShape.of([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]))
    prompt = [5, 6, 7, 5, 6, 9]
    options = dict(max_new_tokens=16, sampling=sampling, k=shape)
    engine = generate(lm, proposer(kind, lm), prompt, seed=4, **options)
    assert engine.tokens == reference_generate(lm, proposer(kind, lm), prompt, rng=TorchRandom(4), **options)
    assert engine.stats.tree_rounds > 0
    if sampling.greedy:
        assert engine.tokens == generate(lm, None, prompt, max_new_tokens=16, sampling=GREEDY, k=0).tokens


def test_a_tree_of_more_rows_than_the_bucket_runs_in_several_forwards_of_the_same_shape(model) -> None:
    lm = StaticLlama.from_hf(model, rows=4, context=32)
    prompt, tokens, parents = [3, 4, 5], [6, 7, 8, 9, 10, 11, 12], [-1, 0, 0, 1, 2, 4, 3]
    lm.prefill(prompt)
    calls = []
    original = lm.model._forward
    lm.model._forward = lambda *args: calls.append(args[1].shape) or original(*args)
    try:
        tree = lm.extend_tree(tokens, parents)  # [7, V]: rows 4.. see their ancestors in the cache
    finally:
        lm.model._forward = original
    assert calls == [(1, 4), (1, 4)]
    for node, path in ((5, [0, 2, 4, 5]), (6, [0, 1, 3, 6])):
        torch.testing.assert_close(tree[node], lm.score(prompt + [tokens[i] for i in path])[-1], atol=1e-5, rtol=0)
    lm.keep_path([0, 1, 3, 6])
    torch.testing.assert_close(lm.extend([9]), lm.score(prompt + [6, 7, 9, 12, 9])[-1:], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="trees of at most 128 nodes, and this one has 129; draft a smaller tree"):
        lm.extend_tree([1] * 129, [-1] + list(range(128)))


def test_heads_on_the_schedulers_slots_decode_as_plain(model) -> None:
    """Each request's head on its own slot (its features recorded there), several slots in one
    forward: greedy output equals plain greedy decoding of each prompt alone."""
    lm = StaticLlama.from_hf(model, rows=4, context=32)
    scheduler = Scheduler(lm, lambda request, slot: (proposer(request.proposer, slot), request.k), max_slots=3)
    prompts = [[5, 9, 14, 5, 9, 30], [17, 3], [40, 41, 42, 43, 40, 41]]
    plain = [generate(lm, None, p, max_new_tokens=20, sampling=GREEDY, k=0).tokens for p in prompts]
    jobs = [scheduler.submit(Request(tuple(p), 20, sampling=GREEDY, proposer=kind, k=3))
            for p, kind in zip(prompts, ("eagle", "medusa", "lookup+eagle"))]
    scheduler.run()
    assert [job.tokens for job in jobs] == plain and max(scheduler.step_rows) > 4


def test_a_head_for_a_target_without_features_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="object has no feature channel"):
        head_proposer("eagle", None, object())


@pytest.mark.slow
def test_the_shipped_head_drafts_for_the_default_model_on_the_static_runtime(default_float32) -> None:
    """lookup+eagle with the shipped head (the default proposer, on every device) on the default
    model in bfloat16 on the static runtime: greedy output is plain greedy output."""
    from verispec.registry import build_proposer

    lm = StaticLlama.from_hf(default_float32.model, dtype=torch.bfloat16, rows=8, context=128)
    loaded = dataclasses.replace(default_float32, lm=lm)
    prompt = default_float32.encode("List three uses of a paperclip, then explain which one is the most surprising.")
    options = dict(max_new_tokens=32, sampling=GREEDY, eos_token_id=default_float32.eos_token_id)
    plain = generate(lm, None, prompt, k=0, **options)
    run = generate(lm, build_proposer("lookup+eagle", loaded), prompt, k=4, **options)
    assert run.tokens == plain.tokens and len(plain.tokens) > 5 and sum(run.stats.drafted) > 0
