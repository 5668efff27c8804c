"""Trained-head machinery: the feature channel (tables, the HF adapter, the feature store),
the pruned head vocabulary, the EAGLE and Medusa modules (shapes, cache = full recompute),
their checkpoint directories, and the proposers (engine = reference, empty drafts, refusals)."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from verispec import GREEDY, SamplingParams, TorchRandom, generate
from verispec.heads.untrained import TINY_LAYER, tiny_head
from verispec.heads import (
    HeadConfig, HeadVocab, TargetInfo, average_heads, for_drafting, load_head, load_weights, new_head, read_config,
    read_weights, save_head, target_info, write_head,
)
from verispec.heads.config import FINAL, eagle3_layers
from verispec.heads.drafting_layer import DraftingLayer
from verispec.models.features import FeatureStore
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.formats.linear import DenseLinear, Int8Linear, PackedLinear, prepacks
from verispec.models.loading.load import LoadedModel
from verispec.models.tables import random_table
from verispec.policies import ConstantTree
from verispec.proposers.eagle import EagleProposer
from verispec.proposers.layer_skip import LayerSkip
from verispec.proposers.medusa import MedusaProposer
from verispec.registry import build_proposer
from verispec.reference import reference_generate
from verispec.sampling import probabilities
from verispec.tree_shape import TreeShape

VOCAB = 48


def tiny_llama(seed: int = 0, layers: int = 3, hidden: int = 16) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    return LlamaForCausalLM(config).eval()


def hf_head(kind: str, lm: HFCausalLM, taps=(FINAL,), n: int = 40, trained_output: bool = False, depth: int = 1):
    layer = {**TINY_LAYER, "num_attention_heads": 4, "num_key_value_heads": 2}
    config = HeadConfig(kind, target_info(lm, "tiny"), taps, vocab_size=n, trained_output=trained_output,
                        layer=layer if kind == "eagle" else {}, heads=3 if kind == "medusa" else 0, depth=depth)
    with torch.random.fork_rng():
        torch.manual_seed(1)
        return new_head(config, torch.arange(0, 2 * n, 2)[:n] if 2 * n <= VOCAB else torch.arange(n), lm).eval()


# --- the feature channel ---------------------------------------------------------------------


def test_feature_store_follows_appends_and_rollbacks():
    store = FeatureStore(2)
    store.add(FINAL, 0)
    store.append({FINAL: torch.tensor([[0.0, 1], [2, 3]])})
    store.append({FINAL: torch.tensor([[4.0, 5], [6, 7], [8, 9]])})
    store.truncate(3)
    store.append({FINAL: torch.tensor([[10.0, 11]])})
    assert store.read([FINAL], 1, 4).tolist() == [[2, 3], [4, 5], [10, 11]]
    assert store.read([FINAL], 4, 4).shape == (0, 2)
    store.add(1, 4)  # recorded from position 4 on
    with pytest.raises(ValueError, match="recorded from position 4 on, position 0 was asked"):
        store.read([1], 0, 4)
    with pytest.raises(ValueError, match="tap 2 is not recorded"):
        store.read([2], 0, 1)
    with pytest.raises(ValueError, match="positions 0..4 asked, 4 positions processed"):
        store.read([FINAL], 0, 5)
    store.reset()
    store.append({FINAL: torch.zeros(1, 2), 1: torch.ones(1, 2)})
    assert store.read([1, FINAL], 0, 1).tolist() == [[1, 1, 0, 0]]


def test_table_features_are_a_function_of_the_context_and_roll_back():
    table = random_table(4, 2, seed=7)
    ids = [1, 2, 3, 1, 2]
    table.prefill(ids[:2])
    table.extend([3, 1, 0])  # the last one rejected
    table.rollback(4)
    table.extend([2])
    incremental = table.features([FINAL, 2], 0, 5)
    assert incremental.shape == (5, 2 * table.hidden_size)
    assert torch.equal(incremental, table.score_features(ids, [FINAL, 2]))
    assert torch.equal(incremental[4], incremental[1])  # the same order-2 key (1, 2)
    assert not torch.equal(incremental[3], incremental[2])
    with pytest.raises(ValueError, match="neither 'final' nor a layer number in 1..2"):
        table.features([3], 0, 1)


def test_hf_features_equal_hidden_states_and_survive_rollback():
    model = tiny_llama()
    lm = HFCausalLM(model)
    lm.record_features([FINAL, 2])
    ids = [3, 5, 7, 9, 11, 13, 15]
    lm.prefill(ids[:3])
    lm.extend([ids[3], 40, 41], keep=1)  # two rejected drafts
    lm.rollback(4)
    lm.extend(ids[4:7])
    incremental = lm.features([FINAL, 2], 0, 7)  # [7, 2H]
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    H = model.config.hidden_size
    torch.testing.assert_close(incremental[:, :H], out.hidden_states[-1][0], atol=1e-5, rtol=1e-5)  # final norm
    torch.testing.assert_close(incremental[:, H:], out.hidden_states[2][0], atol=1e-5, rtol=1e-5)  # layer 2
    torch.testing.assert_close(lm.score_features(ids, [FINAL, 2]), incremental, atol=1e-5, rtol=1e-5)
    # FINAL is the output head's input: logits = FINAL @ W.T
    torch.testing.assert_close(incremental[:, :H] @ lm.output_embeddings().T, out.logits[0], atol=1e-4, rtol=1e-4)


def test_hf_features_ignore_a_layer_skip_draft_sharing_the_layers():
    model = tiny_llama()
    lm = HFCausalLM(model)
    lm.record_features([1])
    draft = LayerSkip(lm, layers=2)
    draft.begin([1], GREEDY)
    lm.prefill([4, 5])
    draft.model.prefill([4, 5, 6, 7])  # a forward through the shared layer 1
    assert lm.features([1], 0, 2).shape == (2, model.config.hidden_size)
    lm.extend([6])
    assert lm._features.length == lm.length == 3


def test_hf_features_need_recording_before_prefill():
    lm = HFCausalLM(tiny_llama())
    lm.prefill([1, 2, 3])
    lm.record_features([FINAL])
    with pytest.raises(ValueError, match="call record_features before prefill"):
        lm.features([FINAL], 0, 3)
    lm.prefill([1, 2, 3])
    assert lm.features([FINAL], 0, 3).shape == (3, 16)


# --- the pruned vocabulary --------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(0.5, top_k=2), SamplingParams(top_p=0.6),
                                      SamplingParams(min_p=0.3)], ids=str)
def test_head_q_equals_the_transforms_of_the_full_row_masked_outside_the_vocabulary(sampling):
    vocab = HeadVocab([1, 4, 5, 8], vocab_size=10)
    logits = torch.tensor([0.3, -1.0, 2.0, 0.5], dtype=torch.float64)
    full = torch.full((1, 10), -math.inf, dtype=torch.float64)
    full[0, vocab.d2t] = logits
    q = vocab.q(logits, sampling)
    torch.testing.assert_close(q, probabilities(full, sampling)[0])
    assert q.shape == (10,) and float(q.sum()) == pytest.approx(1) and q[[0, 2, 3, 6, 7, 9]].abs().sum() == 0
    token, reported = vocab.draw(logits, sampling, TorchRandom(0))
    assert token in vocab.d2t.tolist() and torch.equal(reported, q)
    assert vocab.draw(logits, GREEDY, TorchRandom(0)) == (5, None)


@pytest.mark.parametrize(("d2t", "message"), [([], "at least one"), ([1, 10], "id 10 is outside"),
                                              ([2, 2], "distinct"), ([3, 1], "sorted")])
def test_head_vocabulary_refuses_bad_ids(d2t, message):
    with pytest.raises(ValueError, match=message):
        HeadVocab(d2t, vocab_size=10)


# --- the modules and their checkpoints --------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 2])
def test_eagle_head_shapes_and_cache_equal_full_recompute(depth):
    lm = HFCausalLM(tiny_llama())
    lm.record_features(eagle3_layers(3))
    head = hf_head("eagle", lm, taps=eagle3_layers(3), depth=depth)
    ids = torch.tensor([[3, 5, 7, 9, 11, 13]])  # [1, T + 1]
    features = lm.score_features(ids[0].tolist(), eagle3_layers(3))[None]  # [1, T + 1, 3H]
    with torch.no_grad():
        logits, predicted = head(ids[:, 1:], head.fuse(features[:, :-1]))
        assert logits.shape == (1, 5, 40) and predicted.shape == (1, 5, 16)
        cache = head.new_cache()
        first, _ = head(ids[:, 1:3], head.fuse(features[:, :2]), cache)
        head(torch.tensor([[0, 1]]), predicted[:, :2], cache)  # drafted pairs, then rolled back
        cache.crop(-2)
        rest, rest_predicted = head(ids[:, 3:], head.fuse(features[:, 2:-1]), cache)
    torch.testing.assert_close(torch.cat([first, rest], 1), logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rest_predicted, predicted[:, 2:], atol=1e-5, rtol=1e-5)
    batch = torch.cat([ids, ids.flip(1)])  # training batches: [B, T]
    feats = torch.cat([features, features.flip(1)])
    assert head(batch[:, 1:], head.fuse(feats[:, :-1]))[0].shape == (2, 5, 40)


def test_eagle_head_takes_an_unroll_mask_and_positions():
    """A training-time-test unroll: step 1 sits at positions t + 1 and sees step 0's causal
    prefix plus its own diagonal."""
    table = random_table(5, 2, seed=1)
    head = tiny_head("eagle", table)
    ids = torch.tensor([[1, 2, 3, 4, 0, 1]])
    hidden = head.fuse(table.score_features(ids[0].tolist(), head.config.feature_layers)[None, :-1])  # [1, 5, H]
    T = 5
    cache = head.new_cache()
    with torch.no_grad():
        default, predicted = head(ids[:, 1:], hidden)
        step0, _ = head(ids[:, 1:], hidden, cache, positions=torch.arange(T)[None],
                        allowed=torch.ones(T, T, dtype=torch.bool).tril())
        allowed = torch.cat([torch.ones(T, T, dtype=torch.bool).tril(), torch.eye(T, dtype=torch.bool)], dim=1)
        step1, _ = head(torch.tensor([[2, 3, 4, 0, 0]]), predicted, cache, positions=torch.arange(1, T + 1)[None],
                        allowed=allowed)
    torch.testing.assert_close(step0, default)
    assert step1.shape == (1, T, 4) and cache.get_seq_length() == 2 * T


def test_frozen_output_rows_are_the_targets_and_untrained_medusa_starts_as_the_target():
    lm = HFCausalLM(tiny_llama())
    lm.record_features([FINAL])
    head = hf_head("medusa", lm)
    ids = [3, 5, 7, 9]
    features = lm.score_features(ids, [FINAL])  # [4, H]
    with torch.no_grad():
        logits = head(features)  # [4, K, N]
        head_logits = features @ lm.output_embeddings()[head.d2t].T
    assert logits.shape == (4, 3, 40)
    # zero-initialised residual blocks add SiLU(bias) only
    bias = [torch.nn.functional.silu(block.linear.bias.detach()) for block in head.blocks]
    for i in range(3):
        expected = (features + bias[i]) @ lm.output_embeddings()[head.d2t].T
        torch.testing.assert_close(logits[:, i], expected, atol=1e-5, rtol=1e-5)
    assert head_logits.shape == (4, 40)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
@pytest.mark.parametrize("trained_output", [False, True])
def test_save_and_load_round_trip(tmp_path, kind, trained_output):
    lm = HFCausalLM(tiny_llama())
    lm.record_features([FINAL])
    head = hf_head(kind, lm, trained_output=trained_output)
    directory = save_head(head, tmp_path / kind)
    saved = json.loads((directory / "config.json").read_text())
    assert saved["kind"] == kind and saved["target"]["hidden_size"] == 16 and saved["vocab_size"] == 40
    loaded = load_head(directory, lm)
    assert type(loaded) is type(head) and not any(p.requires_grad for p in loaded.parameters())
    assert torch.equal(loaded.d2t, head.d2t)
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert ("output.weight" in loaded.state_dict()) == trained_output  # frozen rows are not saved
    assert read_config(directory) == head.config
    halved = load_head(save_head(head, tmp_path / "bf16", dtype=torch.bfloat16), lm)  # stored in bf16, runs in fp32
    assert (tmp_path / "bf16" / "model.safetensors").stat().st_size < (directory / "model.safetensors").stat().st_size
    for name, tensor in head.state_dict().items():
        expected = tensor.to(torch.bfloat16).to(tensor.dtype) if tensor.is_floating_point() else tensor
        assert torch.equal(halved.state_dict()[name], expected), name


def test_a_one_layer_head_saved_as_layer_loads_and_deepens_to_the_same_function(tmp_path):
    """A head saved before heads could stack layers named its decoder layer `layer`: it loads
    as `layers.0`. Loaded into a two-layer head with `depth=1`, the second layer starts as the
    identity: the same logits and features, bit for bit, in a chain and with a cache."""
    lm = HFCausalLM(tiny_llama())
    lm.record_features([FINAL])
    one = hf_head("eagle", lm)
    directory = save_head(one, tmp_path / "one")
    state = load_file(directory / "model.safetensors")
    save_file({name.replace("layers.0.", "layer.", 1): tensor for name, tensor in state.items()}, directory / "model.safetensors")
    assert any(name.startswith("layer.") for name in load_file(directory / "model.safetensors"))
    loaded = load_head(directory, lm)
    for name, tensor in one.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    two = hf_head("eagle", lm, depth=2)
    load_weights(two, read_weights(directory), directory, depth=1)
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    hidden = lm.score_features(ids[0].tolist(), [FINAL])[None]  # [1, T, H]
    with torch.no_grad():
        chains = [head(ids, hidden) for head in (one, two)]
        cached = [head(ids[:, :2], hidden[:, :2], head.new_cache()) for head in (one, two)]
    for a, b in (*zip(*chains), *zip(*cached)):
        assert torch.equal(a, b)
    assert two.layers[1].mlp.up_proj.weight.abs().sum() > 0  # only the projections into the residual are zero
    with pytest.raises(ValueError, match=r"missing \['layers.1"):
        load_weights(hf_head("eagle", lm, depth=2), read_weights(directory), directory)


def test_a_head_config_refuses_a_bad_depth():
    info = TargetInfo("tiny", VOCAB, 16, 3)
    for kind, depth in (("eagle", 0), ("eagle", True), ("medusa", 2)):
        with pytest.raises(ValueError, match="depth is an EAGLE head's number of decoder layers"):
            HeadConfig(kind, info, (FINAL,), vocab_size=8, layer=TINY_LAYER if kind == "eagle" else {},
                       heads=3 if kind == "medusa" else 0, depth=depth)
    config = HeadConfig("eagle", info, (FINAL,), vocab_size=8, layer=TINY_LAYER, depth=2)
    assert HeadConfig.from_json(config.to_json()) == config
    legacy = config.to_json()
    del legacy["depth"]
    assert HeadConfig.from_json(legacy).depth == 1


@pytest.mark.parametrize("kind", ["eagle", "eagle-depth-2", "medusa"])
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"])
def test_a_head_packed_for_drafting_computes_the_same_function(tmp_path, kind, dtype, tolerance):
    """`for_drafting` swaps every projection, the target's output rows included, for a
    prepacked one, and an EAGLE head's decoder layer for a `DraftingLayer`: the same logits
    and features up to summation order (a chain, a drafting step, a tree level with its own
    positions and mask), attention over a float32 cache, no matrix left as a parameter, and
    nothing to save."""
    lm = HFCausalLM(tiny_llama())
    kind, depth = ("eagle", 2) if kind == "eagle-depth-2" else (kind, 1)
    taps = eagle3_layers(3) if kind == "eagle" else (FINAL,)
    lm.record_features(taps)
    directory = save_head(hf_head(kind, lm, taps=taps, depth=depth), tmp_path / kind)
    unpacked, packed = load_head(directory, lm, dtype), for_drafting(load_head(directory, lm, dtype))
    assert not any(isinstance(m, nn.Linear) for m in packed.modules())
    assert all(p.dim() == 1 for p in packed.parameters())  # the norms' weights only
    assert packed.dtype == dtype
    if kind == "eagle":
        assert all(isinstance(layer, DraftingLayer) for layer in packed.layers)
    ids = [3, 5, 7, 9, 11, 13]
    features = lm.score_features(ids, taps)  # [T, F]
    with torch.no_grad():
        if kind == "eagle":
            outputs = []
            for head in (unpacked, packed):
                cache = head.new_cache()
                first = head(torch.tensor([ids[1:4]]), head.fuse(features[None, :3].to(dtype)), cache)
                step = head(torch.tensor([ids[4:5]]), first[1][:, -1:], cache)  # a drafting step
                # a tree level: two siblings at depth 2 under the step's node, one at depth 1
                allowed = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 1, 0], [1, 1, 1, 0, 0, 0, 1]]).bool()
                level = head(torch.tensor([[2, 4, 6]]), step[1].expand(1, 3, -1), cache,
                             positions=torch.tensor([[4, 4, 3]]), allowed=allowed)
                outputs.append([*first, *step, *level])
            assert all(layer.keys.dtype == layer.values.dtype == torch.float32 for layer in cache.layers)
        else:
            outputs = [[head(features)] for head in (unpacked, packed)]
    for expected, actual in zip(*outputs):
        torch.testing.assert_close(actual, expected, atol=tolerance, rtol=tolerance)
    with pytest.raises(ValueError, match="packed for drafting"):
        save_head(packed, tmp_path / "again")


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_an_int8_head_quantizes_every_projection_the_kernel_takes_and_stays_close(tmp_path, kind):
    """`for_drafting(head, "int8")`: every projection whose input width the int8 kernel takes
    (a multiple of 16) quantized per output channel, the target's output rows included, the
    rest packed as floats; its logits and features stay near the float head's."""
    lm = HFCausalLM(tiny_llama(hidden=32))
    taps = eagle3_layers(3) if kind == "eagle" else (FINAL,)
    lm.record_features(taps)
    directory = save_head(hf_head(kind, lm, taps=taps), tmp_path / kind)
    as_float, as_int8 = (for_drafting(load_head(directory, lm, torch.bfloat16), fmt) for fmt in ("float", "int8"))
    as_float_kind = PackedLinear if prepacks(torch.bfloat16) else DenseLinear  # oneDNN's bfloat16 needs AVX-512
    projections = [m for m in as_int8.modules() if isinstance(m, (Int8Linear, as_float_kind))]
    assert isinstance(as_int8.output, Int8Linear)
    assert all(isinstance(m, Int8Linear) == (m.in_features % 16 == 0) for m in projections)
    assert sum(isinstance(m, as_float_kind) for m in projections) == (1 if kind == "eagle" else 0)  # down: K = 8
    features = lm.score_features([3, 5, 7, 9, 11, 13], taps)[None]  # [1, T, F]
    with torch.no_grad():
        if kind == "eagle":
            outputs = [head(torch.tensor([[5, 7, 9, 11, 13, 2]]), head.fuse(features.to(torch.bfloat16)), head.new_cache())
                       for head in (as_float, as_int8)]
        else:
            outputs = [head(features) for head in (as_float, as_int8)]
    for expected, actual in zip(*outputs):
        assert (actual.float() - expected.float()).abs().max() <= 0.05 * expected.float().abs().max()
    with pytest.raises(ValueError, match="packed for drafting"):
        save_head(as_int8, tmp_path / "again")


