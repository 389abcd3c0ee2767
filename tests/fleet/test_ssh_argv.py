"""The ssh command line: never prompts, bounded, destination as written, command last."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from alma.fleet.inventory import Node, SshConfig, parse_fleet
from alma.fleet.ssh import ssh_argv


def test_argv_never_prompts_and_keeps_destination(tmp_path: Path) -> None:
    cfg = SshConfig(config=tmp_path / "cfg", strict_host_key_checking="yes", connect_timeout=4)
    argv = ssh_argv(Node("orin-01", "op@orin-01.lab", "board"), "alma-health --json", cfg)
    assert argv[0] == "ssh"
    assert argv[1:3] == ["-F", str(tmp_path / "cfg")]
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert {"BatchMode=yes", "ConnectTimeout=4", "StrictHostKeyChecking=yes"} <= set(opts)
    assert "-T" in argv
    # the destination goes to ssh untouched (so ~/.ssh/config applies) after "--", and the
    # remote command is one argument: nothing is parsed by a local shell
    assert argv[-3:] == ["--", "op@orin-01.lab", "alma-health --json"]
    assert not any(o.startswith("Control") for o in opts)


def test_no_config_no_F() -> None:
    argv = ssh_argv(Node("n", "n", "board"), "true", SshConfig())
    assert "-F" not in argv and "StrictHostKeyChecking=yes" in argv


def test_control_persist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fl = parse_fleet('[ssh]\ncontrol_persist = 30\n[[node]]\nname = "n1"\nrole = "board"\n', tmp_path / "f.toml")
    argv = ssh_argv(fl.nodes[0], "true", fl.ssh)
    d = tmp_path / "cache" / "alma" / "ssh"
    [path] = [a for a in argv if a.startswith("ControlPath=")]
    assert re.fullmatch(rf'ControlPath="{re.escape(str(d))}/[0-9a-f]{{8}}-%C"', path)
    assert "ControlPersist=30" in argv and "ControlMaster=auto" in argv
    assert d.stat().st_mode & 0o777 == 0o700  # sockets are credentials: private directory


def test_ssh_tool_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALMA_TOOL_SSH", "/opt/openssh/bin/ssh")
    assert ssh_argv(Node("n", "n", "board"), "true", SshConfig())[0] == "/opt/openssh/bin/ssh"


@pytest.mark.parametrize(
    "command",
    ["echo 'it'\"'\"'s' \"$HOME\" `x` $(y) ; | & > < *", "printf '%s\\n' a b", "alma-health --json"],
)
def test_remote_deadline_wrapper_keeps_the_command_exact(command: str, tmp_path: Path) -> None:
    """The node's login shell runs the wrapper; the wrapped command must mean exactly what it did."""
    import subprocess

    from alma.fleet.ssh import remote_command

    if command == "alma-health --json":
        wrapped = ssh_argv(Node("n", "n", "board"), command, SshConfig(), remote_timeout=7.2)[-1]
        assert wrapped.startswith("if command -v python3")  # the subreaper first
        assert " 8 2 'alma-health --json'; elif command -v timeout" in wrapped
        assert "timeout -k 2 8 sh -c 'alma-health --json'" in wrapped  # else coreutils' process group
        return
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    direct = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, cwd=tmp_path)
    wrapped_r = subprocess.run(["sh", "-c", remote_command(command, 5)], capture_output=True, text=True, env=env,
                               cwd=tmp_path)  # fmt: skip
    assert (wrapped_r.returncode, wrapped_r.stdout) == (direct.returncode, direct.stdout)


def test_a_shared_master_is_keyed_by_what_it_verified(tmp_path: Path) -> None:
    """One destination, pinned in one fleet and unpinned (or pinned to another key) in
    another: never the same control socket, so no node rides a connection checked otherwise."""
    pin = "SHA256:" + "A" * 43

    def path(text: str, name: str = "f.toml") -> str:
        fl = parse_fleet(f'[ssh]\ncontrol_persist = 30\ncontrol_dir = "{tmp_path / "cm"}"\n' + text, tmp_path / name)
        return next(a for a in ssh_argv(fl.nodes[0], "true", fl.ssh) if a.startswith("ControlPath="))

    node = '[[node]]\nname = "n1"\nssh = "admin@10.0.0.1"\nrole = "board"\n'
    unpinned, pinned = path(node), path(node + f'host_key = "{pin}"\n')
    other_pin = path(node + f'host_key = "SHA256:{"B" * 43}"\n')
    assert len({unpinned, pinned, other_pin}) == 3
    assert path(node + f'host_key = "{pin}"\n', "other-fleet.toml") == pinned  # same verification: shared
