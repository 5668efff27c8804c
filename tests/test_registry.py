"""The registry: every proposer spec builds its proposer, malformed specs say what to write
instead, a draft model with another tokenizer is refused, k specs parse once, and a proposer
registered by a test is found by every part that lists proposers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from verispec.audit.exhaustive import audited_proposers, default_configurations
from verispec.bench.identity_suite import identity_proposers, identity_suite
from verispec.bench.methods import parse_method
from verispec.bench.quick import quick_workloads
from verispec.bench.suite import QUICK_DRAFT, make_runner, quick_target
from verispec.cli import main
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.loading.load import LoadedModel, load_tokenizer
from verispec.proposers import DraftModel, PromptLookup, RandomTokens, SuffixIndex
from verispec.proposers.base import Draft
from verispec.proposers.layer_skip import LayerSkip
from verispec.registry import PROPOSERS, KSpec, ProposerKind, ProposerSpec, build_proposer, check_k, parse_k, register

VOCAB = 64


def tiny_llama(vocab: int, layers: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
    )
    return LlamaForCausalLM(config)


def loaded(model: LlamaForCausalLM, tokenizer=None) -> LoadedModel:
    return LoadedModel(
        name="tiny", lm=HFCausalLM(model), model=model, tokenizer=tokenizer, eos_token_ids=(),
        dtype=torch.float32, source=Path("tiny"),
    )


@pytest.fixture(scope="module")
def target() -> LoadedModel:
    return loaded(tiny_llama(VOCAB, 3))


def test_each_spec_builds_its_proposer(target):
    assert isinstance(build_proposer("lookup", target), PromptLookup)
    assert isinstance(build_proposer(" random ", target), RandomTokens)
    assert build_proposer("random", target).vocab_size == VOCAB
    suffix = build_proposer("suffix", target, corpus=[[1, 2, 3]])
    assert isinstance(suffix, SuffixIndex) and suffix.corpus == [(1, 2, 3)]
    skip = build_proposer("layerskip:2", target)
    assert isinstance(skip, LayerSkip) and skip.layers == 2 and skip.head_tokens is None
    pruned = build_proposer("layerskip:1:5", target, corpus=[[9, 9, 7]])
    assert pruned.layers == 1 and pruned.head_tokens.tolist() == [0, 1, 2, 7, 9]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "unknown proposer ''; choose lookup, suffix, lookahead"),
        ("hydra", "unknown proposer 'hydra'"),
        ("lookup:3", "lookup takes no argument"),
        ("random:7", "random takes no argument"),
        ("draft", "draft needs an argument: write draft:PATH, got 'draft'"),
        ("draft:", "draft needs an argument: write draft:PATH"),
        ("layerskip", r"layerskip needs an argument: write layerskip:L\[:N\]"),
        ("layerskip:1:2:3", r"layerskip needs layerskip:L or layerskip:L:N, got 'layerskip:1:2:3'"),
        ("layerskip:two", "layerskip:L needs an integer number of layers L, got 'two'"),
        ("layerskip:0", r"layerskip:L needs 1 <= L < 3 \(the target has 3 layers\), got 0"),
        ("layerskip:3", r"1 <= L < 3 \(the target has 3 layers\), got 3"),
        ("layerskip:1:", "layerskip:L:N needs an integer number of head tokens N, got ''"),
        ("layerskip:1:0", r"layerskip:L:N needs 1 <= N <= 64 \(the vocabulary size\), got 0"),
        ("selfdraft:q8", "selfdraft:FORMAT takes q4 or int8, got 'selfdraft:q8'"),
        ("selfdraft", "int4 layers need K a multiple of 32, got 16"),
        ("layerskip:1:65", r"1 <= N <= 64"),
        ("lookahead:3", r"lookahead options are W=window, N=n-gram size and G=pool width joined by ':'"),
        ("lookahead:N=1", "lookahead's n-gram size N must be an integer >= 2, got 1"),
        ("eagle:weights=int4", r"eagle:\.\.\.:weights=F takes auto, float32, bfloat16, int8; got 'int4' in 'eagle:weights=int4'"),
        ("lookup+medusa:heads/m:weights=", "medusa:...:weights=F takes auto, float32, bfloat16, int8; got ''"),
    ],
)
def test_malformed_specs_are_refused(target, spec, message):
    with pytest.raises(ValueError, match=message):
        build_proposer(spec, target)


def test_a_missing_draft_model_is_a_missing_file(target, tmp_path):
    with pytest.raises(FileNotFoundError, match="verispec never downloads models"):
        build_proposer(f"draft:{tmp_path / 'absent'}", target)


@pytest.mark.slow
def test_a_draft_must_share_the_targets_tokenizer(tmp_path):
    """A tiny random model saved with the default model's tokenizer is accepted as a draft;
    the same model with one token added to its tokenizer is refused."""
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    vocab = len(tokenizer)
    target = loaded(tiny_llama(vocab, 2), tokenizer)
    same = tmp_path / "same"
    tiny_llama(vocab, 1).save_pretrained(same)
    tokenizer.save_pretrained(same)
    draft = build_proposer(f"draft:{same}", target)
    assert isinstance(draft, DraftModel) and draft.vocab_size == vocab
    other = tmp_path / "other"
    tiny_llama(vocab, 1).save_pretrained(other)
    changed = load_tokenizer("smollm2-135m-instruct")
    changed.add_tokens(["<verispec-extra>"])
    changed.save_pretrained(other)
    with pytest.raises(ValueError, match="tokenizers do not match"):
        build_proposer(f"draft:{other}", target)


# --- k specs -------------------------------------------------------------------------------


def test_k_specs_parse_once():
    assert parse_k(" 4 ") == KSpec("constant", k=4)
    assert parse_k("auto") == KSpec("auto") and parse_k("heuristic") == KSpec("heuristic")
    assert parse_k("auto:p.json") == KSpec("auto", profile="p.json")
    with pytest.raises(ValueError, match="auto:PROFILE.json needs the profile's path"):
        parse_k("auto:")
    for bad in ("abc", "", "4.5"):
        with pytest.raises(ValueError, match=r"--k must be an integer >= 1, auto, auto:PROFILE.json, heuristic, tree, tree:PROFILE.json or tree:W1xW2x...") as error:
            parse_k(bad)
        assert "k = 0" not in str(error.value) and ">= 0" not in str(error.value)
    for zero in ("0", "-1", "+0"):
        with pytest.raises(ValueError, match="k = 0 would decode plainly"):
            parse_k(zero)
    assert check_k(0, minimum=0) == 0 and check_k(3) == 3
    for bad in (0, True, 1.0, "1"):
        with pytest.raises(ValueError, match="must be an integer >= 1"):
            check_k(bad)


def test_an_entry_must_be_complete():
    with pytest.raises(ValueError, match="drafts must be 'chosen', 'sampled' or 'mixed'"):
        ProposerKind("x", "x", "guessed", lambda a, t, c: None, "x", not_audited="no tables")
    with pytest.raises(ValueError, match="either an audit builder or the reason"):
        ProposerKind("x", "x", "chosen", lambda a, t, c: None, "x")
    with pytest.raises(ValueError, match="grammar 'y:N' starts with it"):
        ProposerKind("x", "y:N", "chosen", lambda a, t, c: None, "x", not_audited="no tables")
    with pytest.raises(ValueError, match="already registered"):
        register(PROPOSERS["lookup"])


# --- a proposer registered by a test is found everywhere --------------------------------------


class RepeatLast:
    """Drafts the context's last token k times (chosen, q None): a toy proposer."""

    def begin(self, prompt_ids, sampling) -> None:
        pass

    def commit(self, context) -> None:
        pass

    def propose(self, context, k, rng) -> Draft:
        return Draft((context[-1],) * k)

    def propose_stateless(self, context, k, rng) -> Draft:
        return self.propose(context, k, rng)


