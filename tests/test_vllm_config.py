"""`verispec profile --vllm-config`: the speculative_config vLLM would serve with, from a
profile: its fields from a made-up profile with known costs, the command end to end on a
tiny checkpoint, vLLM's own SpeculativeConfig accepting every key written (in vLLM's venv),
and bad input refused before any measurement."""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

import pytest
from transformers.utils import logging as hf_logging

from verispec.bench.quick import tiny_llama, tiny_tokenizer
from verispec.peers.vllm import VENV_PYTHON
from verispec.cli import main
from verispec.profile import Profile, Timing
from verispec.registry import parse_spec
from verispec.vllm_config import batch_schedule, drafter, vllm_config

SECOND = Timing(1.0, 1.0, 1.0, 1.0, 1.0)


def made_up_profile(batch_v: list[float]) -> Profile:
    """Prompt lookup at c = 0.01 with a flat v(n) for one request and survival 0.8, 0.6, 0.4;
    the batched forward's v over 1..64 rows as given."""
    return Profile(
        c=0.01, v=[1.0, 1.01, 1.02, 1.03], score=[SECOND] * 4, draft=SECOND, drafted=3.0, context_tokens=40,
        repeats=3, machine={"cpu": "a CPU", "dtype": "float32", "runtime": "fast", "verispec": "0.1.0"},
        target="tiny", proposer="lookup", survival=[0.8, 0.6, 0.4],
        batch={"rows": [1, 2, 4, 8, 16, 32, 64], "v": batch_v, "score": [], "slots": 8, "context_tokens": 40},
    )


def test_the_schedule_drafts_less_as_the_batched_forward_turns_compute_bound():
    profile = made_up_profile([1.0, 1.01, 1.03, 1.2, 2.0, 4.0, 8.0])
    config = vllm_config(profile, drafter(parse_spec("lookup")), today=datetime.date(2026, 12, 3))
    speculative = config["speculative_config"]
    assert speculative["method"] == "ngram" and (speculative["prompt_lookup_min"], speculative["prompt_lookup_max"]) == (1, 3)
    assert speculative["num_speculative_tokens"] == 3  # flat v, cheap drafts: every measured k pays
    ks = config["verispec"]["k_per_batch_size"]
    assert list(ks) == [str(b) for b in range(1, 65)] and ks["1"] == 3
    assert all(ks[str(b)] >= ks[str(b + 1)] for b in range(1, 64)) and ks["64"] == 0
    schedule = speculative["num_speculative_tokens_per_batch_size"]
    assert schedule[0][0] == 1 and schedule[-1][1:] == [64, 0]
    assert all(a[1] + 1 == b[0] for a, b in zip(schedule, schedule[1:]))  # contiguous ranges
    assert [k for first, last, k in schedule for _ in range(first, last + 1)] == list(ks.values())
    measured = config["verispec"]["measured"]
    assert (measured["model"], measured["dtype"], measured["c"], measured["date"]) == ("tiny", "float32", 0.01, "2026-12-03")
    assert measured["v"] == profile.v and measured["survival"] == profile.survival and measured["batch_v"][-1] == 8.0
    assert isinstance(measured["cpu_flags"], list) and measured["verispec"] == "0.1.0"


def test_no_speculation_where_no_k_pays_for_one_request():
    profile = made_up_profile([1.0] * 7)
    profile.v = [1.0, 2.0, 3.0, 4.0]  # scoring is linear: a draft never pays
    config = vllm_config(profile, drafter(parse_spec("lookup")))
    assert config["speculative_config"] is None and config["verispec"]["k_per_batch_size"]["1"] == 0


def test_batch_schedule_merges_equal_neighbours():
    assert batch_schedule({1: 2}) == [[1, 1, 2]]
    assert batch_schedule({1: 3, 2: 3, 4: 1, 8: 0}) == [[1, 3, 3], [4, 7, 1], [8, 8, 0]]
    with pytest.raises(ValueError, match="starts at batch size 1"):
        batch_schedule({2: 1})


