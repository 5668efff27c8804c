"""`verispec bench --quick`: every code path of the benchmark in seconds, no model file needed.

The target is a tiny random Llama built in code over a byte-level tokenizer also built in code
(256 byte tokens and three chat markers, no merges), so any text tokenises and the model's
vocabulary is the tokenizer's. Its weights are shaped so that it mostly cycles through short
runs of ids (`tiny_llama`), so speculation meets both acceptances and rejections, and its
top-2 logits stay far above float32 rounding, so the greedy identity check is meaningful.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from verispec.bench.workloads import Workload, parse_row

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUICK_ROWS = (
    {"question_id": 1, "category": "summarization",
     "turns": ["Summarize: the cat sat on the mat. The cat sat on the mat again."]},
    {"question_id": 2, "category": "summarization", "turns": ["Summarize: rain, rain, rain and then sun."]},
    {"question_id": 3, "category": "writing", "turns": ["Write a short poem about the sea."]},
    {"task_id": "quick/0", "prompt": "def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n"},
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with a chat template: ids 0-2 the markers, then the 256 bytes."""
    vocab = {token: i for i, token in enumerate([*SPECIALS, *sorted(pre_tokenizers.ByteLevel.alphabet())])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=SPECIALS[1], eos_token=SPECIALS[2], pad_token=SPECIALS[0]
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_llama(vocab_size: int, layers: int = 4, seed: int = 0, period: int = 6, residual: float = 0.006) -> LlamaForCausalLM:
    """A random float32 Llama (hidden 64, 4 heads, 2 KV heads) that mostly cycles.

    The output head maps each token's embedding to its successor in a cycle of `period` ids
    (head row succ(t) = embedding row t), and every layer's writes into the residual stream
    are scaled by `residual`: the last hidden state stays close to the current token's
    embedding, so the model mostly emits succ(t), and the random layers knock it off the
    cycle now and then. Prompt lookup then meets both accepted and rejected drafts.
    """
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        initializer_range=0.5,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    ids = torch.arange(vocab_size)
    cycle_start = ids - ids % period
    successor = torch.where(cycle_start + period <= vocab_size, cycle_start + (ids + 1) % period, ids)
    with torch.no_grad():
        model.lm_head.weight[successor] = model.model.embed_tokens.weight
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(residual)
            layer.mlp.down_proj.weight.mul_(residual)
    return model


def quick_workloads() -> list[Workload]:
    return [parse_row(row, f"quick row {i}") for i, row in enumerate(QUICK_ROWS)]