REPEAT = ProposerKind(
    "repeat", "repeat", "chosen", lambda argument, target, corpus: RepeatLast(),
    "repeats the last token", audit=lambda tables: RepeatLast(), example="repeat",
)


@pytest.fixture
def repeat_registered():
    register(REPEAT)
    try:
        yield REPEAT
    finally:
        del PROPOSERS["repeat"]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The benchmark's quick target and the directory of its saved 2-layer draft (a model the
    CLI can load by path)."""
    out = tmp_path_factory.mktemp("quick")
    return quick_target(out), out / QUICK_DRAFT


def test_a_registered_proposer_is_listed(repeat_registered, capsys):
    assert main(["proposers", "--json"]) == 0
    listed = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)["proposers"]}
    assert set(listed) == {"lookup", "suffix", "lookahead", "draft", "layerskip", "selfdraft", "random", "eagle", "eagle3",
                           "medusa", "lookup+eagle", "lookup+medusa", "repeat"}
    assert listed["repeat"] == {
        "name": "repeat", "grammar": "repeat", "drafts": "chosen", "rules": ["greedy", "coupled", "point-mass", "token", "block"],
        "audited": True, "not_audited": None, "description": "repeats the last token", "trees": False,
    }
    assert main(["proposers"]) == 0
    text = capsys.readouterr().out
    assert "repeat  " in text and "audited: verispec audit --proposer repeat" in text
    assert "not audited: it needs a transformer's layers" in text


def test_a_registered_proposer_generates_from_the_cli(repeat_registered, quick, capsys):
    _, model_dir = quick
    argv = ["generate", "--model", str(model_dir), "--proposer", "repeat", "--k", "2", "--no-chat",
            "--max-new-tokens", "6", "--json", "--compare", "abab"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["proposer"] == "repeat" and report["new_tokens"] == 6 and report["identical"]
    assert main(argv[:4] + ["repeat:2"] + argv[5:]) == 2
    assert "repeat takes no argument" in capsys.readouterr().err


def test_a_registered_proposer_is_a_bench_method(repeat_registered, quick):
    loaded, _ = quick
    method = parse_method("verispec-repeat-k3")
    assert (method.proposer, method.k, method.k_spec) == ("repeat", 3, KSpec("constant", k=3))
    prompt = quick_workloads()[0].token_ids(loaded)
    runner = make_runner(method, loaded, prompt)
    assert isinstance(runner.proposer, RepeatLast)
    outcome = runner(prompt, 8)
    plain = make_runner(parse_method("verispec-plain"), loaded, prompt)(prompt, 8)
    assert outcome.tokens == plain.tokens and outcome.stats.rounds > 0 and sum(outcome.stats.drafted) > 0


def test_a_registered_proposer_is_audited(repeat_registered, capsys):
    assert [kind.name for kind in audited_proposers()][-1] == "repeat"
    configurations = default_configurations([REPEAT])
    assert {c.rule for c in configurations} == {"greedy", "coupled", "point-mass", "token", "block"}
    assert main(["audit", "--json", "--proposer", "repeat"]) == 0
    report = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in report["results"]]
    assert len(names) == len(configurations) and all(name.startswith("repeat | ") for name in names)
    assert report["passed"]


def test_a_registered_proposer_joins_the_identity_suite(repeat_registered, quick):
    loaded, _ = quick
    assert identity_proposers()[-1] == "repeat" and "layerskip:8" in identity_proposers()
    records = identity_suite(loaded, quick_workloads()[:1], ["repeat"], ["2"], 8)
    assert [r["method"] for r in records] == ["hf-generate", "repeat k=2"]
    assert all(r["identical"] for r in records)


def test_the_readme_table_matches_the_registry():
    """The README's proposer table is `verispec proposers` as a table: one row per kind, in
    registry order (a kind registered later needs its row; the failure prints the table)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = readme.index("## Proposers (`verispec.registry`)")
    section = readme[start : readme.index("\n## ", start)]  # this section only, not later tables
    rows = [line for line in section.splitlines() if line.startswith("| `")][1:]  # after the header
    expected = [
        f"| `{kind.grammar}` | {kind.drafts} | {', '.join(kind.rules)} | {'yes' if kind.audit else 'no'} | {kind.description} |"
        for kind in PROPOSERS.values()
    ]
    assert rows == expected, "README's proposer table should read:\n" + "\n".join(expected)