def test_the_drafting_layer_runs_one_sequence_of_a_silu_layer():
    lm = HFCausalLM(tiny_llama())
    head = hf_head("eagle", lm)
    layer = DraftingLayer(head.layers[0], head.layer_config)
    with pytest.raises(ValueError, match="runs one sequence, got a batch of 2"):
        layer(torch.zeros(2, 1, 16), None, None, head.new_cache())
    gelu = copy.deepcopy(head.layer_config)
    gelu.hidden_act = "gelu"
    with pytest.raises(ValueError, match="SiLU-gated and this head's uses 'gelu'"):
        DraftingLayer(head.layers[0], gelu)


def test_a_head_refuses_another_target(tmp_path):
    lm = HFCausalLM(tiny_llama())
    directory = save_head(hf_head("eagle", lm), tmp_path / "eagle")
    wider = HFCausalLM(tiny_llama(hidden=32))
    with pytest.raises(ValueError, match=r"trained for 'tiny', a different target: this one has hidden_size 32 \(the "
                                         r"head's target has 16\)"):
        load_head(directory, wider)
    with pytest.raises(ValueError, match="no config.json"):
        load_head(tmp_path, lm)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a verispec-head config"):
        load_head(tmp_path / "bad", lm)


# --- averaging heads --------------------------------------------------------------------------


