"""Bad input to any command: one `error: ...` line on stderr that says what was wrong and what
to do, exit status 2, no traceback; outputs are checked before any work and never overwritten
without --force."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verispec.cli import main
from verispec.models.loading import load


def error_line(capsys, argv: list[str]) -> str:
    """The one error line `verispec argv` prints; it must exit 2 without a traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: the checks under test must come before any work."""

    def refuse(*args, **kwargs):
        raise AssertionError("the command loaded a model before checking its input")

    monkeypatch.setattr(load, "load_model", refuse)


@pytest.mark.parametrize(
    "argv, says",
    [
        (["frobnicate"], "No such command 'frobnicate'"),
        (["bench", "--frobnicate"], "No such option: --frobnicate"),
        (["generate", "hello", "--temperature"], "'--temperature' requires an argument"),
        (["generate", "hello", "--temperature", "abc"], "'--temperature': Input should be a valid number"),
        (["cost", "--alpha", "half"], "'--alpha': Input should be a valid number"),
        (["check-tokenizers", "a"], "Missing argument 'draft'"),
        (["bench"], "Missing option '--out'"),
    ],
)
def test_usage_errors(capsys, argv, says):
    line = error_line(capsys, argv)
    assert says in line and "--help`" in line


def test_no_arguments_print_the_help_and_an_error(capsys):
    assert main([]) == 2
    printed = capsys.readouterr()
    assert "Commands" in printed.out + printed.err and "generate" in printed.out + printed.err
    assert "Traceback" not in printed.err
    assert printed.err.strip().splitlines() == [
        "error: no command given; run `verispec COMMAND ...` with a command from `verispec --help`"
    ]


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"], ["cost", "--help"]])
def test_help_still_exits_0(capsys, argv):
    assert main(argv) == 0
    assert "Usage: verispec" in capsys.readouterr().out


def test_the_installed_command_prints_no_traceback(tmp_path):
    """The same through `python -m verispec` in a fresh process, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    for argv, says in [([], "no command given"), (["cost", "--k", "abc"], "valid integer")]:
        done = subprocess.run(
            [sys.executable, "-m", "verispec", *argv], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("error: ") and says in done.stderr


def test_bench_refuses_a_directory_with_results_unless_forced(tmp_path, capsys, monkeypatch):
    (tmp_path / "summary.json").write_text("{}")
    line = error_line(capsys, ["bench", "--quick", "--out", str(tmp_path)])
    assert "already holds results (summary.json)" in line and "--force" in line
    assert (tmp_path / "summary.json").read_text() == "{}"

    from verispec.bench import suite

    asked = []
    monkeypatch.setattr(suite, "run", lambda settings: asked.append(settings) or {"plots": []})
    assert main(["bench", "--quick", "--out", str(tmp_path), "--force"]) == 0
    assert [s.out for s in asked] == [tmp_path]


def test_bench_out_may_hold_other_files(tmp_path, monkeypatch):
    (tmp_path / "notes.txt").write_text("mine")
    from verispec.bench import suite

    monkeypatch.setattr(suite, "run", lambda settings: {"plots": []})
    assert main(["bench", "--quick", "--out", str(tmp_path)]) == 0


@pytest.mark.parametrize("method, says", [
    ("verispec-nope-k2", "unknown proposer 'nope'"),
    ("verispec-layerskip:99-k2", "layerskip:L needs 1 <= L < 4"),  # refused once the quick draft is saved
])
def test_a_refused_quick_bench_leaves_nothing(tmp_path, capsys, method, says):
    """Nothing of a refused run stays in --out (a new one is removed again, an old one keeps only
    what it held), so the next run into it is not refused as holding results."""
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "notes.txt").write_text("mine")
    for out in (tmp_path / "new", tmp_path / "old"):
        assert says in error_line(capsys, ["bench", "--quick", "--out", str(out), "--methods", method])
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["notes.txt", "old"]


def test_bench_out_is_a_file(tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_text("{}")
    assert "is a file; give a directory" in error_line(capsys, ["bench", "--quick", "--out", str(path)])
    line = error_line(capsys, ["bench", "--quick", "--out", str(path / "below")])
    assert "cannot create the directory" in line and path.read_text() == "{}"


def test_bench_prompts_is_a_directory(tmp_path, capsys):
    line = error_line(capsys, ["bench", "--quick", "--out", str(tmp_path / "b"), "--prompts", str(tmp_path)])
    assert f"prompt file {tmp_path} is a directory; give a Spec-Bench or HumanEval .jsonl file" in line


def test_bench_prompts_that_are_not_utf8_name_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"task_id": "t/1", "prompt": "fine"}\n{"task_id": "t/2", "prompt": "caf\xe9"}\n')
    line = error_line(capsys, ["bench", "--out", str(tmp_path / "b"), "--prompts", str(path)])
    assert line == f"error: {path}:2: not UTF-8 text (byte 0xe9 at column 34); save the file as UTF-8"


