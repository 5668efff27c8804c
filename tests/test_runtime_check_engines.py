"""The engines `verispec check-runtime` drives, on tiny models: transformers `generate`
(assisted by a truncated copy, prompt lookup) and an OpenAI-compatible server (`verispec serve`
with and without speculation). Each samples the right number of continuations, reports what it
refuses instead of dropping it, and passes the sampled-law check at a small N.

False failure: the sampled-law rows here are G-tests at alpha = 1e-3; 6 of them (3 per
engine test below), so a correct engine fails this module with probability at most 6e-3 for a
fresh seed list (union bound); the seeds are fixed, so the outcome is deterministic.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from serving import NAME, running, save_tiny_model
from verispec.bench.quick import tiny_tokenizer
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.loading.load import load_model
from verispec.runtime_check import Reference, Settings, check_runtime
from verispec.runtime_check.cases import SamplingCase
from verispec.runtime_check.engines.base import Refused
from verispec.runtime_check.engines.hf import HFEngine, flattened_draft, truncated_draft
from verispec.runtime_check.engines.openai import OpenAIEngine
from verispec.runtime_check.report import HOLDS, LACKS, PASS, REFUSED, SKIPPED

CASES = [SamplingCase("default"), SamplingCase("frequency_penalty", frequency_penalty=1.0)]


def spread_llama() -> LlamaForCausalLM:
    """A random two-layer Llama over 24 tokens whose next-token laws are spread but not flat."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=24, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2)
    return LlamaForCausalLM(config).eval()


def test_hf_generate_is_checked_with_both_methods():
    model = spread_llama()
    assert len(truncated_draft(model, 1).model.layers) == 1 and len(model.model.layers) == 2
    engine = HFEngine(model, eos_ids=(), dtype="float32", draft_layers=1)
    reference = Reference(HFCausalLM(model).score, encode=None, eos_ids=())
    settings = Settings(n=160, prompts=2, sample_prompts=[[3, 9, 4], [7, 1, 1]], cases=CASES,
                        greedy_prompts=[[3, 9, 4], [5, 6]], greedy_tokens=8, concurrency=(2,))
    report = check_runtime(engine, reference, ["assisted", "lookup"], settings)
    default = [row for row in report.law_rows if row.parameter == "default"]
    assert [row.status for row in default] == [PASS] * 5, report.markdown()
    assert [(parameter, line.split(":")[0]) for parameter, line in report.drafts] == [
        ("default", "assisted, default"), ("frequency_penalty", "assisted, frequency_penalty")]
    assert "Draft chosen by the check: assisted, default: the target with its head scaled" in report.markdown()
    assert all(row.drafts[0] > 0 and 0 <= row.drafts[1] <= row.drafts[0] for row in default if row.method != "plain")
    assert all(row.status == REFUSED and "frequency" in row.reason
               for row in report.law_rows if row.parameter == "frequency_penalty")
    statuses = {(row.method, row.concurrency): row.status for row in report.greedy_rows}
    assert statuses[("assisted", 1)] == PASS and statuses[("lookup", 1)] == PASS
    assert statuses[("assisted", 2)] == REFUSED  # HF speculates on one sequence at a time
    assert all(len(s) == 3 for s in engine.sample([3, 9, 4], CASES[0], 5, 3, "lookup", 0))
    assert torch.allclose(engine.logits([3, 9, 4]), reference.score([3, 9, 4])[-1], atol=1e-5)  # HF's own logits


def test_hf_builds_a_draft_accepting_half_and_counts_what_it_kept():
    """For the sampled law the check builds the assisted draft itself: the target with its head
    scaled by beta (so it drafts p^beta), beta chosen so that the first drafted token is accepted
    half the time after the prompts on average; and it reads from HF's candidate generator how
    many drafted tokens each call kept: all of them where the draft is the target itself."""
    model = spread_llama()
    engine = HFEngine(model, eos_ids=(), dtype="float32")
    prompts = [[3, 9, 4], [7, 1, 1]]
    assert engine.fit_draft(prompts, ["lookup"], CASES[0], 3) == []
    (line,) = engine.fit_draft(prompts, ["assisted", "lookup"], CASES[0], 3)
    # this model's rows are so spread that even the flattest draft (beta 0.001) accepts more than half
    assert line.startswith("assisted, default:") and "beta 0.001 " in line
    assert float(line.split("chance ")[1].split(" ")[0]) > 0.5

    def law(lm, prompt):
        with torch.inference_mode():
            return torch.softmax(lm(torch.tensor([prompt])).logits[0, -1].double(), -1)  # [V]

    for prompt in prompts:
        assert torch.allclose(law(engine._draft, prompt), torch.full((24,), 1 / 24, dtype=torch.float64), atol=1e-3)
    draft, beta, chance = flattened_draft(model, prompts, acceptance=0.8, positions=1)
    p, q = [law(model, x) for x in prompts], [law(draft, x) for x in prompts]
    assert 0.001 < beta < 1 and all(torch.allclose(b, a ** beta / (a ** beta).sum(), atol=1e-4) for a, b in zip(p, q))
    assert sum(float(torch.minimum(a, b).sum()) for a, b in zip(p, q)) / 2 == pytest.approx(chance, abs=1e-4)
    assert chance == pytest.approx(0.8, abs=1e-3)
    assert model.get_output_embeddings().weight.data_ptr() != draft.get_output_embeddings().weight.data_ptr()
    colder = SamplingCase("temperature", temperature=0.3)  # fitted per parameter: the chance is read under it
    again, cold_beta, cold_chance = flattened_draft(model, prompts, colder, acceptance=0.8, draft=draft)
    assert again is draft and cold_beta != beta and cold_chance == pytest.approx(0.8, abs=1e-3)
    # over two positions: the second after each prompt's likeliest token under the case
    path = [[*x, int(torch.argmax(law(model, x)))] for x in prompts]
    _, both_beta, both = flattened_draft(model, prompts, acceptance=0.8, draft=draft)
    assert both == pytest.approx(0.8, abs=1e-3) and both == pytest.approx(sum(
        float(torch.minimum(law(model, x), law(draft, x)).sum()) for x in [*prompts, *path]) / 4, abs=1e-4)
    engine.sample([3, 9, 4], CASES[0], 10, 4, "assisted", 0)
    drafted, accepted = engine.drafts()
    assert drafted > 0 and 0 < accepted < drafted
    itself = HFEngine(model, eos_ids=(), dtype="float32", draft_layers=2)
    itself.sample([3, 9, 4], CASES[0], 10, 4, "assisted", 0)
    assert itself.drafts()[0] > 0 and itself.drafts()[1] == itself.drafts()[0]