def _perturbed(head, seed: int):
    """`head` with every floating weight moved by seeded noise (a stand-in for more fitting)."""
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed)
        for parameter in head.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return head


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_averaged_heads_hold_the_weighted_mean_of_every_weight(tmp_path, kind):
    """Each saved weight of the average is sum_i w_i * weight_i (float64, stored as float32);
    d2t and the architecture are the heads'; the config records each head and its weight; the
    average loads and drafts like any head. A head averaged with itself computes what it did."""
    lm = HFCausalLM(tiny_llama())
    a = save_head(hf_head(kind, lm), tmp_path / "a")
    b = save_head(_perturbed(hf_head(kind, lm), seed=3), tmp_path / "b")
    c = save_head(_perturbed(hf_head(kind, lm), seed=4), tmp_path / "c")
    config, state = average_heads([a, b, c], [0.5, 0.25, 0.25])
    saved = [read_weights(d) for d in (a, b, c)]
    assert set(state) == set(saved[0]) and torch.equal(state["d2t"], saved[0]["d2t"])
    for name, tensor in state.items():
        if tensor.is_floating_point():
            expected = 0.5 * saved[0][name].double() + 0.25 * saved[1][name].double() + 0.25 * saved[2][name].double()
            assert tensor.dtype == torch.float32
            torch.testing.assert_close(tensor.double(), expected, atol=1e-7, rtol=1e-6)
            assert not torch.equal(tensor, saved[0][name]) or torch.equal(saved[1][name], saved[0][name])
    assert [(entry["directory"], entry["weight"]) for entry in config.training["averaged"]] == [
        (str(a), 0.5), (str(b), 0.25), (str(c), 0.25)]
    assert config == replace(read_config(a), training=config.training)
    write_head(config, state, tmp_path / "abc")
    averaged = load_head(tmp_path / "abc", lm)
    assert type(averaged) is type(load_head(a, lm))
    config, state = average_heads([a, a])
    write_head(config, state, tmp_path / "aa")
    lm.record_features((FINAL,))
    features = lm.score_features([3, 5, 7, 9], (FINAL,))  # [T, F]
    with torch.no_grad():
        if kind == "eagle":
            ids, hidden = torch.tensor([[5, 7, 9]]), features[None, :3]
            logits = [load_head(d, lm)(ids, hidden)[0] for d in (a, tmp_path / "aa")]
        else:
            logits = [load_head(d, lm)(features) for d in (a, tmp_path / "aa")]
    torch.testing.assert_close(logits[1], logits[0], atol=1e-6, rtol=1e-6)


