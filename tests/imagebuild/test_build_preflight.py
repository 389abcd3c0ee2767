"""Preflight: every problem found at once, each with its fix; nothing slow starts."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from support import REPO, require_tool
from support_build import mark_checked_out, read_record

from alma.imagebuild import preflight as pf

MACHINE = "jetson-orin-nano-devkit"


@pytest.fixture(autouse=True)
def _fakes(fakes: Path) -> None:
    return None


def assert_nothing_ran(project: Path, record: Path) -> None:
    assert read_record(record) == []
    assert not (project / "build" / MACHINE / "alma-build.conf").exists()
    assert not list((project / "build").glob("*/alma-build-*.log")) if (project / "build").exists() else True


def test_root_is_refused_with_how_to_run_as_a_user(project, fakes, probes, alma):
    mark_checked_out(project)
    probes(euid=lambda: 0, env={"SUDO_USER": "ada"})
    code, _, err = alma("build")
    assert code == 2
    assert "running as root: bitbake refuses root" in err
    assert "fix: sudo -u ada -H " in err
    assert_nothing_ran(project, fakes)


def test_root_without_sudo_user_suggests_creating_one(project, probes):
    p = probes(euid=lambda: 0, env={})
    [(what, fix)] = pf.check_user(p)
    assert "useradd -m builder" in fix


def test_missing_host_tools_name_the_debian_packages(project, fakes, probes, alma):
    mark_checked_out(project)
    absent = {"gcc", "g++", "chrpath", "diffstat", "lz4c", "rpcgen"}
    probes(which=lambda t: None if t in absent else f"/usr/bin/{t}")
    code, _, err = alma("build")
    assert code == 2
    line = next(ln for ln in err.splitlines() if "host tools bitbake needs are missing" in ln)
    assert all(t in line for t in absent)
    assert "fix: sudo apt-get install build-essential chrpath diffstat lz4" in err
    assert_nothing_ran(project, fakes)


def test_hosttools_table_covers_oe_core_scarthgap_list():
    # meta/conf/bitbake.conf HOSTTOOLS (scarthgap) + sanity.bbclass SANITY_REQUIRED_UTILITIES
    for tool in ("chrpath", "diffstat", "lz4c", "pzstd", "rpcgen", "python3", "gawk", "wget", "cpio", "file", "which"):
        assert tool in pf.HOSTTOOLS_DEBIAN


def test_kas_missing(project, probes):
    p = probes(find_kas=lambda: None)
    assert [w for w, _ in pf.check_tools(p)] == ["kas is not installed"]


def test_low_disk_reports_the_real_figure_and_the_need(project, fakes, probes, alma):
    mark_checked_out(project)
    probes(disk_free=lambda p: 40 * pf.GB)
    code, _, err = alma("build")
    assert code == 2
    assert "40.0 GB, this build needs ~150 GB" in err
    assert "--build-dir" in err


def test_check_mode_needs_far_less_disk(project, fakes, probes, alma):
    mark_checked_out(project)
    probes(disk_free=lambda p: 40 * pf.GB)
    code, _, err = alma("build", "--check")
    assert code == 0, err


def test_disk_need_is_configurable_in_alma_toml(project, fakes, probes, alma):
    mark_checked_out(project)
    (project / "alma.toml").write_text("[build]\ndisk_gb = 30\n")
    probes(disk_free=lambda p: 40 * pf.GB)
    assert alma("build")[0] == 0


def test_jobs_beyond_ram_suggest_a_smaller_jobs(project, fakes, probes, alma):
    mark_checked_out(project)
    probes(mem_total=lambda: 16 * pf.GIB)
    code, _, err = alma("build", "--jobs", "12")
    assert code == 2
    assert "--jobs 12 needs ~24 GiB RAM (2 GiB per bitbake task), this host has 16.0 GiB" in err
    assert "fix: alma build --jobs 8" in err


def test_missing_locale(project, probes):
    p = probes(locales=lambda: {"c", "c.utf8", "posix"})
    [(what, fix)] = pf.check_locale(p)
    assert "en_US.UTF-8" in what and "locale-gen" in fix


def test_unreachable_repos_are_listed_with_git_words(project, fakes, probes, alma):
    mark_checked_out(project, "bitbake")
    probes(ls_remote=lambda url, t: "fatal: unable to access 'x': Could not resolve host: git.openembedded.org")
    code, _, err = alma("build")
    assert code == 2
    assert "repository openembedded-core (https://git.openembedded.org/openembedded-core) is not checked out" in err
    assert "Could not resolve host" in err
    assert "repository bitbake" not in err  # already checked out: no network needed


def test_all_problems_are_reported_together(project, fakes, probes, alma):
    probes(
        euid=lambda: 0,
        which=lambda t: None if t == "chrpath" else "/bin/x",
        disk_free=lambda p: 1 * pf.GB,
        ls_remote=lambda url, t: "no answer within 15 s",
    )
    code, _, err = alma("build")
    assert code == 2
    assert "build not started: 5 problems to fix first" in err
    assert err.count("fix: ") == 5
    assert "Traceback" not in err
    assert_nothing_ran(project, fakes)


def test_real_network_probe_through_a_dead_proxy_fails_fast_and_clearly(project, probes):
    require_tool("git")
    p = probes(ls_remote=pf._ls_remote)
    repos = [pf.RepoPin("bitbake", "https://git.openembedded.org/bitbake", None, "2.8", project / "build" / "bitbake")]
    t0 = time.monotonic()
    [(what, fix)] = pf.check_network(p, repos, timeout=10)
    assert time.monotonic() - t0 < 12
    assert "repository bitbake (https://git.openembedded.org/bitbake) is not checked out and cannot be reached" in what
    assert "git clone -b 2.8 https://git.openembedded.org/bitbake" in fix


@pytest.mark.slow
def test_readme_main_command_offline_ends_with_an_actionable_statement(tmp_path):
    """What CI sees: the real probes, the repository's real kas files, no network (dead proxy)."""
    import subprocess
    import sys

    require_tool("git")
    from support_build import install_default_admin_key

    install_default_admin_key(Path.home())  # a newcomer with a key: the README command still works
    alma = shutil.which("alma") or str(Path(sys.executable).parent / "alma")
    res = subprocess.run(
        [alma, "build", "--build-dir", str(tmp_path / "build")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert "build not started:" in res.stderr
    assert "cannot be reached" in res.stderr  # repos not checked out in tmp_path, no network
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "build" / "jetson-orin-nano-devkit" / "alma-build.conf").exists()