def test_generate_refuses_stdin_that_is_not_utf8(capsys, no_model, monkeypatch):
    class Stdin:
        buffer = __import__("io").BytesIO(b"caf\xe9 au lait")

    monkeypatch.setattr("sys.stdin", Stdin)
    line = error_line(capsys, ["generate", "--k", "2"])
    assert line.startswith("error: standard input is not UTF-8 text (byte 0xe9 at offset 3)")


def test_generate_refuses_an_argument_that_is_not_utf8(capsys, no_model):
    line = error_line(capsys, ["generate", "--k", "2", "caf\udce9"])  # how Python keeps the byte 0xe9 of argv
    assert line.startswith("error: the prompt is not UTF-8 text (an invalid byte at character 4)")


@pytest.mark.parametrize(
    "option, name, says",
    [
        ("--out", ".", "is a directory; give the path of a file"),
        ("--out", "missing/p.json", "is not a directory; create it first"),
        ("--out", "earlier.json", "already exists; pass --force"),
        ("--plot", ".", "is a directory; give the path of a file"),
        ("--plot", "v", "must end in .png; no suffix is added"),
        ("--plot", "v.svg", "must end in .png"),
        ("--plot", "earlier.png", "already exists; pass --force"),
    ],
)
def test_profile_checks_its_outputs_before_measuring(tmp_path, capsys, no_model, option, name, says):
    (tmp_path / "earlier.json").write_text("{}")
    (tmp_path / "earlier.png").write_bytes(b"png")
    line = error_line(capsys, ["profile", option, str(tmp_path / name)])
    assert line.startswith(f"error: {option} ") and says in line
    assert (tmp_path / "earlier.json").read_text() == "{}" and not (tmp_path / "v.png").exists()


def test_an_unwritable_directory_is_found_before_measuring(capsys, no_model):
    """sysfs refuses new files even to root, whom permission bits do not stop."""
    if not Path("/sys/kernel").is_dir():
        pytest.skip("no read-only /sys on this system")
    assert "cannot write in /sys" in error_line(capsys, ["profile", "--out", "/sys/verispec-profile.json"])


def test_force_lets_profile_overwrite(tmp_path, capsys, no_model):
    """With --force the path checks pass, and the command goes on to load the model."""
    (tmp_path / "p.json").write_text("{}")
    with pytest.raises(AssertionError, match="loaded a model"):
        main(["profile", "--out", str(tmp_path / "p.json"), "--force"])


@pytest.mark.parametrize(
    "option, value, least",
    [("--k-max", "0", 1), ("--repeats", "0", 1), ("--warmup", "-1", 0), ("--context-tokens", "1", 2),
     ("--survival-tokens", "-1", 0)],
)
def test_profile_counts_are_checked_before_measuring(capsys, no_model, option, value, least):
    line = error_line(capsys, ["profile", option, value])
    assert f"'{option}': Input should be greater than or equal to {least}" in line


@pytest.mark.parametrize("value", ["0", "-3"])
def test_demo_needs_at_least_one_new_token(capsys, no_model, value):
    line = error_line(capsys, ["demo", "--max-new-tokens", value])
    assert "'--max-new-tokens': Input should be greater than or equal to 1" in line


@pytest.mark.parametrize("option", ["--k", "--k-max"])
def test_cost_k_is_bounded(capsys, option):
    line = error_line(capsys, ["cost", "--alpha", "0.5", "--c", "0.1", option, "100000000"])
    assert f"'{option}': Input should be less than or equal to 256" in line
    assert main(["cost", "--alpha", "0.99", "--c", "0.01", option, "256", "--json"]) == 0


def test_cost_profile_is_a_directory(tmp_path, capsys):
    line = error_line(capsys, ["cost", "--alpha", "0.5", "--profile", str(tmp_path)])
    assert "--profile" in line and "is a directory; give a profile JSON file from `verispec profile --out FILE`" in line