def test_averaging_refuses_heads_that_do_not_share_an_architecture_and_vocabulary(tmp_path):
    lm = HFCausalLM(tiny_llama())
    a = save_head(hf_head("eagle", lm), tmp_path / "a")
    deeper = save_head(hf_head("eagle", lm, depth=2), tmp_path / "deeper")
    medusa = save_head(hf_head("medusa", lm), tmp_path / "medusa")
    other = hf_head("eagle", lm)
    other.d2t.copy_(torch.arange(1, other.d2t.numel() + 1))
    other_vocab = save_head(other, tmp_path / "other-vocab")
    with pytest.raises(ValueError, match="at least two head directories, got 1"):
        average_heads([a])
    with pytest.raises(ValueError, match="depth differ"):
        average_heads([a, deeper])
    with pytest.raises(ValueError, match="kind"):
        average_heads([a, medusa])
    with pytest.raises(ValueError, match="another head vocabulary"):
        average_heads([a, other_vocab])
    with pytest.raises(ValueError, match="one weight per head: 2 heads, 3 weights"):
        average_heads([a, a], [0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="must sum to 1"):
        average_heads([a, a], [0.5, 0.6])
    with pytest.raises(ValueError, match="must be positive"):
        average_heads([a, a], [1.5, -0.5])


def test_cli_averages_heads_and_refuses_bad_input_with_one_error_line(tmp_path, capsys):
    from verispec.cli import main

    lm = HFCausalLM(tiny_llama())
    a = save_head(hf_head("eagle", lm), tmp_path / "a")
    b = save_head(_perturbed(hf_head("eagle", lm), seed=3), tmp_path / "b")
    out = tmp_path / "ab"
    assert main(["average-heads", str(a), str(b), "--out", str(out), "--weights", "0.75,0.25"]) == 0
    assert json.loads(capsys.readouterr().out)["weights"] == [0.75, 0.25]
    config = read_config(out)
    assert config.training["command"] == f"verispec average-heads {a} {b} --out {out} --weights 0.75,0.25"
    expected = average_heads([a, b], [0.75, 0.25])[1]
    assert all(torch.equal(read_weights(out)[name], tensor) for name, tensor in expected.items())
    deeper = save_head(hf_head("eagle", lm, depth=2), tmp_path / "deeper")
    for argv, says in [
        ([str(a), str(b), "--out", str(out)], "already holds results (config.json, model.safetensors); pass --force"),
        ([str(a), str(b), "--out", str(tmp_path / "x"), "--weights", "0.5,half"], "--weights takes numbers joined by commas"),
        ([str(a), str(b), "--out", str(tmp_path / "x"), "--weights", "0.5,0.4"], "the weights must sum to 1"),
        ([str(a), str(tmp_path / "missing"), "--out", str(tmp_path / "x")], "is not a directory"),
        ([str(a), str(deeper), "--out", str(tmp_path / "x")], "holds another kind of head"),
    ]:
        assert main(["average-heads", *argv]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("error: ") and says in err, err
    assert not (tmp_path / "x").exists()


def test_cli_never_writes_the_average_into_one_of_its_heads(tmp_path, capsys):
    """An output is never one of the inputs, --force or not: A's files stay as they were."""
    from verispec.cli import main

    lm = HFCausalLM(tiny_llama())
    a = save_head(hf_head("eagle", lm), tmp_path / "a")
    b = save_head(_perturbed(hf_head("eagle", lm), seed=3), tmp_path / "b")
    before = {name: (a / name).read_bytes() for name in ("config.json", "model.safetensors")}
    for out in (a, tmp_path / "b" / ".." / "a", a / "inside"):
        assert main(["average-heads", str(a), str(b), "--out", str(out), "--force"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --out") and err.count("\n") == 1 and "is one of the inputs" in err, err
    assert {name: (a / name).read_bytes() for name in before} == before and not (a / "inside").exists()


@pytest.mark.parametrize("garbage", [b"", b"not a safetensors file", None], ids=["empty", "garbage", "truncated"])
def test_a_corrupt_head_file_is_one_error_line(tmp_path, capsys, garbage):
    """A model.safetensors that does not parse: a ValueError naming the file, so `average-heads`
    (and `--proposer eagle:DIR`) print one error line and exit 2."""
    from verispec.cli import main

    lm = HFCausalLM(tiny_llama())
    a = save_head(hf_head("eagle", lm), tmp_path / "a")
    bad = save_head(hf_head("eagle", lm), tmp_path / "bad")
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-7] if garbage is None else garbage)
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        read_weights(bad)
    assert main(["average-heads", str(a), str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {weights} is not a readable safetensors file") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


# --- the proposers ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["eagle", "eagle-depth-2", "medusa"])
@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(), SamplingParams(0.7, top_p=0.9)], ids=str)
@pytest.mark.parametrize("packed", [None, "float", "int8"], ids=["as-trained", "for-drafting", "for-drafting-int8"])
def test_engine_equals_reference_on_a_tiny_llama(kind, sampling, packed):
    lm = HFCausalLM(tiny_llama())
    kind, depth = ("eagle", 2) if kind == "eagle-depth-2" else (kind, 1)
    head = hf_head(kind, lm, taps=(FINAL, 2) if kind == "eagle" else (FINAL,), depth=depth).double()
    if packed:
        head = for_drafting(head, packed)
    proposer = (EagleProposer if kind == "eagle" else MedusaProposer)
    engine = generate(lm, proposer(head, lm), [5, 6, 7], max_new_tokens=20, sampling=sampling, k=3, seed=4)
    reference = reference_generate(lm, proposer(head, lm), [5, 6, 7], max_new_tokens=20, sampling=sampling, k=3,
                                   rng=TorchRandom(4))
    assert engine.tokens == reference
    assert sum(engine.stats.drafted) > 0


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(0.7, top_p=0.9)], ids=str)
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_a_prompt_window_reads_the_last_positions_alike_in_engine_and_reference(sampling, tree):
    lm = HFCausalLM(tiny_llama())
    head = hf_head("eagle", lm, taps=(FINAL, 2)).double()
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    k = ConstantTree(TreeShape.of([(0,), (1,), (0, 0)])) if tree else 3
    engine = generate(lm, EagleProposer(head, lm, prompt_window=3), prompt, max_new_tokens=20, sampling=sampling,
                      k=k, seed=4)
    reference = reference_generate(lm, EagleProposer(head, lm, prompt_window=3), prompt, max_new_tokens=20,
                                   sampling=sampling, k=k, rng=TorchRandom(4))
    assert engine.tokens == reference
    whole = generate(lm, EagleProposer(head, lm, prompt_window=None), prompt, max_new_tokens=20, sampling=sampling,
                     k=k, seed=4)
    if sampling.greedy:
        plain = generate(lm, None, prompt, max_new_tokens=20, sampling=GREEDY, k=0)
        assert engine.tokens == whole.tokens == plain.tokens


