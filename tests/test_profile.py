"""The profiler: its arithmetic on a model whose costs are known exactly (a fake clock that
forwards advance by a chosen amount), its protocol with the caches, and one real measurement
on a tiny random Llama."""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from clocks import FakeClock
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.tables import random_table
from verispec.profile import Profile, Timing, measure_profile, measured_autok
from verispec.proposers.draft_model import DraftModel
from verispec.proposers.prompt_lookup import PromptLookup
from verispec.randomness import Random


class TimedTable:
    """A table model whose `extend(n tokens)` takes `fixed + per_token * n` seconds on the
    clock (the first `slow_calls` calls take 10x: a cold start the warm-up must absorb)."""

    def __init__(self, clock: FakeClock, fixed: float, per_token: float, slow_calls: int = 0) -> None:
        self.table = random_table(5, 1, seed=0)
        self.vocab_size = self.table.vocab_size
        self.clock, self.fixed, self.per_token, self.slow_calls = clock, fixed, per_token, slow_calls
        self.extended: list[int] = []

    @property
    def length(self) -> int:
        return self.table.length

    def prefill(self, ids: Sequence[int]) -> None:
        self.table.prefill(ids)

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        cost = self.fixed + self.per_token * len(tokens)
        self.clock.now += cost * (10 if len(self.extended) < self.slow_calls else 1)
        self.extended.append(len(tokens))
        return self.table.extend(tokens, keep)

    def rollback(self, length: int) -> None:
        self.table.rollback(length)


class TimedLookup(PromptLookup):
    """Prompt lookup that costs `seconds` per requested token on the clock."""

    def __init__(self, clock: FakeClock, seconds: float) -> None:
        super().__init__()
        self.clock, self.seconds = clock, seconds

    def propose(self, context: Sequence[int], k: int, rng: Random):
        self.clock.now += self.seconds * k
        return super().propose(context, k, rng)


def test_v_and_c_are_the_ratios_of_the_measured_medians():
    clock = FakeClock()
    target = TimedTable(clock, fixed=0.030, per_token=0.005, slow_calls=4)
    context = [0, 1, 2, 3, 0, 1, 2]
    profile = measure_profile(
        target, TimedLookup(clock, 0.0035), context, k_max=4, repeats=3, warmup=1, clock=clock
    )
    step = 0.035
    assert profile.v == pytest.approx([(0.030 + 0.005 * n) / step for n in range(1, 6)])
    assert profile.v[0] == 1
    assert profile.c == pytest.approx(0.0035 / step)
    assert profile.score[2] == Timing(*[pytest.approx(0.045)] * 5)  # no spread once warm
    assert profile.draft.median == pytest.approx(0.0035)
    assert profile.step_seconds == pytest.approx(step)
    assert (profile.k_max, profile.context_tokens, profile.repeats) == (4, 7, 3)
    assert profile.drafted == 4  # "0 1 2" recurred: lookup proposes what followed, 3 0 1 2
    assert target.length == len(context) - 1  # the cache ends on the context, pending excluded


def test_n_values_are_interleaved_and_rotated_across_repeats():
    clock = FakeClock()
    target = TimedTable(clock, 0.01, 0.001)
    measure_profile(target, PromptLookup(), [0, 1, 2], k_max=2, repeats=2, warmup=1, clock=clock)
    assert target.extended == [1, 2, 3, 2, 3, 1, 3, 1, 2]


def test_timing_spread():
    t = Timing.of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (t.median, t.q1, t.q3, t.minimum, t.maximum) == (3.0, 2.0, 4.0, 1.0, 5.0)
    assert Timing.of([2.0]) == Timing(2.0, 2.0, 2.0, 2.0, 2.0)


def test_draft_model_proposer_is_measured_between_commits():
    """The draft model's cache must follow the context across repeats (commit crops it), so
    every repeat drafts the same tokens from the same state."""
    target, draft = random_table(4, 2, seed=1), random_table(4, 2, seed=2)
    proposer = DraftModel(draft)
    profile = measure_profile(target, proposer, [0, 1, 2, 3, 1], k_max=3, repeats=2, warmup=1)
    assert profile.drafted == 3
    assert draft.length <= 5 + 3


