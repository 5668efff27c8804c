"""Grammars: constrained output (a JSON schema, a regular expression, a choice of strings, a
context-free grammar in Lark or GBNF) as a transform that reads the context, like the penalties (`verispec.sampling.penalised`).

A grammar answers one question: which tokens may follow an output prefix (`allowed`, a [V]
mask). The sampling transforms apply it to every row of p and q with that row's own prefix
(the emitted tokens and the drafts before it): a disallowed token's logit becomes -inf, so the
target the rules verify is the model's distribution masked to the grammar and renormalised at
each step, the law plain constrained decoding samples from. The engine cuts a chosen draft
where it leaves the grammar (such a token could only be rejected), and a draft model masks its
own q alike, so its sampled drafts never leave it.

Two kinds: `GuidanceGrammar`, a grammar over a real tokenizer through llguidance (its masks are
exact: a token is allowed if and only if some completion of the grammar begins with the text
so far and that token's bytes), compiled by a `GrammarCompiler`; and `Automaton`, a grammar
over token ids given as a finite automaton, which the exhaustive audit runs on rational tables.

    >>> dfa = Automaton(3, {0: {1: 1}, 1: {2: 0}}, accepting={0}, eos_token_id=0)
    >>> dfa.allowed([]).tolist(), dfa.allowed([1]).tolist()
    ([True, True, False], [False, False, True])
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch

from verispec.drafts import Draft, TreeDraft

MASKS_KEPT = 64  # masks remembered per grammar: a round asks for the same prefixes more than once


@runtime_checkable
class Grammar(Protocol):
    """Which tokens may follow an output prefix."""

    def allowed(self, output: Sequence[int]) -> torch.Tensor | None:
        """bool [V]: the tokens that may follow `output` (the tokens generated so far, prompt
        excluded); None when `output` itself left the grammar (a token of it was not allowed,
        or it continued past its end)."""
        ...


class Automaton:
    """A grammar over token ids: a deterministic automaton from state 0, `transitions[state]
    [token]` the next state (a token without one is not allowed); in an `accepting` state the
    EOS token ends the output."""

    def __init__(self, vocab_size: int, transitions: Mapping[int, Mapping[int, int]], accepting: set[int],
                 eos_token_id: int) -> None:
        self.vocab_size, self.transitions = vocab_size, transitions
        self.accepting, self.eos_token_id = accepting, eos_token_id

    def allowed(self, output: Sequence[int]) -> torch.Tensor | None:
        state: int | None = 0
        for token in output:
            state = self.transitions.get(state, {}).get(token)
            if state is None:
                return None
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)  # [V]
        for token in self.transitions.get(state, {}):
            mask[token] = True
        if state in self.accepting:
            mask[self.eos_token_id] = True
        return mask

    def __repr__(self) -> str:
        return f"Automaton({len(self.transitions)} states)"


class GuidanceGrammar:
    """A compiled llguidance grammar for one request: one matcher, moved to each prefix asked
    for (rolled back to the part it shares with the last one, then fed the rest), and the last
    masks remembered. Not shared between requests."""

    def __init__(self, matcher: object, vocab_size: int, text: str) -> None:
        self.matcher, self.vocab_size, self.text = matcher, vocab_size, text
        self.consumed: list[int] = []
        self.masks: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()

    def allowed(self, output: Sequence[int]) -> torch.Tensor | None:
        key = tuple(output)
        if key in self.masks:
            self.masks.move_to_end(key)
            return self.masks[key]
        mask = self._compute(key)
        self.masks[key] = mask
        if len(self.masks) > MASKS_KEPT:
            self.masks.popitem(last=False)
        return mask

    def _compute(self, output: tuple[int, ...]) -> torch.Tensor | None:
        shared = 0
        while shared < min(len(output), len(self.consumed)) and output[shared] == self.consumed[shared]:
            shared += 1
        matcher = self.matcher
        if shared < len(self.consumed):
            if matcher.is_error() or not matcher.rollback(len(self.consumed) - shared):
                matcher.reset()  # an error state is left only by starting over
                shared = 0
            del self.consumed[shared:]
        for token in output[shared:]:
            if not matcher.consume_token(token):
                matcher.reset()
                self.consumed.clear()
                return None
            self.consumed.append(token)
        bias = torch.frombuffer(bytearray(matcher.compute_logit_bias()), dtype=torch.uint8)
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)  # [V]
        n = min(self.vocab_size, bias.shape[0])
        mask[:n] = bias[:n] != 0
        return mask

    def __repr__(self) -> str:
        return f"GuidanceGrammar({self.text[:60]!r})"


class GrammarCompiler:
    """Compiles grammars for one model's tokenizer through llguidance: an HF tokenizer, whose
    conversion (about a second for a 49k vocabulary) happens once, on first use, or an
    `llguidance.LLTokenizer` already made (a table model's few byte strings, in the audit).
    Every method raises ValueError with the library's reason for a grammar it cannot compile."""

    def __init__(self, tokenizer: object, vocab_size: int) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self._converted = None

    def json_schema(self, schema: Mapping | str | bool) -> GuidanceGrammar:
        llguidance = guidance()
        text = schema if isinstance(schema, str) else json.dumps(schema)
        try:
            return self._compile(llguidance.LLMatcher.grammar_from_json_schema(text), f"json_schema {text}")
        except ValueError:
            raise
        except Exception as error:  # the library's parse error of the schema
            raise ValueError(f"invalid JSON schema: {error}") from None

    def json_object(self) -> GuidanceGrammar:
        return self.json_schema({"type": "object"})

    def regex(self, pattern: str) -> GuidanceGrammar:
        llguidance = guidance()
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"invalid regular expression: {error}") from None
        return self._compile(llguidance.LLMatcher.grammar_from_regex(pattern), f"regex {pattern}")

    def choice(self, choices: Sequence[str]) -> GuidanceGrammar:
        if not choices:
            raise ValueError("the choice is empty; give at least one string")
        return self.regex("|".join(f"(?:{re.escape(c)})" for c in choices))

    def grammar(self, text: str) -> GuidanceGrammar:
        """A context-free grammar: Lark (llguidance's dialect, `start: ...`, with its regular
        expressions and `%json` schemas) or llama.cpp's GBNF (`root ::= ...`), told apart as
        llguidance does (Lark names a `start` rule or begins `%llguidance`; GBNF is converted
        to Lark by llguidance's own converter)."""
        llguidance = guidance()
        if not text.strip():
            raise ValueError("the grammar is empty; give a Lark grammar (start: ...) or a GBNF one (root ::= ...)")
        try:
            lark = llguidance.grammar_from("grammar", text)
        except ValueError as error:  # GBNF the converter cannot read
            raise ValueError(f"invalid grammar: {str(error).splitlines()[0]}") from None
        return self._compile(lark, f"grammar {text}")

    def _compile(self, grammar: str, text: str) -> GuidanceGrammar:
        llguidance = guidance()
        tokenizer = self._tokenizer()
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise ValueError(f"invalid grammar: {error.splitlines()[0]}")
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"invalid grammar: {matcher.get_error().splitlines()[0]}")
        compiled = GuidanceGrammar(matcher, self.vocab_size, text)
        first = compiled.allowed(())
        if first is None or not bool(first.any()) or matcher.is_error():
            raise ValueError("the grammar allows no output at all: it cannot be satisfied")
        return compiled

    def _tokenizer(self) -> object:
        if self._converted is None:
            llguidance = guidance()
            if isinstance(self.tokenizer, llguidance.LLTokenizer):
                self._converted = self.tokenizer
            else:
                import llguidance.hf

                self._converted = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size)
        return self._converted