def test_a_prompt_window_caches_only_the_last_prompt_pairs():
    lm = HFCausalLM(tiny_llama())
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    for window, pairs in ((3, 3), (7, 7), (50, 7), (None, 7)):  # a prompt of 8 tokens has 7 true pairs
        proposer = EagleProposer(hf_head("eagle", lm), lm, prompt_window=window)
        proposer.begin(prompt, GREEDY)
        lm.prefill(prompt[:-1])
        draft = proposer.propose(prompt, 2, TorchRandom(0))
        proposer.commit(prompt)
        assert len(draft) == 2 and proposer._cache.get_seq_length() == pairs, window
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="prompt_window must be an integer >= 1 or None"):
            EagleProposer(hf_head("eagle", lm), lm, prompt_window=bad)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_one_token_prompt_drafts_nothing_then_speculates(kind):
    table = random_table(4, 2, seed=3)
    proposer = (EagleProposer if kind == "eagle" else MedusaProposer)(tiny_head(kind, table), table)
    proposer.begin([2], SamplingParams())
    table.prefill([])
    assert len(proposer.propose([2], 3, TorchRandom(0))) == 0
    run = generate(table, proposer, [2], max_new_tokens=6, k=3, seed=1, sampling=SamplingParams())
    assert run.stats.drafted[0] == 0 and sum(run.stats.drafted) > 0