# --- a spec is parsed once, where it enters --------------------------------------------------


def test_a_spec_parses_into_its_kinds_typed_options():
    from verispec.proposers.layer_skip import LayerSkipSpec
    from verispec.proposers.lookahead import LookaheadSpec
    from verispec.proposers.trained import HeadSpec
    from verispec.registry import ProposerSpec, parse_spec

    assert parse_spec(" lookup ").options is None and str(parse_spec(" lookup ")) == "lookup"
    assert parse_spec("layerskip:8:512").options == LayerSkipSpec(8, 512)
    assert parse_spec("lookahead:G=2").options == LookaheadSpec(pool=2)
    assert parse_spec("eagle:heads/e:weights=int8").options == HeadSpec("eagle", "heads/e", "int8")
    assert parse_spec("lookup+medusa").options == HeadSpec("medusa")
    assert parse_spec("selfdraft").options == "q4" and parse_spec("draft:m/x").options == "m/x"
    spec = parse_spec("random")
    assert isinstance(spec, ProposerSpec) and parse_spec(spec) is spec and spec.kind is PROPOSERS["random"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("layerskip:two", "layerskip:L needs an integer number of layers L"),
        ("layerskip:1:2:3", "layerskip needs layerskip:L or layerskip:L:N"),
        ("selfdraft:q8", "selfdraft:FORMAT takes q4 or int8"),
        ("lookahead:N=1", "lookahead's n-gram size N must be an integer >= 2, got 1"),
        ("eagle:weights=int4", r"eagle:\.\.\.:weights=F takes auto"),
    ],
)
def test_a_specs_format_errors_need_no_target(spec, message):
    """Everything the text alone can get wrong is refused by `parse_spec`, before a model loads."""
    from verispec.registry import parse_spec

    with pytest.raises(ValueError, match=message):
        parse_spec(spec)


