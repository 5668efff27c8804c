"""Constrained output with speculation, exactly: the output law is the target's masked to the
grammar and renormalised at each step (plain constrained decoding's), for every audited
proposer and rule, chains and trees, by the exhaustive audit on rational tables with a grammar
given as an automaton; the negative control (cutting sampled drafts where they leave the
grammar) is caught; the same audit with a Lark and a GBNF grammar compiled by llguidance over
a table model's byte strings; greedy speculation equals greedy plain decoding under the same
grammar (JSON schema, regex, choice, Lark, GBNF) on the tiny real model through llguidance;
llguidance's masks on the 49k vocabulary are exact; a grammar that cannot be compiled or
satisfied is a ValueError with the reason."""

from __future__ import annotations

import dataclasses

import pytest

from verispec import SamplingParams, generate
from verispec.audit.exhaustive import Configuration, Scenario, audit_configuration, default_configurations
from verispec.grammar import Automaton, GrammarCompiler
from verispec.proposers.prompt_lookup import PromptLookup
from verispec.registry import PROPOSERS
from verispec.request import Request
from verispec.tree_shape import TreeShape

# Over tokens 0-3, EOS 0: from state 0, 1 or 2; after 1, 2 (back to 1) or 3; after 2 (or 3),
# 1 back to the start or 3 again; the output may end (EOS) in state 2.
DFA = Automaton(4, {0: {1: 1, 2: 2}, 1: {2: 1, 3: 2}, 2: {1: 0, 3: 2}}, accepting={2}, eos_token_id=0)


def constrained(temperature: float = 1.0, **options) -> SamplingParams:
    return SamplingParams(temperature=temperature, grammar=DFA, **options)


SCENARIOS = [
    Scenario(4, 2, 3, 4, constrained(0.0), (3, 1, 2, 3, 1), eos_token_id=0, seed=3, zeros=False),
    Scenario(4, 2, 2, 3, constrained(), (3, 1, 2, 3, 1), eos_token_id=0, seed=22, zeros=False),
    Scenario(4, 1, 3, 3, constrained(0.5, top_k=2), (1, 2, 3, 1), eos_token_id=0, seed=4, zeros=False),
    Scenario(4, 2, 2, 3, constrained(), (3, 1, 2, 3, 1), eos_token_id=0, seed=8, zeros=False,
             tree=TreeShape.of([(0,), (1,), (0, 0)])),
]
CONFIGURATIONS = [c for c in default_configurations([PROPOSERS[name] for name in ("lookup", "draft", "random")],
                                                   SCENARIOS) if not (c.scenario.tree and c.verifier == "block")]


@pytest.mark.parametrize("config", CONFIGURATIONS, ids=lambda c: c.name)
def test_the_output_law_is_the_targets_masked_to_the_grammar(config):
    result = audit_configuration(config)
    assert result.error is None and result.max_abs_diff <= 1e-9, result
    assert result.drafted > 0


def test_the_exact_law_keeps_to_the_grammar():
    """Every output the exact target gives is a word of the grammar (the mask is applied)."""
    from verispec.audit.exact_target import target_sequences

    scenario = SCENARIOS[1]
    law = target_sequences(scenario.tables().target, scenario.prompt, sampling=scenario.sampling,
                           max_new_tokens=3, eos_token_id=0)
    for output in law:
        for j, token in enumerate(output):
            assert DFA.allowed(output[:j])[token]
    assert abs(sum(law.values()) - 1) == 0


def test_cutting_sampled_drafts_where_they_leave_the_grammar_is_caught(monkeypatch):
    """The negative control: a sampled draft cut at a token outside the grammar (so that
    whether it continues depends on the token drawn) changes the law, and the audit sees it."""
    import verispec.engine
    from verispec.grammar import within_grammar

    config = Configuration(SCENARIOS[1], PROPOSERS["random"], "token")
    assert audit_configuration(config).passed
    monkeypatch.setattr(verispec.engine, "within_grammar",
                        lambda draft, grammar, output, greedy: within_grammar(draft, grammar, output, True))
    assert not audit_configuration(config).passed


def test_a_grammar_that_allows_nothing_more_is_an_error():
    stuck = Automaton(4, {0: {1: 1}}, accepting=set(), eos_token_id=0)  # after 1, nothing
    from verispec.models.tables import random_table

    with pytest.raises(ValueError, match="the grammar allows no token after the 1 tokens generated"):
        generate(random_table(4, 1, 0, zeros=False), None, Request((1, 2), 4, sampling=SamplingParams(
            temperature=0, grammar=stuck)))


# --- Lark and GBNF through llguidance, over a table model's vocabulary -------------------------


