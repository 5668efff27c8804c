"""plan_load: what load_model will build and why, decided from the config and the GGUF tensor
table alone, with the machine's facts given; `verispec load-plan` prints it."""

from __future__ import annotations

import json

import pytest
import torch
from test_load_model import write_gguf
from transformers import LlamaConfig

from verispec.cli import main
from verispec.models.loading import format_costs, load_plan, sources
from verispec.models.runtimes import llamacpp
from verispec.k_spec import parse_k
from verispec.models.loading.format_costs import PLAIN, Drafting, FormatCost, Workload
from verispec.models.loading.load_plan import MachineFacts, plan_load
from verispec.models.runtime import Runtime
from verispec.models.weight_format import WeightFormat

X86_BF16 = MachineFacts(native_bf16=True, int4_faster=True)
ARM_BF16 = MachineFacts(native_bf16=True, int4_faster=False)  # native bf16, int4 unmeasured (not x86)
NO_BF16 = MachineFacts(native_bf16=False, int4_faster=False)


def config_only(directory, **options):
    """A Llama checkpoint directory with its config and no weights: a plan reads nothing else."""
    LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=2, **options).save_pretrained(directory)
    return directory


@pytest.fixture
def gguf(tmp_path, monkeypatch):
    """gguf(kind): a GGUF file of one `kind` matrix, its converted copy's config in the cache."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))

    def make(kind: str):
        path = tmp_path / f"{kind}.gguf"
        write_gguf(path, kind)
        config_only(sources.converted_dir(path))
        return path

    return make


@pytest.mark.parametrize(
    ("machine", "fmt", "exact"), [(X86_BF16, WeightFormat.BFLOAT16, False), (NO_BF16, WeightFormat.FLOAT32, True)]
)
def test_auto_on_a_checkpoint_follows_the_cpu(tmp_path, machine, fmt, exact) -> None:
    plan = plan_load(config_only(tmp_path), machine=machine)
    assert plan.weight_format == fmt and plan.dtype == fmt.dtype and plan.exact_weights is exact
    assert plan.runtime == Runtime.FAST and plan.deterministic and plan.architecture == "llama"
    assert plan.dtype_reason.startswith("chosen by --dtype auto") and plan.auto_choice is None
    assert plan.source == plan.tokenizer == tmp_path and plan.converted is None


@pytest.mark.parametrize(
    ("kind", "machine", "fmt"),
    [
        ("Q4_1", X86_BF16, WeightFormat.Q4),
        ("Q8_0", X86_BF16, WeightFormat.Q4),
        ("Q4_1", ARM_BF16, WeightFormat.BFLOAT16),
        ("Q6_K", X86_BF16, WeightFormat.BFLOAT16),
        ("F16", X86_BF16, WeightFormat.BFLOAT16),
        ("Q4_1", NO_BF16, WeightFormat.FLOAT32),
    ],
)
def test_auto_takes_q4_for_an_all_q4_gguf_where_int4_is_faster(gguf, kind, machine, fmt) -> None:
    plan = plan_load(gguf(kind), machine=machine)
    assert plan.weight_format == fmt and plan.runtime == Runtime.FAST
    if fmt == WeightFormat.Q4:
        assert plan.exact_weights and plan.dtype == torch.float32
        assert plan.auto_choice == plan.dtype_reason and "Q4_0/Q4_1/Q8_0" in plan.auto_choice
    else:
        assert plan.auto_choice is None


def test_auto_takes_q4_only_on_the_fast_runtime(gguf) -> None:
    plan = plan_load(gguf("Q4_1"), runtime="hf", machine=X86_BF16)
    assert plan.weight_format == WeightFormat.BFLOAT16 and plan.runtime == Runtime.HF
    assert plan.runtime_reason == "asked for" and not plan.deterministic


def test_explicit_q4_says_what_is_exact(gguf, tmp_path) -> None:
    assert plan_load(gguf("Q4_0"), "q4").exact_weights is True
    assert plan_load(gguf("Q6_K"), "q4").exact_weights is True  # read raw: float32 where int4 cannot hold it
    assert plan_load(gguf("F16"), "q4").exact_weights is None  # decided per projection when built
    assert plan_load(config_only(tmp_path / "checkpoint"), "q4").exact_weights is False  # quantized on load
    assert plan_load(gguf("Q4_0"), "fp32").weight_format == WeightFormat.FLOAT32  # an alias, one vocabulary


def test_the_runtime_and_why(tmp_path) -> None:
    config_only(tmp_path)
    plan = plan_load(tmp_path, "float16")
    assert plan.runtime == Runtime.HF and "not float16; use runtime 'hf'" in plan.runtime_reason
    assert plan.runtime_reason.startswith("chosen by --runtime auto")
    with pytest.raises(ValueError, match="not float16; use runtime 'hf'"):
        plan_load(tmp_path, "float16", runtime="fast")
    with pytest.raises(ValueError, match="unknown runtime 'llama'; choose auto, fast, hf"):
        plan_load(tmp_path, runtime="llama")
    with pytest.raises(ValueError, match="unknown dtype 'int8'; choose auto, float32, bfloat16, float16 or q4"):
        plan_load(tmp_path, "int8")
    assert not plan_load(tmp_path, "float32", deterministic=False).deterministic


def test_the_llamacpp_runtime_takes_a_gguf_file_as_llama_cpp_computes_it(gguf, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(llamacpp, "installed", lambda: True)  # a plan reads no weights; llama.cpp itself is probed on load
    plan = plan_load(gguf("Q4_1"), runtime="llamacpp", machine=X86_BF16)
    assert plan.runtime == Runtime.LLAMACPP and plan.weight_format == WeightFormat.GGUF and plan.deterministic
    assert plan.exact_weights is False and plan.dtype == torch.float32 and "different target" in plan.dtype_reason
    assert "llama.cpp's arithmetic" in plan.describe().splitlines()[-1]
    assert not plan_load(gguf("Q4_1"), runtime="llamacpp", deterministic=False).deterministic
    with pytest.raises(ValueError, match="--dtype q4 does not apply to the llama.cpp runtime"):
        plan_load(gguf("Q4_1"), "q4", runtime="llamacpp")
    with pytest.raises(ValueError, match="reads a GGUF file, not a checkpoint directory"):
        plan_load(config_only(tmp_path / "checkpoint"), runtime="llamacpp")
    assert plan.cache_type_v == "f16" and plan.as_dict()["cache_type_v"] == "f16"
    q8 = plan_load(gguf("Q4_1"), runtime="llamacpp", cache_type_v="q8_0")
    assert q8.cache_type_v == "q8_0" and "another target than llama.cpp's default float16 cache" in q8.dtype_reason
    assert "(values q8_0)" in q8.describe()
    with pytest.raises(ValueError, match="--cache-type-v q4_0 is not a value cache type llama.cpp is run with here; give f16 or q8_0"):
        plan_load(gguf("Q4_1"), runtime="llamacpp", cache_type_v="q4_0")
    with pytest.raises(ValueError, match="--cache-type-v q8_0 is a setting of the llama.cpp runtime's cache"):
        plan_load(gguf("Q4_1"), runtime="fast", cache_type_v="q8_0")
    assert plan_load(gguf("Q4_1"), "float32").cache_type_v is None


def test_a_llamacpp_plan_without_llama_cpp_python_is_refused(gguf, monkeypatch) -> None:
    monkeypatch.setattr(llamacpp, "installed", lambda: False)
    with pytest.raises(llamacpp.LlamaCppUnavailable, match=f"needed by --runtime llamacpp, is not installed; install it with `{llamacpp.INSTALL}`"):
        plan_load(gguf("Q4_1"), runtime="llamacpp")


def test_the_plan_prints_as_lines_and_as_json(gguf) -> None:
    plan = plan_load(gguf("Q4_1"), machine=X86_BF16)
    lines = plan.describe().splitlines()
    assert [line.split(":")[0] for line in lines] == ["model", "source", "device", "expects", "runtime", "dtype",
                                                      "chosen", "weighed", "exact"]
    assert "(GGUF; float32 copy" in lines[1] and "cached" in lines[1] and lines[5].startswith("dtype:    q4: chosen")
    assert lines[3] == "expects:  plain decoding, 1 request in flight"
    assert lines[2] == "device:   cpu: chosen by --device auto: torch sees no CUDA device"
    shown = json.loads(json.dumps(plan.as_dict()))
    assert shown["dtype"] == "q4" and shown["runtime"] == "fast" and shown["exact_weights"] is True
    assert shown["converted"] == shown["tokenizer"] == str(plan.converted) and shown["converted_cached"]
    assert shown["device"] == "cpu" and shown["device_reason"].startswith("chosen by --device auto")
    assert shown["workload"]["slots"] == 1 and shown["workload"]["proposer"] is None and shown["costs_measured"] is False
    assert [c["format"] for c in shown["dtype_candidates"]] == ["q4", "bfloat16"]


def test_the_default_machine_is_read_where_not_given(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(load_plan, "native_bf16", lambda: False)
    assert plan_load(config_only(tmp_path)).weight_format == WeightFormat.FLOAT32


def test_load_plan_command(tmp_path, capsys) -> None:
    config_only(tmp_path)
    assert main(["load-plan", "--model", str(tmp_path), "--dtype", "float32", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["dtype"] == "float32" and shown["runtime"] == "fast" and shown["exact_weights"] is True
    assert main(["load-plan", "--model", str(tmp_path), "--dtype", "bf16", "--runtime", "hf"]) == 0
    assert "runtime:  hf: asked for" in capsys.readouterr().out
    for argv, says in [
        (["--dtype", "int8"], "error: unknown dtype 'int8'; choose auto, float32, bfloat16, float16 or q4"),
        (["--runtime", "fastest"], "error: unknown runtime 'fastest'; choose auto, fast, hf"),
        (["--dtype", "float16", "--runtime", "fast"], "not float16; use runtime 'hf'"),
    ]:
        assert main(["load-plan", "--model", str(tmp_path), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and says in err[0]
    assert main(["load-plan", "--model", str(tmp_path / "absent")]) == 2
    assert "never downloads models" in capsys.readouterr().err


GPU = MachineFacts(native_bf16=True, int4_faster=True, cuda_devices=2, cuda_bf16=True)
OLD_GPU = MachineFacts(native_bf16=True, int4_faster=True, cuda_devices=1, cuda_bf16=False)


@pytest.mark.parametrize(("machine", "fmt"), [(GPU, WeightFormat.BFLOAT16), (OLD_GPU, WeightFormat.FLOAT16)])
def test_on_cuda_auto_takes_the_static_runtime_in_the_gpus_half_precision(tmp_path, machine, fmt) -> None:
    plan = plan_load(config_only(tmp_path), machine=machine)
    assert plan.device == "cuda:0" and plan.device_reason == "chosen by --device auto: torch sees a CUDA device"
    assert plan.runtime == Runtime.STATIC and plan.deterministic and "static runtime" in plan.runtime_reason
    assert plan.weight_format == fmt and plan.dtype == fmt.dtype and not plan.exact_weights
    assert plan_load(tmp_path, "float32", device="cuda:1", machine=GPU).device == "cuda:1"
    assert plan_load(tmp_path, device="cpu", machine=GPU).runtime == Runtime.FAST
    assert plan_load(tmp_path, runtime="static", device="cpu", machine=NO_BF16).runtime == Runtime.STATIC
    assert plan_load(tmp_path, runtime="hf", machine=GPU).device == "cuda:0"


def test_a_model_the_static_runtime_cannot_run_goes_to_transformers_on_cuda(tmp_path) -> None:
    from transformers import MistralConfig

    MistralConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2).save_pretrained(tmp_path)
    plan = plan_load(tmp_path, machine=GPU)
    assert plan.runtime == Runtime.HF and "the static runtime runs Llama-architecture models" in plan.runtime_reason
    with pytest.raises(ValueError, match="the static runtime runs Llama-architecture models"):
        plan_load(tmp_path, runtime="static", machine=GPU)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(device="cuda", machine=NO_BF16), "--device cuda: .*; use --device cpu"),
        (dict(device="cuda:2", machine=GPU), "torch sees 2 CUDA device"),
        (dict(device="gpu", machine=GPU), "unknown device 'gpu'; choose auto, cpu, cuda or cuda:N"),
        (dict(device="cuda", runtime="fast", machine=GPU), "the fast runtime runs on the CPU; on cuda:0 choose"),
        (dict(device="cuda", dtype="q4", machine=GPU), "--dtype q4 runs on torch's CPU int4 kernel"),
        (dict(runtime="hf", deterministic=True, machine=GPU), "mode of the fast, static and llama.cpp runtimes"),
    ],
)
def test_devices_that_cannot_run_the_plan_are_refused(tmp_path, options, message) -> None:
    with pytest.raises(ValueError, match=message):
        plan_load(config_only(tmp_path), **options)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize("command", ["load-plan", "generate"])
def test_device_cuda_without_cuda_is_one_error_line(tmp_path, capsys, command) -> None:
    config_only(tmp_path)
    argv = [command, "--model", str(tmp_path), "--device", "cuda"] + (["Hi"] if command == "generate" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [err.strip()] and err.startswith("error: --device cuda: ")
    assert "use --device cpu" in err and "Traceback" not in err


def curve(fmt, t1, v_at_8, runtime=Runtime.FAST):
    return FormatCost(runtime, fmt, t1, (1, 8), (1.0, v_at_8), "fake")


STEEP_Q4 = curve(WeightFormat.Q4, 0.010, 8.0)  # q4's cost grows with the rows, bfloat16's barely
FLAT_BF16 = curve(WeightFormat.BFLOAT16, 0.020, 1.7)
LOOKUP_K4 = Workload(1, Drafting("lookup", parse_k("4"), 0.8, 0.0))
SERVER = Workload(8, Drafting("lookup", parse_k("2"), 0.5, 0.0))


def test_auto_weighs_q4_against_bfloat16_by_the_tokens_per_second_each_is_expected_to_decode(gguf) -> None:
    one = plan_load(gguf("Q4_1"), machine=X86_BF16, costs=(STEEP_Q4, FLAT_BF16))
    assert one.weight_format == WeightFormat.Q4 and one.exact_weights and one.workload == PLAIN
    assert "which q4 holds exactly" in one.dtype_reason
    assert ("q4 on the fast runtime is expected to decode 100.0 tok/s at k = 0 against 50.0 in bfloat16 on the fast "
            "runtime at k = 0 (for plain decoding, 1 request in flight), measured on this machine") in one.dtype_reason
    spec = plan_load(gguf("Q4_1"), machine=X86_BF16, workload=LOOKUP_K4, costs=(STEEP_Q4, FLAT_BF16))
    assert spec.weight_format == WeightFormat.BFLOAT16 and spec.exact_weights is False and spec.workload == LOOKUP_K4
    assert spec.runtime == Runtime.FAST and spec.deterministic
    # a dtype change is a change of target, said where it is chosen
    assert "a different target from float32 and from q4" in spec.dtype_reason and spec.auto_choice == spec.dtype_reason
    lines = spec.describe().splitlines()
    assert lines[3].startswith("expects:  lookup at k 4, 1 request in flight; expected acceptance 0.80 per drafted token")
    assert [line for line in lines if line.startswith(("chosen:", "weighed:"))] == [
        "weighed:  q4 on the fast runtime: 67.2 tok/s expected at k = 4 (plain 100.0 tok/s, one-row forward 10.00 ms); fake",
        "chosen:   bfloat16 on the fast runtime: 120.1 tok/s expected at k = 4 (plain 50.0 tok/s, one-row forward 20.00 "
        "ms); fake",
    ]
    shown = spec.as_dict()
    assert shown["workload"]["k"] == "4" and [c["k"] for c in shown["dtype_candidates"]] == ["k = 4", "k = 4"]
    assert plan_load(gguf("Q4_1"), "q4", machine=X86_BF16, workload=LOOKUP_K4,
                     costs=(STEEP_Q4, FLAT_BF16)).weight_format == "q4"
    checkpoint = plan_load(gguf("Q6_K"), machine=X86_BF16, workload=LOOKUP_K4)  # q4 not exact here: nothing to weigh
    assert checkpoint.format_choice is None and checkpoint.auto_choice is None and "workload" in checkpoint.as_dict()


def test_auto_reads_the_curves_profile_kept_for_this_file_cpu_and_threads(gguf) -> None:
    path = gguf("Q4_1")
    steep_bf16 = curve(WeightFormat.BFLOAT16, 0.020, 30.0)  # a machine whose bfloat16 grows faster than its q4
    for cost in (STEEP_Q4, steep_bf16):
        format_costs.record(path, cost, load_plan.cpu_model(), torch.get_num_threads())
    plan = plan_load(path, machine=X86_BF16, workload=SERVER)
    assert plan.weight_format == WeightFormat.Q4 and plan.format_choice.measured  # the defaults would say bfloat16
    assert "measured on this machine" in plan.dtype_reason and plan.as_dict()["costs_measured"] is True
    assert plan_load(path, machine=X86_BF16, workload=SERVER, costs=()).weight_format == WeightFormat.BFLOAT16


def test_runtime_auto_never_takes_the_fast_runtime_where_transformers_was_measured_faster(tmp_path, gguf) -> None:
    config_only(tmp_path / "checkpoint")
    slow_fast = curve(WeightFormat.BFLOAT16, 0.030, 1.5)
    quick_hf = curve(WeightFormat.BFLOAT16, 0.025, 1.5, runtime=Runtime.HF)
    plan = plan_load(tmp_path / "checkpoint", machine=X86_BF16, costs=(slow_fast, quick_hf))
    assert plan.runtime == Runtime.HF and plan.weight_format == WeightFormat.BFLOAT16 and not plan.deterministic
    assert plan.runtime_reason.startswith("chosen by --runtime auto: measured on this machine, transformers' bfloat16")
    assert "never takes a runtime measured slower" in plan.runtime_reason
    for options in (dict(runtime="fast"), dict(deterministic=True)):  # asked for: taken as given
        assert plan_load(tmp_path / "checkpoint", machine=X86_BF16, costs=(slow_fast, quick_hf),
                         **options).runtime == Runtime.FAST
    assert plan_load(tmp_path / "checkpoint", "float32", machine=X86_BF16,
                     costs=(slow_fast, quick_hf)).runtime == Runtime.FAST  # measured in bfloat16 only
    # q4 has no transformers counterpart: where it is the fastest it stays on the fast runtime
    q4_plan = plan_load(gguf("Q4_1"), machine=X86_BF16, costs=(STEEP_Q4, slow_fast, quick_hf))
    assert q4_plan.weight_format == WeightFormat.Q4 and q4_plan.runtime == Runtime.FAST
    # where bfloat16 wins, its faster runtime is transformers'
    hf_plan = plan_load(gguf("Q4_1"), machine=X86_BF16, workload=SERVER, costs=(STEEP_Q4, slow_fast, quick_hf))
    assert hf_plan.weight_format == WeightFormat.BFLOAT16 and hf_plan.runtime == Runtime.HF
    assert "bfloat16 on the hf runtime is expected to decode" in hf_plan.dtype_reason


def test_load_plan_command_shows_each_candidates_expectation(gguf, capsys) -> None:
    path = gguf("Q4_1")
    assert main(["load-plan", "--model", str(path), "--proposer", "lookup", "--k", "3", "--concurrency", "4",
                 "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["workload"] == {"slots": 4, "proposer": "lookup", "k": "3", "acceptance": 0.5, "draft": 0.0, "note": ""}
    assert (shown["dtype_candidates"] is not None) == load_plan.this_machine().int4_faster
    for candidate in shown["dtype_candidates"] or ():
        assert candidate["k"] == "k = 3" and candidate["tokens_per_s"] > 0 and candidate["t1"] > 0
    assert main(["load-plan", "--model", str(path), "--concurrency", "0"]) == 2
    assert "--concurrency" in capsys.readouterr().err


def test_the_loaded_models_note_says_why_auto_took_bfloat16(gguf) -> None:
    from verispec.models.loading.load import LoadedModel

    plan = plan_load(gguf("Q4_1"), machine=X86_BF16, workload=LOOKUP_K4, costs=(STEEP_Q4, FLAT_BF16))
    loaded = LoadedModel(name="m", lm=None, model=None, tokenizer=None, eos_token_ids=(), dtype=plan.dtype,
                         source=plan.source, runtime=plan.runtime, auto_choice=plan.auto_choice)
    assert loaded.target_note.startswith("bfloat16: every weight rounded to bfloat16")
    assert loaded.target_note.endswith(f"({plan.dtype_reason})")


def test_the_demo_decodes_plainly_in_every_other_format_auto_weighs(tmp_path, gguf, monkeypatch) -> None:
    from verispec.runner import plain_alternatives

    monkeypatch.setattr(load_plan, "this_machine", lambda: X86_BF16)
    path = str(gguf("Q4_1"))
    q4 = plan_load(path, "q4", machine=X86_BF16)
    assert [(p.weight_format, p.runtime) for p in plain_alternatives(path, "auto", None, "auto", q4)] == [
        (WeightFormat.BFLOAT16, Runtime.FAST)]
    full = plan_load(path, "float32", machine=X86_BF16)
    assert [p.weight_format for p in plain_alternatives(path, "auto", None, "auto", full)] == [
        WeightFormat.Q4, WeightFormat.BFLOAT16]
    # where auto weighs nothing, its one format, unless it is the one loaded
    checkpoint = str(config_only(tmp_path / "checkpoint"))
    bf16 = plan_load(checkpoint, machine=X86_BF16)
    assert plain_alternatives(checkpoint, "auto", None, "auto", bf16) == []
    full = plan_load(checkpoint, "float32", machine=X86_BF16)
    assert [p.weight_format for p in plain_alternatives(checkpoint, "auto", None, "auto", full)] == [WeightFormat.BFLOAT16]


def test_the_bench_adds_plain_decoding_in_every_other_format_auto_weighs(tmp_path, gguf, monkeypatch) -> None:
    from verispec.bench.methods import parse_methods
    from verispec.bench.settings import Settings
    from verispec.bench.suite import with_plain_formats

    monkeypatch.setattr(load_plan, "this_machine", lambda: X86_BF16)
    settings = Settings(tmp_path, model=str(gguf("Q4_1")))
    plan = plan_load(settings.model, machine=X86_BF16)  # q4 on the documented curves
    methods = parse_methods("verispec-plain,verispec-lookup-k2")
    assert [m.name for m in with_plain_formats(methods, settings, plan)] == [
        "verispec-plain", "verispec-lookup-k2", "verispec-plain@bfloat16"]
    named = parse_methods("verispec-plain,verispec-plain@float32")
    assert with_plain_formats(named, settings, plan) == named  # formats named: kept as given
    assert with_plain_formats(methods, Settings(tmp_path, model=settings.model, concurrency=(1, 4)), plan) == methods
    assert with_plain_formats(methods, Settings(tmp_path, model=settings.model, dtype="q4"), plan) == methods  # --dtype named