def test_profile_json_round_trip(tmp_path):
    clock = FakeClock()
    target = TimedTable(clock, 0.02, 0.002)
    profile = measure_profile(target, PromptLookup(), [0, 1, 0], k_max=3, repeats=2, clock=clock)
    profile.survival = [0.8, 0.5]
    profile.target = "table"
    path = tmp_path / "p.json"
    profile.save(path)
    assert Profile.load(path) == profile
    assert json.loads(path.read_text())["v"][0] == 1


def test_profile_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        Profile.load(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        Profile.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"c": 0.1}')
    with pytest.raises(ValueError, match="not a verispec profile"):
        Profile.load(tmp_path / "other.json")


def test_profile_rejects_bad_requests():
    table = random_table(3, 1, seed=0)
    with pytest.raises(ValueError, match="k_max"):
        measure_profile(table, PromptLookup(), [0, 1], k_max=0)
    with pytest.raises(ValueError, match="repeats"):
        measure_profile(table, PromptLookup(), [0, 1], repeats=0)
    with pytest.raises(ValueError, match="nonempty"):
        measure_profile(table, PromptLookup(), [])
    with pytest.raises(ValueError, match="vocabulary"):
        measure_profile(table, PromptLookup(), [0, 7])


def test_real_forwards_on_a_tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )
    target = HFCausalLM(LlamaForCausalLM(config))
    context = list(range(3, 43))
    profile = measure_profile(target, PromptLookup(), context, k_max=3, repeats=3, warmup=1)
    assert profile.v[0] == 1 and len(profile.v) == 4
    assert all(t.minimum > 0 and t.minimum <= t.q1 <= t.median <= t.q3 <= t.maximum for t in profile.score)
    assert 0 <= profile.c < 1  # a dictionary lookup is far cheaper than a forward
    assert target.length == len(context) - 1
    policy = measured_autok(target, PromptLookup(), context, k_max=3)
    assert policy.k_max == 3


@pytest.mark.slow
def test_profile_command_on_the_default_model(tmp_path, capsys):
    """`verispec profile` end to end, kept short; its JSON feeds `verispec cost --profile`."""
    from verispec.cli import main

    out, picture = tmp_path / "profile.json", tmp_path / "v.png"
    args = ["profile", "--k-max", "2", "--repeats", "2", "--warmup", "1", "--context-tokens", "64",
            "--survival-tokens", "8", "--batch-rows", "6", "--out", str(out), "--plot", str(picture), "--json"]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = Profile.load(out)
    assert printed == saved.to_dict()
    assert saved.v[0] == 1 and len(saved.v) == 3 and saved.context_tokens == 64
    assert saved.target == "smollm2-135m-instruct" and saved.proposer == "lookup"
    assert saved.survival is not None and 1 <= len(saved.survival) <= 2
    assert picture.read_bytes()[:4] == b"\x89PNG"
    assert saved.batch["rows"] == [1, 2, 3, 4, 6] and saved.batch["v"][0] == 1 and saved.batch["slots"] == 6
    assert set(saved.batch_k) == {"1", "2", "4", "8", "16", "32"} and all(0 <= k <= 2 for k in saved.batch_k.values())
    assert saved.memory["target_weight_bytes"] > 100 * 2**20 and saved.memory["kv_bytes_per_token"] > 0
    assert main(["cost", "--profile", str(out)]) == 0
    assert "best k" in capsys.readouterr().out


def quick_loaded():
    from pathlib import Path

    from verispec.bench.quick import tiny_llama, tiny_tokenizer
    from verispec.models.loading.load import LoadedModel

    tokenizer = tiny_tokenizer()
    model = tiny_llama(len(tokenizer), layers=2)
    return LoadedModel(name="tiny", lm=HFCausalLM(model), model=model, tokenizer=tokenizer,
                       eos_token_ids=(tokenizer.eos_token_id,), dtype=torch.float32, source=Path("(memory)"))


