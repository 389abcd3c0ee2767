"""The CLI's error mapping (docs/cli.md, "Exit codes"): 0 ok, 1 negative verdict, 2 usage or
precondition with a hint and no traceback, 70 internal error with the traceback in a file,
130 Ctrl-C; a tool's own code is reported, never passed through."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from alma.cli import main as climain
from alma.errors import Interrupted, ToolError, UserError


def _run_with(
    cmd: click.Command, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    monkeypatch.setitem(climain.VERBS, "probe", ("tests_probe", "probe", "probe"))
    monkeypatch.setattr(climain.LazyGroup, "get_command", lambda self, ctx, name: cmd if name == "probe" else None)
    with pytest.raises(SystemExit) as ei:
        climain.main(["probe"])
    return int(ei.value.code or 0), capsys.readouterr().err


def test_user_error_exits_2_with_try_hint(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    @click.command()
    def probe() -> None:
        raise UserError("unknown machine 'jetson-foo'", hint="alma build --machine jetson-orin-nano-devkit")

    code, err = _run_with(probe, monkeypatch, capsys)
    assert code == 2
    assert "error: unknown machine 'jetson-foo'" in err
    assert "try: alma build --machine" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("tool_code", [1, 2, 64, 125, 255])
def test_a_tools_code_is_reported_never_passed_through(
    tool_code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # kas exits 2 on a checkout failure: as alma's 2 it would read "bad option"
    @click.command()
    def probe() -> None:
        raise ToolError(f"build failed: kas exited with code {tool_code}", returncode=tool_code)

    code, err = _run_with(probe, monkeypatch, capsys)
    assert code == 1
    assert f"kas exited with code {tool_code}" in err


def test_a_bug_exits_70_with_the_traceback_in_a_file_not_on_screen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    @click.command()
    def probe() -> None:
        {}["no such key"]  # the bug under test

    code, err = _run_with(probe, monkeypatch, capsys)
    assert code == 70
    assert "Traceback" not in err
    assert "internal error (a bug in alma): KeyError" in err
    [log] = (tmp_path / "state" / "alma" / "crash").glob("alma-crash-*.log")
    assert str(log) in err
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "no such key" in text and "argv: ['alma', 'probe']" in text
    assert log.stat().st_mode & 0o077 == 0  # a traceback may show paths and values: private


def test_a_bug_with_no_writable_state_dir_still_exits_70(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker))  # mkdir under a file fails
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)

    @click.command()
    def probe() -> None:
        raise RuntimeError("boom")

    code, err = _run_with(probe, monkeypatch, capsys)
    assert code == 70
    assert list((tmp_path / "tmp").glob("alma-crash-*.log"))


def test_a_verb_can_declare_its_own_usage_error_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # fleet health speaks Nagios: a usage or config error is UNKNOWN (3), not 2 (CRITICAL)
    @climain.usage_exit(3)
    @click.command()
    @click.option("--count", type=int)
    def probe(count: int | None) -> None:
        raise UserError("inventory not found", hint="alma fleet health --inventory FILE")

    code, err = _run_with(probe, monkeypatch, capsys)
    assert code == 3 and "inventory not found" in err
    monkeypatch.setattr(climain.LazyGroup, "get_command", lambda self, ctx, name: probe if name == "probe" else None)
    with pytest.raises(SystemExit) as ei:
        climain.main(["probe", "--count", "many"])
    assert ei.value.code == 3
    with pytest.raises(SystemExit) as ei:
        climain.main(["probe", "--bogus"])
    assert ei.value.code == 3


def test_interrupt_exits_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    @click.command()
    def probe() -> None:
        raise Interrupted("stopped")

    code, _ = _run_with(probe, monkeypatch, capsys)
    assert code == 130

    @click.command()
    def probe2() -> None:
        raise KeyboardInterrupt

    code, _ = _run_with(probe2, monkeypatch, capsys)
    assert code == 130


def test_every_verb_loads_and_documents_exit_codes() -> None:
    """Each registered verb imports, and its help names its exit codes."""
    for name in climain.VERBS:
        proc = subprocess.run(
            [sys.executable, "-m", "alma", name, "--help"], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, f"alma {name} --help failed:\n{proc.stderr}"
        assert "exit" in proc.stdout.lower(), f"alma {name} --help does not document exit codes"


def test_unknown_verb_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "alma", "frobnicate"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "No such command" in proc.stderr


def test_top_level_help_lists_every_verb_without_importing_them() -> None:
    code = (
        "import sys; from alma.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit: pass\n"
        "heavy = [m for m in ('rich', 'kas', 'pyudev', 'serial', 'jinja2') if m in sys.modules]\n"
        "print('HEAVY', heavy)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    for verb in climain.VERBS:
        assert verb in proc.stdout
    assert "HEAVY []" in proc.stdout


def test_repo_root_found_from_subdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from alma import settings

    (tmp_path / "kas").mkdir()
    (tmp_path / "layers").mkdir()
    sub = tmp_path / "docs" / "gates"
    sub.mkdir(parents=True)
    assert settings.repo_root(sub) == tmp_path.resolve()
    monkeypatch.setenv("ALMA_TOOL_KAS", "/opt/kas/bin/kas")
    assert settings.tool("kas", tmp_path) == "/opt/kas/bin/kas"
    monkeypatch.delenv("ALMA_TOOL_KAS")
    (tmp_path / "alma.toml").write_text('[tools]\ninitrd-flash = "/lab/initrd-flash"\n')
    settings._config.cache_clear()
    assert settings.tool("initrd-flash", tmp_path) == "/lab/initrd-flash"
    assert settings.tool("bitbake", tmp_path) == "bitbake"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"[build]\ndisk_gb = \xff\n", "not UTF-8"),
        (b"[build\n", "not valid TOML"),
        # tomllib recurses per level: this was a RecursionError, exit 70 (hostile input)
        (b"[build]\nx = " + b"[" * 2000 + b"]" * 2000 + b"\n", "not valid TOML: nested too deeply"),
        (b"x = " + b"{a = " * 2000 + b"1" + b"}" * 2000 + b"\n", "not valid TOML: nested too deeply"),
    ],
)
def test_a_broken_alma_toml_is_exit_2_naming_it(tmp_path: Path, content: bytes, needle: str) -> None:
    from alma import settings
    from alma.errors import ConfigError

    (tmp_path / "alma.toml").write_bytes(content)
    settings._config.cache_clear()
    with pytest.raises(ConfigError) as ei:
        settings.config(tmp_path)
    assert str(tmp_path / "alma.toml") in ei.value.message and needle in ei.value.message
    assert ei.value.exit_code == 2


def _float_options() -> list[tuple[tuple[str, ...], str]]:
    """Every option of every verb whose value is a float: (command path, option name)."""
    found: list[tuple[tuple[str, ...], str]] = []

    def walk(cmd: click.Command, path: tuple[str, ...]) -> None:
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(sub, (*path, name))
            return
        for p in cmd.params:
            if isinstance(p, click.Option) and isinstance(p.type, click.types.FloatParamType):
                found.append((path, max(p.opts, key=len)))

    walk(climain.cli, ())
    return found


FLOAT_OPTIONS = _float_options()


def test_the_walk_finds_the_float_options() -> None:
    assert (("lab", "up"), "--cpus") in FLOAT_OPTIONS and (("update",), "--poll") in FLOAT_OPTIONS


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize(("path", "option"), FLOAT_OPTIONS, ids=lambda x: " ".join(x) if isinstance(x, tuple) else x)
def test_every_float_option_refuses_a_non_finite_number_before_anything_runs(
    path: tuple[str, ...], option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """click's FloatRange lets nan through (every comparison with nan is false) and inf past a
    lower bound: a deadline, a poll interval, a size cap or a CPU budget of nan would wait for
    ever, spin, or crash in time.sleep. Each is refused as a usage error, first."""
    with pytest.raises(SystemExit) as ei:
        climain.main([*path, option, value])
    err = capsys.readouterr().err
    usage = 3 if path == ("fleet", "health") else 2  # fleet health speaks Nagios: 3 is UNKNOWN
    assert ei.value.code == usage, err
    assert "finite" in err or (value == "inf" and "range" in err), err