def guidance() -> object:
    """The llguidance module (the `serve` extra); ValueError saying how to install it."""
    try:
        import llguidance
    except ImportError:
        raise ValueError("structured output needs llguidance: pip install 'verispec[serve]'") from None
    return llguidance


def within_grammar(
    draft: Draft | TreeDraft, grammar: Grammar, output: Sequence[int], greedy: bool
) -> Draft | TreeDraft:
    """`draft` cut where it leaves `grammar` after `output`: a chain at its first disallowed
    token, a tree without the nodes below one. Only chosen drafts (q None) are cut, and any
    draft when greedy: whether a sampled draft continues must not depend on the token drawn
    (that would change the law the rule corrects for), so a sampled token outside the grammar
    is verified as drawn, where p = 0 rejects it (a draft model masks its own q, so its
    draws never leave the grammar)."""
    if draft.q is not None and not greedy:
        return draft

    def allows(before: Sequence[int], token: int) -> bool:
        mask = grammar.allowed([*output, *before])
        return mask is not None and bool(mask[token])

    if not draft.is_tree:
        for i, token in enumerate(draft.tokens):
            if not allows(draft.tokens[:i], token):
                return draft.truncated(i)
        return draft
    return draft.pruned(lambda node: allows(draft.path_tokens(draft.path_to(node))[:-1], draft.tokens[node]))