def test_medusa_drafts_at_most_its_heads():
    table = random_table(4, 2, seed=3)
    proposer = MedusaProposer(tiny_head("medusa", table, heads=2), table)
    proposer.begin([1, 2], GREEDY)
    table.prefill([1])
    assert len(proposer.propose([1, 2], 5, TorchRandom(0))) == 2


def test_proposers_refuse_a_target_without_features_or_out_of_step():
    table = random_table(4, 2, seed=3)
    head = tiny_head("eagle", table)

    class NoFeatures:
        vocab_size = 4

    with pytest.raises(ValueError, match="NoFeatures has no feature channel"):
        EagleProposer(head, NoFeatures())
    proposer = EagleProposer(head, table)
    proposer.begin([1, 2, 3], SamplingParams())
    table.prefill([1])
    with pytest.raises(RuntimeError, match="processed 1 tokens, the head expects 2"):
        proposer.propose([1, 2, 3], 2, TorchRandom(0))


# --- command-line specs -----------------------------------------------------------------------


def loaded(model: LlamaForCausalLM) -> LoadedModel:
    return LoadedModel(name="tiny", lm=HFCausalLM(model), model=model, tokenizer=None, eos_token_ids=(),
                       dtype=torch.float32, source=Path("tiny"))


def test_specs_load_head_directories(tmp_path):
    target = loaded(tiny_llama())
    for kind, cls in (("eagle", EagleProposer), ("medusa", MedusaProposer)):
        save_head(hf_head(kind, target.lm), tmp_path / kind)
        proposer = build_proposer(f"{kind}:{tmp_path / kind}", target)
        assert isinstance(proposer, cls) and proposer.target is target.lm
        run = generate(target.lm, proposer, [1, 2, 3], max_new_tokens=8, sampling=GREEDY, k=3)
        assert run.tokens == generate(target.lm, None, [1, 2, 3], max_new_tokens=8, sampling=GREEDY, k=0).tokens
    as_bf16 = PackedLinear if prepacks(torch.bfloat16) else DenseLinear  # oneDNN's bfloat16 needs AVX-512
    for head_format, projection in (("float32", PackedLinear), ("bfloat16", as_bf16), ("int8", Int8Linear)):
        proposer = build_proposer(f"eagle:{tmp_path / 'eagle'}:weights={head_format}", target)
        assert isinstance(proposer.head.output, projection)
        assert proposer.head.dtype == (torch.float32 if head_format == "float32" else torch.bfloat16)
    with pytest.raises(ValueError, match=r"eagle:...:weights=F takes auto, float32, bfloat16, int8; got 'int4'"):
        build_proposer(f"eagle:{tmp_path / 'eagle'}:weights=int4", target)
    with pytest.raises(ValueError, match="holds a medusa head, not a eagle head; use medusa:"):
        build_proposer(f"eagle:{tmp_path / 'medusa'}", target)
    with pytest.raises(ValueError, match="eagle:DIR needs a head directory"):
        build_proposer(f"eagle:{tmp_path / 'nowhere'}", target)