def test_jobs_report_the_drafts_one_process_reports(tmp_path):
    """`--jobs 2` splits the parameters over two processes, each fitting HF's assisted draft
    before its own parameters' samples: the merged report names the same drafts, for the same
    parameters, in the same order as one process (the fit depends on the parameter and the
    prompts only). About 15 s: three processes start transformers."""
    import json

    from verispec.cli import main

    model = save_tiny_model(tmp_path / "tiny")
    argv = ["check-runtime", "hf", "--method", "assisted", "--model", str(model), "--dtype", "float32", "--n", "20",
            "--parameter", "temperature", "--parameter", "default", "--greedy-prompts", "0", "--seeded", "0"]
    assert main([*argv, "--out", str(tmp_path / "one")]) == 0
    assert main([*argv, "--jobs", "2", "--out", str(tmp_path / "two")]) == 0
    one, two = (json.loads((tmp_path / d / "check-runtime-hf-assisted.json").read_text()) for d in ("one", "two"))
    assert [d["parameter"] for d in one["drafts"]] == ["default", "temperature"]
    assert two["drafts"] == one["drafts"]
    chosen = [line for line in (tmp_path / "two" / "check-runtime-hf-assisted.md").read_text().splitlines()
              if line.startswith("Draft chosen by the check")]
    assert chosen == [f"Draft chosen by the check: {d['draft']}." for d in one["drafts"]]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """A random two-layer Llama over the tiny byte tokenizer whose next-token laws are spread
    (about 2.3 nats after the test's prompt; the served tiny model cycles almost surely)."""
    root = tmp_path_factory.mktemp("spread")
    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, initializer_range=0.6,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).eval().save_pretrained(root)
    tokenizer.save_pretrained(root)
    return load_model(root)


def test_an_openai_server_is_checked_against_a_plain_one(loaded):
    with running(loaded, proposer="lookup", k=3) as spec, running(loaded, proposer=None, k=0) as plain:
        engine = OpenAIEngine(f"http://127.0.0.1:{spec.port}", f"http://127.0.0.1:{plain.port}", NAME, "float32")
        assert "served server" in engine.versions()
        with pytest.raises(Refused, match="400"):
            engine.sample([5, 6, 7], CASES[1], 1, 3, "served", 0)
        reference = Reference(loaded.lm.score, encode=None, eos_ids=loaded.eos_token_ids)
        prompt = loaded.encode("abcabcab", chat=False)
        settings = Settings(n=150, prompts=1, sample_prompts=[prompt], cases=CASES,
                            greedy_prompts=[prompt, loaded.encode("hello", chat=False)], greedy_tokens=16, concurrency=(2,),
                            seeded=4)
        report = check_runtime(engine, reference, ["served"], settings)
    assert [row.status for row in report.law_rows if row.parameter == "default"] == [PASS] * 3, report.markdown()
    assert all(row.status == REFUSED for row in report.law_rows if row.parameter == "frequency_penalty")
    assert {row.status for row in report.greedy_rows} == {PASS}
    seeded = {(row.method, row.in_flight): row.status for row in report.seeded_rows}
    assert seeded[("plain, again", 1)] == seeded[("plain", 4)] == HOLDS  # a seed reproduces, alone or 4 at once
    assert {row.status for row in report.probe_rows} <= {PASS, SKIPPED}  # the server seeds each unseeded request afresh


def test_a_server_whose_model_is_unknown_is_checked_by_its_replies(loaded):
    """`--model none`: no exact law, so spec vs plain on cells chosen from both samples and
    seeded identity run on text prompts the server encodes; the rest is listed as not run."""
    with running(loaded, proposer="lookup", k=3) as spec, running(loaded, proposer=None, k=0) as plain:
        engine = OpenAIEngine(f"http://127.0.0.1:{spec.port}", f"http://127.0.0.1:{plain.port}", None, "unknown")
        assert engine.model == NAME  # the name the server lists
        settings = Settings(n=150, sample_texts=("abcabcab",), cases=CASES[:1], seeded=4)
        report = check_runtime(engine, None, ["served"], settings)
    statuses = {row.test: row.status for row in report.law_rows}
    assert statuses == {"plain vs exact": SKIPPED, "spec vs plain": PASS, "spec vs exact": SKIPPED}, report.markdown()
    versus = next(row for row in report.law_rows if row.test == "spec vs plain")
    assert versus.result.df >= 2 and versus.power is None
    assert {row.status for row in report.seeded_rows} <= {HOLDS, LACKS} and not report.probe_rows
    assert any("exact law" in item for item in report.not_run) and "- not run: greedy identity" in report.markdown()
