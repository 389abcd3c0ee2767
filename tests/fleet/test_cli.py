"""CLI surface: exit codes documented in --help, option conflicts are usage errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from alma.cli.main import main


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (
            ["fleet", "health", "--help"],
            ["0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN", "OK < UNKNOWN < WARNING < CRITICAL",
             "(bad fleet file, unknown option, no ssh) is UNKNOWN too: exit 3 with the error on stderr"],
        ),
        (["fleet", "inspect", "--help"], ["Exit codes: 0 snapshot taken", "3 at least one node could not be reached"]),
        (["panel", "--help"], ["Exit codes: 0 page written", "leak an IP address"]),
    ],
)
def test_help_documents_exit_codes(argv: list[str], needles: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        main(argv)  # click prints help and returns (standalone_mode=False)
    except SystemExit as exc:
        assert exc.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for n in needles:
        assert n in out


def test_json_and_nagios_exclusive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "fleet.toml"
    f.write_text('[[node]]\nname = "n1"\nrole = "board"\n')
    with pytest.raises(SystemExit) as exc:
        main(["fleet", "health", "--fleet", str(f), "--json", "--nagios"])
    assert exc.value.code == 3  # a monitoring plugin's usage error is UNKNOWN
    assert "exclusive" in capsys.readouterr().err


def test_inspect_needs_a_node(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["fleet", "inspect"])
    assert exc.value.code == 2


def test_missing_ssh_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "fleet.toml"
    f.write_text('[[node]]\nname = "n1"\nrole = "board"\n[[node]]\nname = "n2"\nrole = "board"\n')
    monkeypatch.setenv("ALMA_TOOL_SSH", "ssh-not-installed-here")
    snap = tmp_path / "snap.json"
    for argv, code in ((["fleet", "health", "--snapshot", str(snap)], 3), (["fleet", "inspect", "n1"], 2)):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--fleet", str(f)])
        assert exc.value.code == code
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and "try: install the OpenSSH client" in err
    assert not snap.exists()


@pytest.mark.parametrize(
    ("argv", "fleet_text", "needle"),
    [
        (["--nagios"], "[[node]]\nname = 'n1'\nrole = 'bogus-role'\n", "role"),  # bad fleet file
        (["--nagios"], None, "fleet file not found"),  # missing fleet file
        (["--nagios", "--bogus-option"], "[[node]]\nname = 'n1'\nrole = 'board'\n", "No such option"),
        (["--timeout", "0.01"], "[[node]]\nname = 'n1'\nrole = 'board'\n", "--timeout"),
        (["--json"], "this is = not toml [", "fleet"),
    ],
)
def test_config_and_usage_errors_are_unknown_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], fleet_text: str | None, needle: str
) -> None:
    """Plugin guidelines: a plugin that cannot judge exits UNKNOWN (3); 2 would read as CRITICAL."""
    f = tmp_path / "fleet.toml"
    if fleet_text is not None:
        f.write_text(fleet_text)
    with pytest.raises(SystemExit) as exc:
        main(["fleet", "health", "--fleet", str(f), "--no-save", *argv])
    assert exc.value.code == 3
    out, err = capsys.readouterr()
    assert needle.lower() in err.lower()
    if "--nagios" in argv:
        (line,) = out.splitlines()  # one UNKNOWN line where Nagios reads the status
        assert line.startswith("FLEET UNKNOWN - ")
    else:
        assert out == ""


def test_unwritable_state_is_a_warning_never_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full or read-only state directory must not turn a verdict into exit 1 (WARNING)."""
    from alma.fleet import health as H
    from alma.fleet.severity import Severity

    f = tmp_path / "fleet.toml"
    f.write_text('[[node]]\nname = "n1"\nrole = "board"\n')
    rep = H.FleetReport("2026-11-30T16:00:00Z", [H.NodeResult("n1", "board", None, Severity.CRITICAL, "hot")], 300)
    monkeypatch.setattr(H, "run_fleet_health", lambda *a, **k: rep)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    with pytest.raises(SystemExit) as exc:
        main(["fleet", "health", "--fleet", str(f), "--nagios", "--snapshot", str(blocker / "snap.json")])
    assert exc.value.code == 2  # the fleet's own verdict
    out, err = capsys.readouterr()
    assert out.startswith("FLEET CRITICAL") and "warning: snapshot not saved" in err
    assert "warning: history not updated: cannot create the fleet history" in err


@pytest.mark.parametrize(
    ("body", "line"),
    [("[health]\ntimeout = inf\n", 2), ("[ssh]\nconnect_timeout = 5\n[health]\nstale_after = nan\n", 4),
     ("[health]\ntimeout = -5.0\n", 2), ("[panel]\nstale_after = inf\n", 2)],
)  # fmt: skip
def test_non_finite_or_negative_numbers_are_exit_3_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, line: int
) -> None:
    """`timeout = inf/nan` was exit 70; `stale_after = nan` disabled staleness."""
    from support import run_cli

    f = tmp_path / "fleet.toml"
    f.write_text(body + '[[node]]\nname = "n1"\nrole = "board"\n')
    code, out, err = run_cli(capsys, "fleet", "health", "--fleet", f, "--nagios", "--no-save")
    assert code == 3 and f"{f}:{line}:" in err and "finite" in err, err
    assert out.startswith("FLEET UNKNOWN - ")


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_a_non_finite_timeout_option_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    from support import run_cli

    f = tmp_path / "fleet.toml"
    f.write_text('[[node]]\nname = "n1"\nrole = "board"\n')
    code, _, err = run_cli(capsys, "fleet", "health", "--fleet", f, "--timeout", value, "--no-save")
    assert code == 3 and "not a finite number" in err
