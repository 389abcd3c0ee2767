"""Preflight: every problem found at once, each with its fix; nothing slow starts."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
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
    [(what, fix)] = pf.check_user(None, p)
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
    assert [w for w, _ in pf.check_tools(None, p)] == ["kas is not installed"]


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
    [(what, fix)] = pf.check_locale(None, p)
    assert "en_US.UTF-8" in what and "locale-gen" in fix


def test_unreachable_repos_are_listed_with_git_words(project, fakes, probes, alma):
    mark_checked_out(project, "bitbake")
    probes(ls_remote=lambda url, t, env: "fatal: unable to access 'x': Could not resolve host: git.openembedded.org")
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
        ls_remote=lambda url, t, env: "no answer within 15 s",
    )
    code, _, err = alma("build")
    assert code == 2
    assert "build not started: 5 problems to fix first" in err
    assert err.count("fix: ") == 5
    assert "Traceback" not in err
    assert_nothing_ran(project, fakes)


def test_real_network_probe_through_a_dead_proxy_fails_fast_and_clearly(project, probes):
    require_tool("git")
    p = probes(ls_remote=pf._ls_remote, env=dict(os.environ))  # the autouse fixture's dead proxy, as kas passes it
    repos = [pf.RepoPin("bitbake", "https://git.openembedded.org/bitbake", None, "2.8", project / "build" / "bitbake")]
    t0 = time.monotonic()
    [(what, fix)] = pf.unreachable_repos(p, repos, timeout=600)
    assert time.monotonic() - t0 < 120  # refused by the dead proxy, not waited out (load allowed)
    assert "repository bitbake (https://git.openembedded.org/bitbake) is not checked out and cannot be reached" in what
    assert "KAS_PREMIRRORS='https://git\\.openembedded\\.org/bitbake file:///path/to/mirror.git'" in fix


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


# --- an honest preflight ---------------------------------------------------------


def test_disk_estimate_knows_rm_work_and_names_the_override(project, fakes, probes, alma):
    mark_checked_out(project)
    base = project / "kas" / "alma.yml"
    base.write_text(base.read_text().replace('INHERIT += "buildhistory"', 'INHERIT += "buildhistory rm_work"'))
    probes(disk_free=lambda p: 40 * pf.GB)
    code, _, err = alma("build")
    assert code == 2
    assert "this build needs ~90 GB (a full image with rm_work (inherited by the kas files))" in err
    assert "alma.toml: [build] disk_gb = N" in err
    probes(disk_free=lambda p: 100 * pf.GB)  # enough with rm_work, not without (150)
    assert alma("build")[0] == 0


def test_disk_estimate_without_rm_work_is_the_full_figure(project, fakes, probes, alma):
    mark_checked_out(project)
    probes(disk_free=lambda p: 100 * pf.GB)
    code, _, err = alma("build")
    assert code == 2 and "needs ~150 GB (a full image without rm_work)" in err


def test_jobs_suggestion_fits_the_cpus(project, fakes, probes, alma):
    mark_checked_out(project)
    probes(cpu_count=lambda: 2, mem_total=lambda: 22 * pf.GIB)
    code, _, err = alma("build", "--jobs", "64")
    assert code == 2
    assert "fix: alma build --jobs 2" in err and "--jobs 11" not in err
    assert "--jobs 64 on 2 CPUs" in err


@pytest.mark.parametrize(("cpus", "gib"), [(16, 32), (64, 16), (2, 4), (8, 64), (32, 256)])
def test_threads_times_parallel_make_fits_the_ram(project, probes, alma, cpus, gib):
    probes(cpu_count=lambda: cpus, mem_total=lambda: gib * pf.GIB)
    code, out, _ = alma("build", "--dry-run", "--json")
    assert code == 0
    import json as _json

    plan = _json.loads(out)
    threads, make = plan["jobs"], plan["parallel_make"]
    assert f'BB_NUMBER_THREADS = "{threads}"' in plan["config"] and f'PARALLEL_MAKE = "-j {make}"' in plan["config"]
    assert threads * make * pf.RAM_PER_TASK_GIB <= gib, (threads, make)
    assert 1 <= make <= cpus and 1 <= threads <= cpus


@given(cpus=st.integers(1, 256), gib=st.integers(2, 2048), jobs=st.integers(1, 512))
def test_parallel_make_never_overcommits_ram_for_jobs_that_fit(cpus, gib, jobs):
    p = pf.Probes(cpu_count=lambda: cpus, mem_total=lambda: gib * pf.GIB)
    make = pf.parallel_make(p, jobs)
    assert 1 <= make <= cpus
    slots = gib // pf.RAM_PER_TASK_GIB
    if jobs <= slots:  # a --jobs beyond the RAM is refused by check_ram
        assert jobs * make <= slots
    assert pf.suggest_jobs(p) <= cpus and pf.suggest_jobs(p) <= max(1, slots)


def test_build_tree_not_writable_by_the_build_user_is_a_preflight_problem(project, fakes, probes, alma):
    mark_checked_out(project)
    build = (project / "build").resolve()
    probes(access=lambda p, m: not Path(p).is_relative_to(build), owner=lambda p: 0)
    code, out, err = alma("build")
    assert code == 2 and "Traceback" not in out + err and "PermissionError" not in err
    assert f"{build} is not writable by builder (owned by root)" in err
    assert f"fix: sudo chown -R builder: {build}" in err
    assert_nothing_ran(project, fakes)


def test_build_tree_owned_by_another_user_is_named(project, fakes, probes, alma):
    mark_checked_out(project)
    build = (project / "build").resolve()
    probes(owner=lambda p: 0 if Path(p) == build else 1000)
    code, _, err = alma("build")
    assert code == 2 and f"{build} is owned by root, not builder" in err


def test_unwritable_parent_of_a_new_build_dir(project, fakes, probes, alma, tmp_path):
    probes(access=lambda p, m: False, owner=lambda p: 0)
    code, _, err = alma("build", "--build-dir", tmp_path / "ro" / "alma")
    assert code == 2 and "is not writable by builder" in err


def test_a_mirror_owned_by_another_user_names_gits_cause_and_the_safe_directory_fix(tmp_path, probes) -> None:  # type: ignore[no-untyped-def]
    """A shared mirror another user owns: kas's git (a HOME of its own, no safe.directory) stops
    with "dubious ownership"; the preflight names that cause, not git's closing "...the
    repository exists.", and the fix kas can take (GITCONFIG_FILE)."""
    import subprocess

    from alma.imagebuild.project import RepoPin

    git = require_tool("git")
    if os.geteuid() != 0:
        pytest.skip("needs root: the mirror is given another owner (chown)")
    mirror = tmp_path / "mirror.git"
    subprocess.run([git, "init", "-q", "--bare", str(mirror)], check=True)
    for p in (mirror, *mirror.rglob("*")):
        os.lchown(p, 65534, 65534)
    pin = RepoPin("bitbake", f"file://{mirror}", "a" * 40, "2.8", tmp_path / "co" / "bitbake")
    p = probes(ls_remote=pf._ls_remote, env={"PATH": os.environ["PATH"]})
    [(what, fix)] = pf.unreachable_repos(p, [pin])
    assert "fatal: detected dubious ownership" in what and "the repository exists" not in what
    assert f"directory = {mirror}" in fix and "export GITCONFIG_FILE=" in fix
    cfg = tmp_path / "mirrors.gitconfig"
    cfg.write_text(f"[safe]\n\tdirectory = {mirror}\n")
    p = probes(ls_remote=pf._ls_remote, env={"PATH": os.environ["PATH"], "GITCONFIG_FILE": str(cfg)})
    assert pf.unreachable_repos(p, [pin]) == []  # what kas's git will do with that file in its HOME


def test_a_tmpdir_on_another_disk_is_measured_for_the_output_and_the_tree_for_downloads_and_sstate(
    project, fakes, probes, alma, tmp_path
):
    mark_checked_out(project)
    scratch = tmp_path / "scratch"
    glibc = f"{scratch}-glibc"

    def device(p):
        return 2 if str(p).startswith(glibc) else 1

    probes(env={"TMPDIR": str(scratch)}, device=device, disk_free=lambda p: 20 * pf.GB)
    code, _, err = alma("build")
    assert code == 2
    assert f"20.0 GB, bitbake's TMPDIR {glibc} needs ~110 GB" in err and "env -u TMPDIR alma build" in err
    assert "20.0 GB, the build tree needs ~40 GB (downloads and sstate)" in err
    # room for the output on its disk: only the tree's share is asked of the tree
    probes(env={"TMPDIR": str(scratch)}, device=device, disk_free=lambda p: (500 if device(p) == 2 else 39) * pf.GB)
    code, _, err = alma("build")
    assert code == 2 and "bitbake's TMPDIR" not in err and "39.0 GB, the build tree needs ~40 GB" in err, err