class TableBytes:
    """A table model's 4 tokens as byte strings, for llguidance (`TokenizerWrapper`'s fields):
    0 the EOS (special), 1 "a", 2 "b", 3 "ab"; text is encoded longest token first."""

    eos_token_id, bos_token_id, special_token_ids = 0, None, [0]
    tokens = [b"<eos>", b"a", b"b", b"ab"]

    def __call__(self, text: str | bytes) -> list[int]:
        text = text.decode() if isinstance(text, bytes) else text
        ids = []
        while text:
            n = 2 if text.startswith("ab") else 1
            ids.append(self.tokens.index(text[:n].encode()))
            text = text[n:]
        return ids


@pytest.fixture(scope="module")
def table_grammars():
    import llguidance
    from llguidance._tokenizer import TokenizerWrapper

    compiler = GrammarCompiler(llguidance.LLTokenizer(TokenizerWrapper(TableBytes()), n_vocab=4), 4)
    return {"lark": lambda: compiler.grammar('start: "a" ("b" | "ab")* "a"?'),
            "gbnf": lambda: compiler.grammar('root ::= "a" ("b" | "ab")* "a"?')}


def test_lark_and_gbnf_masks_over_a_table_vocabulary(table_grammars):
    """The same language in both syntaxes gives the same masks: "a" or "ab" first, EOS once
    the text is a word ("a", "ab", "aba", ...), and nothing after a token that left it."""
    lark, gbnf = table_grammars["lark"](), table_grammars["gbnf"]()
    expected = {(): [0, 1, 0, 1], (1,): [1, 1, 1, 1], (3, 1): [1, 0, 1, 0], (1, 1): [1, 0, 1, 0]}
    for output, mask in expected.items():
        assert lark.allowed(output).int().tolist() == mask == gbnf.allowed(output).int().tolist(), output
    assert lark.allowed((2,)) is None and gbnf.allowed((1, 1, 1)) is None


TABLE_SCENARIOS = {
    "lark": lambda g: Scenario(4, 2, 2, 3, SamplingParams(temperature=1.0, grammar=g), (3, 1, 2), eos_token_id=0,
                               seed=22, zeros=False),
    "gbnf": lambda g: Scenario(4, 2, 2, 3, SamplingParams(temperature=1.0, grammar=g), (3, 1, 2), eos_token_id=0,
                               seed=22, zeros=False, tree=TreeShape.of([(0,), (1,), (0, 0)])),
}
TABLE_CONFIGURATIONS = [
    (syntax, proposer, verifier)
    for syntax, proposers in (("lark", ("lookup", "draft", "random")), ("gbnf", ("lookup", "draft")))
    for proposer in proposers
    for verifier in (("coupled", "token") if syntax == "gbnf" else ("coupled", "token", "block"))
]


@pytest.mark.parametrize("syntax, proposer, verifier", TABLE_CONFIGURATIONS, ids=lambda v: str(v))
def test_the_output_law_under_a_lark_or_gbnf_grammar_is_the_targets_masked(table_grammars, syntax, proposer,
                                                                            verifier):
    """The exhaustive audit with a grammar llguidance compiled from Lark (chains) or GBNF
    (trees): the output law is the target's masked to the grammar at each step."""
    scenario = TABLE_SCENARIOS[syntax](table_grammars[syntax]())
    result = audit_configuration(Configuration(scenario, PROPOSERS[proposer], verifier))
    assert result.error is None and result.max_abs_diff <= 1e-9, result
    assert result.drafted > 0