# --- greedy identity with plain decoding ------------------------------------------------------


@pytest.mark.parametrize(("kind", "taps", "depth"), [("eagle", (FINAL,), 1), ("eagle", (1, 2, 3), 1), ("eagle", (1, 2, 3), 2),
                                                    ("medusa", (FINAL,), 1)])
def test_greedy_heads_reproduce_plain_decoding_on_a_tiny_llama(kind, taps, depth):
    lm = HFCausalLM(tiny_llama(seed=5))
    head = hf_head(kind, lm, taps=taps, depth=depth)  # float32, untrained: drafts are often rejected
    proposer = (EagleProposer if kind == "eagle" else MedusaProposer)(head, lm)
    for prompt in ([7], [1, 2, 3], [9, 8, 7, 6, 5, 4, 3, 2]):
        plain = generate(lm, None, prompt, max_new_tokens=24, sampling=GREEDY, k=0).tokens
        for k in (1, 3, 5):
            run = generate(lm, proposer, prompt, max_new_tokens=24, sampling=GREEDY, k=k)
            assert run.tokens == plain, (prompt, k)
            assert sum(run.stats.drafted) > 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_on_the_default_model_greedy_heads_equal_greedy_plain(kind):
    """The shipped head when this installation has one, else an untrained head of the same
    shape (greedy identity holds for any head)."""
    loaded, head = default_model_head(kind)
    lm = loaded.lm
    proposer = (EagleProposer if kind == "eagle" else MedusaProposer)(head, lm)
    options = dict(max_new_tokens=24, sampling=GREEDY, eos_token_id=loaded.eos_token_id)
    for text in ("List three primary colours.", "Write a Python function that reverses a string."):
        prompt = loaded.encode(text)
        plain = generate(lm, None, prompt, k=0, **options)
        fast = generate(lm, proposer, prompt, k=4, **options)
        assert fast.tokens == plain.tokens
        assert sum(fast.stats.drafted) > 0


