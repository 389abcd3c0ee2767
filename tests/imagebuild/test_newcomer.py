"""What a kas user meets on a fresh machine: one list of problems, the environment
winning over the default tree, a checkout without .git found where kas would fail, NO_COLOR."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support_build import read_record

from alma.imagebuild import preflight as pf

MACHINE = "jetson-orin-nano-devkit"


def test_a_missing_admin_key_is_listed_with_every_other_problem(project, fakes, alma, probes, admin_key) -> None:
    admin_key.unlink()
    probes(disk_free=lambda p: 1 * pf.GB, locales=lambda: {"c.utf8"})
    code, out, err = alma("build")
    assert code == 2, (out, err)
    assert "3 problems to fix first" in err, err
    assert "a release image needs an admin key" in err and "fix: alma build --admin-key ~/.ssh/id_ed25519.pub" in err
    assert "free disk at" in err and "locale en_US.UTF-8 is not generated" in err
    assert read_record(fakes) == [] and not list(project.glob("build/*/alma-build*"))


def test_dry_run_without_a_key_shows_the_plan_and_the_problem(project, alma, admin_key) -> None:
    admin_key.unlink()
    code, out, err = alma("build", "--dry-run")
    assert code == 2 and "a release image needs an admin key" in err  # docs/build.md: --dry-run exits 2 too
    assert "kas files: kas/alma.yml:kas/machines/" in out or "kas files: kas/alma.yml kas/machines/" in out
    assert "commands:" in out and "bitbake -R" in out
    assert "problem(s) a real run would stop on" in out and "a release image needs an admin key" in out
    code, out, _ = alma("build", "--dry-run", "--json")
    plan = json.loads(out)
    assert any("needs an admin key" in p["problem"] for p in plan["preflight_offline"])
    assert plan["argv"][1] == "shell"


def test_exported_build_dirs_win_and_the_plan_says_where_each_came_from(project, alma, probes, tmp_path) -> None:
    env = {
        "KAS_WORK_DIR": str(tmp_path / "work"),
        "KAS_BUILD_DIR": str(tmp_path / "bdir"),
        "DL_DIR": str(tmp_path / "dl"),
        "SSTATE_DIR": str(tmp_path / "sstate"),
    }
    probes(env=env)
    code, out, err = alma("build", "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    for k, v in env.items():
        assert plan["env"][k] == v, k
        assert plan["env_sources"][k] == "environment", k
    assert plan["config_path"] == str(tmp_path / "bdir" / "alma-build.conf")
    code, out, _ = alma("build", "--dry-run")
    assert f"  DL_DIR={tmp_path / 'dl'}  (environment)" in out
    assert f"  SSTATE_DIR={tmp_path / 'sstate'}  (environment)" in out


def test_build_dir_option_beats_an_exported_work_dir_and_defaults_are_named(project, alma, probes, tmp_path) -> None:
    probes(env={"KAS_WORK_DIR": str(tmp_path / "work"), "DL_DIR": str(tmp_path / "dl")})
    code, out, _ = alma("build", "--dry-run", "--json", "--build-dir", tmp_path / "opt")
    plan = json.loads(out)
    assert plan["env"]["KAS_WORK_DIR"] == str(tmp_path / "opt") and plan["env_sources"]["KAS_WORK_DIR"] == "--build-dir"
    assert plan["env"]["DL_DIR"] == str(tmp_path / "dl") and plan["env_sources"]["DL_DIR"] == "environment"
    assert plan["env"]["SSTATE_DIR"] == str(tmp_path / "opt" / "sstate-cache")
    probes(env={})
    code, out, _ = alma("build", "--dry-run", "--json")
    plan = json.loads(out)
    assert plan["env"]["DL_DIR"] == str(project / "build" / "downloads") and plan["env_sources"]["DL_DIR"] == "default"


def test_a_checkout_without_git_is_found_by_dry_run_build_and_lint(project, fakes, alma) -> None:
    subprocess.run(["rm", "-rf", str(project / ".git")], check=True)
    code, out, err = alma("build", "--dry-run")
    assert code == 2 and "is not a git (or hg) checkout" in out and "Configuration file not found" in out
    code, out, err = alma("build")
    assert code == 2 and "is not a git (or hg) checkout" in err and f"git -C {project} init" in err
    assert read_record(fakes) == []


def test_no_color_and_the_flag_keep_error_uncoloured_on_a_terminal(project, tmp_path: Path) -> None:
    """A real pty: click colours only on a terminal, so that is where NO_COLOR must hold."""
    import os
    import pty

    def run(args: list[str], env: dict[str, str]) -> bytes:
        pid, fd = pty.fork()
        if pid == 0:  # child: alma with an unknown machine -> "error: ..." on stderr (the pty)
            os.execve(sys.executable, [sys.executable, "-m", "alma", *args], env)
        chunks = []
        while True:
            try:
                data = os.read(fd, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        os.waitpid(pid, 0)
        return b"".join(chunks)

    base = {k: v for k, v in os.environ.items() if k != "NO_COLOR"} | {"ALMA_ROOT": str(project), "TERM": "xterm"}
    coloured = run(["build", "--dry-run", "--machine", "nope"], base)
    assert b"error: unknown machine" in coloured and b"\x1b[31m" in coloured  # the control: colour on a tty
    for args, env in ((["build"], {**base, "NO_COLOR": "1"}), (["--no-color", "build"], base)):
        out = run([*args, "--dry-run", "--machine", "nope"], env)
        assert b"error: unknown machine" in out and b"\x1b[" not in out, out