def test_a_builder_takes_the_parsed_spec(target):
    from verispec.registry import parse_spec

    spec = parse_spec("layerskip:1:5")
    assert build_proposer(spec, target, corpus=[[9, 9, 7]]).head_tokens.tolist() == [0, 1, 2, 7, 9]
    seen = []
    kind = ProposerKind("spy", "spy:X", "chosen", lambda options, t, c: seen.append(options), "x",
                        not_audited="a test's spy", parse=lambda argument: ("parsed", argument))
    build_proposer(ProposerSpec(kind, kind.parse("a"), "spy:a"), target)
    assert seen == [("parsed", "a")]


def test_k_is_read_once_by_the_cli_the_bench_and_a_request():
    from verispec.request import Request

    assert Request((1,), 4, proposer="lookup", k="auto").k_spec == KSpec("auto")
    assert Request((1,), 4, proposer="lookup", k=3).k_spec == Request((1,), 4, proposer="lookup", k=" 3 ").k_spec
    assert Request((1,), 4).k_spec is None
    with pytest.raises(ValueError, match="k must be an integer >= 1, auto"):
        Request((1,), 4, proposer="lookup", k="many")
    method = parse_method("verispec-lookup-tree:2x1")
    assert method.k_spec == KSpec("tree", widths=(2, 1)) and method.proposer_spec.kind is PROPOSERS["lookup"]
    assert parse_method("verispec-lookup-k4").k_spec == parse_k("4") == parse_k(4)