def test_cost_plot_is_a_png_file_never_overwritten_silently(tmp_path, capsys):
    args = ["cost", "--alpha", "0.5", "--c", "0.1"]
    assert "is a directory" in error_line(capsys, [*args, "--plot", str(tmp_path)])
    assert "must end in .png" in error_line(capsys, [*args, "--plot", str(tmp_path / "speedup")])
    assert list(tmp_path.iterdir()) == []  # neither DIR.png nor speedup.png appeared
    path = tmp_path / "speedup.png"
    assert main([*args, "--plot", str(path)]) == 0
    first = path.read_bytes()
    path.write_bytes(b"mine")
    assert "already exists; pass --force" in error_line(capsys, [*args, "--plot", str(path)])
    assert path.read_bytes() == b"mine"
    assert main([*args, "--plot", str(path), "--force"]) == 0
    assert path.read_bytes() == first


def test_check_tokenizers_on_a_directory_without_one(tmp_path, capsys):
    line = error_line(capsys, ["check-tokenizers", str(tmp_path), str(tmp_path)])
    assert f"{tmp_path} holds no tokenizer (none of tokenizer.json" in line
    assert "sentencepiece" not in line and "tiktoken" not in line


@pytest.fixture
def without_llama_cpp(monkeypatch):
    from verispec.models.runtimes import llamacpp

    monkeypatch.setattr(llamacpp, "installed", lambda: False)
    return llamacpp


@pytest.mark.parametrize("argv", [
    ["load-plan"], ["generate", "hi", "--max-new-tokens", "2"], ["profile"], ["demo", "--max-new-tokens", "2"],
])
def test_the_llamacpp_runtime_without_llama_cpp_python_is_one_line(capsys, without_llama_cpp, argv):
    line = error_line(capsys, [*argv, "--runtime", "llamacpp"])
    assert "llama-cpp-python, needed by --runtime llamacpp, is not installed" in line
    assert f"install it with `{without_llama_cpp.INSTALL}`" in line


def test_serve_checks_llama_cpp_python_before_it_binds_the_port(capsys, without_llama_cpp):
    """The port is taken already: a serve that bound it first would report that instead."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        line = error_line(capsys, ["serve", "--runtime", "llamacpp", "--port", str(port)])
    assert "needed by --runtime llamacpp, is not installed" in line


@pytest.mark.parametrize("option", [["--runtime", "llamacpp"], ["--dtype", "q4"], ["--model", "x.gguf"], ["--deterministic"]])
def test_quick_bench_refuses_the_options_it_would_ignore(tmp_path, capsys, option):
    line = error_line(capsys, ["bench", "--quick", "--out", str(tmp_path / "b"), *option])
    assert f"which {option[0]} would not change; drop them" in line and not (tmp_path / "b").exists()


@pytest.mark.parametrize("option, value, says", [
    ("--batch-rows", "9000", "less than or equal to 512"), ("--k-max", "100000", "less than or equal to 256"),
    ("--tree-nodes", "9999", "less than or equal to 256"),
])
def test_profile_counts_are_bounded_before_measuring(capsys, no_model, option, value, says):
    assert says in error_line(capsys, ["profile", option, value])


def test_an_empty_value_is_refused_before_any_work(capsys, no_model, tmp_path):
    assert error_line(capsys, ["bench", "--quick", "--out", ""]) == (
        "error: --out is empty; give it a value, or leave the option out for its default")
    assert "--model is empty" in error_line(capsys, ["generate", "hi", "--model="])
    assert "--out is empty" in error_line(capsys, ["train", "--head", "eagle", "--minutes", "1", "--out", ""])


@pytest.mark.parametrize("value", ["²", "1,٣", "0", "1,,2"])
def test_concurrency_takes_plain_digits(tmp_path, capsys, value):
    line = error_line(capsys, ["bench", "--quick", "--out", str(tmp_path / "b"), "--concurrency", value])
    assert "--concurrency takes integers >= 1 separated by commas, e.g. 1,2,4,8" in line


def test_export_head_checks_its_options_and_output_before_reading_the_head(tmp_path, capsys):
    head = tmp_path / "head"
    head.mkdir()
    (tmp_path / "file").write_text("x")
    cases = [
        (["--format", "speculators", "--speculative-tokens", "1000000"], "less than or equal to 256"),
        (["--format", "vllm-medusa", "--verifier", "m"], "--verifier does not apply to --format vllm-medusa; drop it"),
        (["--format", "vllm-medusa", "--speculative-tokens", "4"], "--speculative-tokens does not apply to --format vllm-medusa"),
        (["--format", "speculators", "--model", "m"], "--model does not apply to --format speculators"),
    ]
    for options, says in cases:
        assert says in error_line(capsys, ["export-head", str(head), "--out", str(tmp_path / "x"), *options])
    line = error_line(capsys, ["export-head", str(head), "--format", "speculators", "--out", str(tmp_path / "file" / "x")])
    assert f"{tmp_path / 'file'} is not a directory; create it first" in line and ".partial" not in line
