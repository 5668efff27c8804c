"""`verispec cost` end to end: the seed's numbers, tables from a profile, plots, bad input."""

from __future__ import annotations

import json

import pytest

from verispec.cli import main
from verispec.cost import FixedCosts, expected_tokens, optimal_k, speedup_by_k
from verispec.profile import Profile, Timing


def run_json(capsys, *args: str) -> dict:
    assert main(["cost", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_seed_example(capsys):
    out = run_json(capsys, "--alpha", "0.8", "--k", "6", "--c", "0.1", "--v", "1")
    assert out["expected_tokens"] == pytest.approx(3.951424)
    assert out["speedup"] == pytest.approx(2.4696, abs=1e-4)
    slow = run_json(capsys, "--alpha", "0.1", "--k", "6", "--c", "0.1", "--v", "1")
    assert slow["speedup"] == pytest.approx(0.6944, abs=1e-4)


def test_text_output_says_faster_or_slower(capsys):
    assert main(["cost", "--alpha", "0.1", "--k", "6", "--c", "0.1"]) == 0
    text = capsys.readouterr().out
    assert "E = 1.11111" in text and "slower" in text


def test_every_k_and_the_best(capsys):
    out = run_json(capsys, "--alpha", "0.8", "--c", "0.1", "--k-max", "10")
    assert [row["k"] for row in out["per_k"]] == list(range(1, 11))
    assert out["per_k"][1]["expected_tokens"] == pytest.approx(expected_tokens(0.8, 2))
    assert out["best_k"] == 6
    assert main(["cost", "--alpha", "0.1", "--c", "0.1"]) == 0
    assert "do not speculate" in capsys.readouterr().out


def write_profile(path, survival=None) -> Profile:
    v = [1.0, 1.08, 1.15, 1.3, 1.42, 1.6]
    timing = Timing(0.03, 0.03, 0.03, 0.03, 0.03)
    profile = Profile(
        c=0.02, v=v, score=[timing] * len(v), draft=timing, drafted=3.0, context_tokens=100, repeats=3,
        survival=survival,
    )
    profile.save(path)
    return profile


def test_profile_with_measured_survival(tmp_path, capsys):
    path = tmp_path / "p.json"
    profile = write_profile(path, survival=[0.7, 0.5, 0.3, 0.2])
    out = run_json(capsys, "--profile", str(path))
    ratios = speedup_by_k(profile.c, profile.v, profile.survival)
    assert [row["speedup"] for row in out["per_k"]] == pytest.approx(ratios[1:])
    assert len(out["per_k"]) == 4  # survival measured up to s_4
    assert out["best_k"] == optimal_k(profile.c, profile.v, survival=profile.survival)


def test_profile_with_alpha(tmp_path, capsys):
    path = tmp_path / "p.json"
    profile = write_profile(path)
    out = run_json(capsys, "--profile", str(path), "--alpha", "0.6", "--k", "3")
    expected = expected_tokens(0.6, 3)
    assert out["speedup"] == pytest.approx(expected / (3 * profile.c + profile.v[3]))
    assert main(["cost", "--profile", str(path)]) == 2
    assert "give --alpha" in capsys.readouterr().err


def test_plot(tmp_path, capsys):
    path = tmp_path / "speedup.png"
    assert main(["cost", "--alpha", "0.75", "--c", "0.05", "--v", "1.1", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--alpha", "1.5", "--k", "3", "--c", "0.1"], "alpha"),
        (["--alpha", "0.5", "--k", "3"], "give --c"),
        (["--alpha", "0.5", "--k", "3", "--c", "0.1", "--v", "0"], "v "),
        (["--alpha", "0.5", "--k", "-1", "--c", "0.1"], "'--k'"),
        (["--alpha", "0.5", "--k", "3", "--c", "-0.1"], "c "),
        (["--alpha", "0.5", "--profile", "/nonexistent/p.json"], "no such file"),
        (["--alpha", "0.5", "--c", "0.1", "--k-max", "0"], "--k-max"),
    ],
)
def test_bad_values_exit_2_with_a_message(args, message, capsys):
    assert main(["cost", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_costs_and_profile_together_are_refused(tmp_path, capsys):
    path = tmp_path / "p.json"
    write_profile(path)
    assert main(["cost", "--profile", str(path), "--alpha", "0.5", "--c", "0.2"]) == 2
    assert "not both" in capsys.readouterr().err
    assert FixedCosts(0.2, [1.0]).c == 0.2