@pytest.mark.parametrize("values, says", [
    ({"k_max": 0}, r"k_max must be an integer in \[1, 256\]"), ({"k_max": True}, "k_max must be an integer"),
    ({"batch_rows": 9000}, r"batch_rows must be an integer in \[0, 512\]"), ({"tree_nodes": 300}, "tree_nodes"),
    ({"repeats": 2.5}, "repeats must be an integer >= 1"), ({"context_tokens": 1}, "context_tokens"),
])
def test_profile_settings_refuse_bad_values_when_made(values, says):
    from verispec.profiling import ProfileSettings

    with pytest.raises(ValueError, match=says):
        ProfileSettings(**values)


def test_profile_model_returns_the_whole_profile_and_refuses_what_the_model_cannot_hold():
    from verispec.profiling import ProfileSettings, profile_model

    loaded = quick_loaded()
    prompt = loaded.encode("abcabcabcabc", chat=False)
    settings = ProfileSettings(k_max=2, repeats=1, warmup=0, survival_tokens=4, batch_rows=3, tree_nodes=2)
    measured = profile_model(loaded, PromptLookup(), "lookup", prompt, settings)
    assert measured.proposer == "lookup" and len(measured.v) == 3 and len(measured.tree_v) == 3
    assert measured.survival is not None and measured.batch["rows"] == [1, 2, 3] and measured.batch_k is not None
    assert measured.memory["kv_bytes_per_token"] > 0 and measured.machine["runtime"] == "hf"
    with pytest.raises(ValueError, match=r"k_max \+ 1 scored tokens \(2065 tokens\).* the model's context of 2048 tokens"):
        profile_model(loaded, PromptLookup(), "lookup", prompt, ProfileSettings(context_tokens=2048))


def test_the_profile_command_prints_what_profile_model_measured(tmp_path, capsys):
    """The command is options, one `profile_model` call and printing: on a tiny checkpoint."""
    from serving import save_tiny_model

    from verispec.cli import main

    model = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "p.json"
    args = ["profile", "--model", str(model), "--k-max", "2", "--repeats", "1", "--warmup", "0", "--survival-tokens", "4",
            "--batch-rows", "2", "--tree-nodes", "1", "--context-tokens", "16", "--out", str(out), "--json"]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == Profile.load(out).to_dict() and printed["context_tokens"] == 16 and printed["batch"]["rows"] == [1, 2]
    # The kernel path of the fast runtime's projections: 4 layers' qkv, o, gate_up and down, and the head.
    assert printed["machine"]["runtime"].startswith("fast") and printed["machine"]["projections"].endswith(" x17")
    assert main(["profile", "--model", str(model), "--context-tokens", "4000", "--batch-rows", "0"]) == 2
    assert "the model's context of 2048 tokens" in capsys.readouterr().err


def test_profile_keep_costs_records_the_curve_auto_weighs(tmp_path, capsys, monkeypatch):
    """--keep-costs: the measured t(1) and batched v(n) become this machine's curve for the
    model's format and runtime, which `plan_load` reads back (`models.loading.format_costs`)."""
    from serving import save_tiny_model

    from verispec.cli import main
    from verispec.cli.profile import costs_refusal
    from verispec.machine import cpu_model
    from verispec.models.loading import format_costs

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    model = save_tiny_model(tmp_path / "tiny")
    args = ["profile", "--model", str(model), "--k-max", "1", "--repeats", "1", "--warmup", "0", "--survival-tokens", "0",
            "--batch-rows", "3", "--tree-nodes", "0", "--context-tokens", "16", "--dtype", "float32", "--keep-costs"]
    assert main(args) == 0
    assert "--dtype auto and --runtime auto weigh it" in capsys.readouterr().err
    (kept,) = format_costs.measured(model, cpu_model(), torch.get_num_threads())
    assert kept.runtime == "fast" and kept.weight_format == "float32" and kept.rows == (1, 2, 3) and kept.v[0] == 1
    assert kept.t1 > 0 and "verispec profile" in kept.source
    gpu = SimpleNamespace(device="cuda:0", runtime="static", dtype_name="bfloat16")
    assert "not the static runtime on cuda:0" in costs_refusal(gpu)
    assert "not float16" in costs_refusal(SimpleNamespace(device="cpu", runtime="hf", dtype_name="float16"))