def test_a_draw_over_the_head_vocabulary_is_the_draw_over_q():
    """Drawing a head index from q on the N tokens picks, for the same random stream, the
    token a draw from q over the full vocabulary would."""
    vocab = HeadVocab([0, 3, 4, 9], vocab_size=12)
    logits = torch.tensor([0.1, 1.2, -0.4, 0.9], dtype=torch.float64)
    for seed in range(200):
        token, q = vocab.draw(logits, SamplingParams(), TorchRandom(seed))
        assert token == TorchRandom(seed).categorical(q)


def default_model_head(kind: str):
    """The default model in float32 and the head shipped for it when this installation has
    one, else an untrained head of the same shape (greedy identity holds for any head)."""
    from verispec import load_model
    from verispec.heads.config import default_layer
    from verispec.proposers.trained import default_head

    loaded = load_model("smollm2-135m-instruct", dtype="float32")
    lm = loaded.lm
    if default_head(kind).is_dir():
        head = load_head(default_head(kind), lm)
    else:
        config = HeadConfig(kind, target_info(lm, loaded.name), (FINAL,), vocab_size=8192,
                            layer=default_layer(loaded.config) if kind == "eagle" else {},
                            heads=4 if kind == "medusa" else 0)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            head = new_head(config, torch.arange(8192), lm).eval()
    return loaded, head
