"""`verispec audit` end to end: tables, one JSON object, exit status on failures and on missed
negative controls, bad input, and the installed command in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import verispec.cli.audit as audit_cli
from verispec.audit.controls import NEGATIVE_CONTROLS, resampling_p_verifier
from verispec.audit.exhaustive import Configuration
from verispec.registry import PROPOSERS
from verispec.audit.report import all_configurations, run_audit
from verispec.cli import main


def audit_json(capsys, *args: str) -> tuple[int, dict]:
    code = main(["audit", "--json", *args])
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # exactly one JSON object, on one line
    return code, json.loads(out)


def test_json_report_for_one_proposer(capsys):
    code, report = audit_json(capsys, "--proposer", "lookup")
    assert code == 0
    assert report["configurations"] == len(all_configurations([PROPOSERS["lookup"]])) > 0
    assert report["failures"] == [] and report["passed"] is True
    assert isinstance(report["max_abs_diff"], float) and report["max_abs_diff"] <= report["tolerance"]
    assert set(report["negative_controls"]) >= set(NEGATIVE_CONTROLS)
    assert set(report["negative_controls"].values()) == {"caught"}
    assert all(check["passed"] for check in report["oracle"])
    assert all(r["name"].startswith("lookup |") for r in report["results"])


def test_tables_and_summary(capsys):
    assert main(["audit", "--proposer", "lookup"]) == 0
    text = capsys.readouterr().out
    assert "Exact rational oracle" in text and "Negative controls" in text
    assert "lookup" in text and "caught" in text and "missed" not in text
    n = len(all_configurations([PROPOSERS["lookup"]]))
    assert f"{n} configurations" in text and "0 failures" in text and "PASS" in text


def test_a_failing_configuration_exits_1(capsys, monkeypatch):
    broken = Configuration(NEGATIVE_CONTROLS["repair by resampling p"].scenario, PROPOSERS["draft"], resampling_p_verifier)
    monkeypatch.setattr(audit_cli, "run_audit", lambda configurations: run_audit([broken]))
    code, report = audit_json(capsys)
    assert code == 1 and report["passed"] is False
    assert [f["name"] for f in report["failures"]] == [broken.name]
    assert report["failures"][0]["max_abs_diff"] > 1e-3
    assert main(["audit"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_a_missed_negative_control_exits_1(capsys, monkeypatch):
    exact = Configuration(NEGATIVE_CONTROLS["repair by resampling p"].scenario, PROPOSERS["draft"], "token")
    monkeypatch.setattr(
        audit_cli, "run_audit", lambda configurations: run_audit([], {"an exact configuration": exact})
    )
    code, report = audit_json(capsys)
    assert code == 1 and report["failures"] == []
    assert report["negative_controls"]["an exact configuration"] == "missed"


def test_unknown_proposer_is_bad_input(capsys):
    assert main(["audit", "--proposer", "oracle-of-delphi"]) == 2
    captured = capsys.readouterr()
    assert "error: unknown proposer 'oracle-of-delphi'" in captured.err and "draft" in captured.err
    assert captured.out == ""


def test_installed_command_runs_the_audit():
    """The console script end to end, on the draft model's chain and tree configurations (every
    configuration of the full audit passes in-process: tests/test_audit_exhaustive.py and
    tests/test_tree_audit.py)."""
    command = Path(sys.executable).parent / "verispec"
    if not command.exists():
        pytest.skip(f"{command} is not installed (pip install -e .)")
    done = subprocess.run([str(command), "audit", "--json", "--proposer", "draft"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["configurations"] == len(all_configurations([PROPOSERS["draft"]]))
    assert any("tree" in r["name"] for r in report["results"])
    assert report["failures"] == [] and report["max_abs_diff"] <= 1e-12
    assert set(report["negative_controls"].values()) == {"caught"}