# --- llguidance on real tokenizers ----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from serving import save_tiny_model
    from verispec.models.loading.load import load_model

    return load_model(save_tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.mark.parametrize("make", [
    lambda c: c.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
    lambda c: c.regex(r"[a-e]{2,6}(-[0-9]+)?"),
    lambda c: c.choice(["tell", "me", "a story"]),
    lambda c: c.grammar('start: greeting " " NAME "!"\ngreeting: "Hello" | "Hi"\nNAME: /[a-z]{2,8}/'),
    lambda c: c.grammar('root ::= word (" " word)* "."\nword ::= [a-z]+'),
], ids=["json_schema", "regex", "choice", "lark", "gbnf"])
def test_greedy_speculation_equals_plain_decoding_under_the_same_grammar(tiny, make):
    compiler = GrammarCompiler(tiny.tokenizer, tiny.lm.vocab_size)
    ids = tuple(tiny.encode("Hello there, tell me a story " * 3, chat=False))
    runs = []
    for proposer, k in [(None, 0), (PromptLookup(), 4)]:
        sampling = SamplingParams(temperature=0, grammar=make(compiler))  # a grammar per request
        runs.append(generate(tiny.lm, proposer, Request(ids, 24, sampling=sampling, eos_token_ids=tiny.eos_token_ids),
                             policy=k))
    assert runs[0].tokens == runs[1].tokens and runs[1].stats.speculative_rounds > 0
    text = tiny.decode(runs[0].tokens)
    assert text, "the grammar let nothing through"


@pytest.fixture(scope="module")
def smollm():
    """The default model and a compiler for its tokenizer (converted once)."""
    from verispec.models.loading.load import load_model

    loaded = load_model("smollm2-135m-instruct", dtype="float32")  # the quickest to load
    return loaded, GrammarCompiler(loaded.tokenizer, loaded.lm.vocab_size)


@pytest.mark.slow
@pytest.mark.parametrize("text", [
    'start: "The " ANIMAL " sat on the " THING "." (" The " ANIMAL " sat on the " THING ".")*\n'
    'ANIMAL: "cat" | "dog"\nTHING: /[a-z]{3,5}/',
    'root ::= sentence (" " sentence)*\nsentence ::= "The " animal " sat on the " [a-z]+ "."\n'
    'animal ::= "cat" | "dog"',
], ids=["lark", "gbnf"])
def test_greedy_speculation_on_the_default_model_equals_plain_decoding_under_a_grammar(smollm, text):
    """On SmolLM2 itself, with prompt lookup drafting: a Lark and a GBNF grammar give plain
    constrained decoding's greedy tokens, and the text keeps to the grammar."""
    import re

    loaded, compiler = smollm
    ids = tuple(loaded.encode("Repeat after me: The cat sat on the mat. The dog sat on the rug.", chat=True))
    runs = [generate(loaded.lm, proposer, Request(ids, 32, sampling=SamplingParams(temperature=0,
                                                                                    grammar=compiler.grammar(text)),
                                                   eos_token_ids=loaded.eos_token_ids), policy=k)
            for proposer, k in [(None, 0), (PromptLookup(), 4)]]
    assert runs[0].tokens == runs[1].tokens and sum(runs[1].stats.accepted) > 0
    sentences = loaded.decode([t for t in runs[0].tokens if t not in loaded.eos_token_ids]).split(". ")
    assert all(re.fullmatch("The (cat|dog) sat on the [a-z]+[.]?", s) for s in sentences), sentences


@pytest.mark.slow
def test_llguidance_masks_are_exact_on_the_default_vocabulary(smollm):
    """For a choice grammar on SmolLM2's 49,152 tokens, after each prefix of each choice, over the
    whole vocabulary: where the grammar leaves a choice of next character, a token is allowed if
    and only if the text with it is still a prefix of some choice (and EOS once the text is a
    choice); where it forces the next bytes, llguidance allows their canonical tokenization
    only (its forcing, as vLLM and llama.cpp use it), a subset of those."""
    loaded, compiler = smollm
    tokenizer, vocab = loaded.tokenizer, loaded.lm.vocab_size
    choices = ["yes", "no", "maybe so", "not sure"]
    grammar = compiler.choice(choices)
    texts = [tokenizer.decode([t]) for t in range(vocab)]
    eos = tokenizer.eos_token_id
    special = set(tokenizer.all_special_ids)
    for choice in choices:
        output: list[int] = []
        for token in tokenizer(choice, add_special_tokens=False).input_ids:
            so_far = tokenizer.decode(output)
            allowed = grammar.allowed(output).tolist()
            expected = [t not in special and bool(texts[t]) and any(c.startswith(so_far + texts[t]) for c in choices)
                        for t in range(vocab)]
            expected[eos] = so_far in choices
            next_characters = {(so_far + texts[t])[len(so_far)] for t in range(vocab) if expected[t] and t != eos}
            if len(next_characters) > 1 or expected[eos]:
                assert allowed == expected, (choice, so_far)
            else:  # forced: the canonical tokens of what follows
                assert all(e for a, e in zip(allowed, expected) if a) and allowed[token], (choice, so_far)
            output.append(token)
        assert grammar.allowed(output)[eos]


@pytest.mark.parametrize("make, says", [
    (lambda c: c.regex("a("), "invalid regular expression"),
    (lambda c: c.json_schema({"type": "frob"}), "Invalid type"),
    (lambda c: c.json_schema({"type": "integer", "minimum": 5, "maximum": 3}), "Unsatisfiable schema"),
    (lambda c: c.choice([]), "the choice is empty"),
    (lambda c: c.grammar('start: "a" | b_rule'), "invalid grammar: .*unknown name"),
    (lambda c: c.grammar('root ::= "a" ('), r"invalid grammar: .*Expected '\)'"),
    (lambda c: c.grammar("   "), "the grammar is empty"),
    (lambda c: c.grammar("start: /[^\\s\\S]/"), "cannot be satisfied"),
])
def test_bad_grammars_say_why(tiny, make, says):
    with pytest.raises(ValueError, match=says):
        make(GrammarCompiler(tiny.tokenizer, tiny.lm.vocab_size))