def test_each_proposer_maps_to_vllms_method(tmp_path):
    exported = tmp_path / "e3"
    exported.mkdir()
    (exported / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    assert drafter(parse_spec(f"eagle3:{exported}")) == {"method": "eagle3", "model": str(exported.resolve())}
    medusa = tmp_path / "m"
    medusa.mkdir()
    (medusa / "config.json").write_text(json.dumps({"num_heads": 4}))
    assert drafter(parse_spec("medusa"), medusa) == {"method": "medusa", "model": str(medusa.resolve())}
    assert drafter(parse_spec(f"draft:{medusa}"))["method"] == "draft_model"
    for spec, head, message in (("eagle3:heads/none", None, "reads a speculators export"),
                                ("medusa", None, "give --vllm-head"), ("random", None, "no method for proposer random"),
                                ("lookup", medusa, "proposer lookup has none")):
        with pytest.raises(ValueError, match=message):
            drafter(parse_spec(spec), head)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("target")
    tokenizer = tiny_tokenizer()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tiny_llama(len(tokenizer)).save_pretrained(root)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(root)
    return root


def test_the_command_writes_the_config_from_its_measurements(checkpoint, tmp_path, capsys):
    out, profile = tmp_path / "vllm.json", tmp_path / "profile.json"
    args = ["profile", "--model", str(checkpoint), "--k-max", "2", "--repeats", "2", "--warmup", "1",
            "--tree-nodes", "0", "--context-tokens", "32", "--survival-tokens", "8", "--batch-rows", "6",
            "--out", str(profile), "--vllm-config", str(out)]
    assert main(args) == 0
    capsys.readouterr()
    config = json.loads(out.read_text())
    saved = Profile.load(profile)
    assert set(config) == {"speculative_config", "verispec"}
    assert list(config["verispec"]["k_per_batch_size"]) == [str(b) for b in range(1, 7)]
    measured = config["verispec"]["measured"]
    assert measured["v"] == saved.v and measured["c"] == saved.c and measured["batch_rows"] == [1, 2, 3, 4, 6]
    assert measured["model"] == saved.target and measured["dtype"] == saved.machine["dtype"]
    if config["speculative_config"] is not None:
        assert config["speculative_config"]["method"] == "ngram"
        assert config["speculative_config"]["num_speculative_tokens"] == config["verispec"]["k_per_batch_size"]["1"]


VLLM_CHECK = """
import dataclasses, json, sys
from vllm.config.speculative import SpeculativeConfig
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
config = json.loads(sys.stdin.read())
print(json.dumps({"fields": [f.name for f in dataclasses.fields(SpeculativeConfig)],
                  "dense": build_dynamic_sd_schedule_lookup(config["num_speculative_tokens_per_batch_size"], 80,
                                                            config["num_speculative_tokens"])}))
"""


@pytest.mark.skipif(not VENV_PYTHON.is_file(), reason="vLLM's CPU build is not installed: make vllm-env")
def test_vllm_accepts_every_key_written(tmp_path):
    exported = tmp_path / "e3"
    exported.mkdir()
    (exported / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    ngram = vllm_config(made_up_profile([1.0, 1.01, 1.03, 1.2, 2.0, 4.0, 8.0]), drafter(parse_spec("lookup")))
    eagle3 = vllm_config(made_up_profile([1.0, 1.01, 1.03, 1.2, 2.0, 4.0, 8.0]), drafter(parse_spec(f"eagle3:{exported}")))
    for config in (ngram["speculative_config"], eagle3["speculative_config"]):
        answer = subprocess.run([str(VENV_PYTHON), "-P", "-c", VLLM_CHECK], input=json.dumps(config), text=True,
                                capture_output=True, check=True)
        checked = json.loads(answer.stdout.splitlines()[-1])
        assert set(config) <= set(checked["fields"])
        ks = ngram["verispec"]["k_per_batch_size"]
        assert checked["dense"][1:65] == [ks[str(b)] for b in range(1, 65)]
        assert checked["dense"][65:] == [0] * 16  # vLLM carries the last k (0) to larger batches


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_bad_input_is_refused_before_measuring(tmp_path, capsys):
    existing = tmp_path / "vllm.json"
    existing.write_text("{}")
    assert "already exists; pass --force" in one_line_error(capsys, ["profile", "--vllm-config", str(existing)])
    assert "is not a directory" in one_line_error(capsys, ["profile", "--vllm-config", str(tmp_path / "no" / "v.json")])
    assert "must end in .json" in one_line_error(capsys, ["profile", "--vllm-config", str(tmp_path / "v.txt")])
    fresh = str(tmp_path / "fresh.json")
    assert "--batch-rows >= 2" in one_line_error(capsys, ["profile", "--vllm-config", fresh, "--batch-rows", "0"])
    assert "--survival-tokens > 0" in one_line_error(capsys, ["profile", "--vllm-config", fresh, "--survival-tokens", "0"])
    assert "no method for proposer random" in one_line_error(capsys, ["profile", "--proposer", "random", "--vllm-config", fresh])
    assert "reads a speculators export" in one_line_error(
        capsys, ["profile", "--proposer", f"eagle3:{tmp_path}", "--vllm-config", fresh])
    assert "goes with --vllm-config" in one_line_error(capsys, ["profile", "--vllm-head", str(tmp_path)])
    assert not (tmp_path / "fresh.json").exists()
