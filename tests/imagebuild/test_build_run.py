"""alma build end to end with fake kas/bitbake that replay bitbake 2.8's output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support_build import OE_SHA, mark_checked_out, read_record

from alma.imagebuild import preflight as pf

MACHINE = "jetson-orin-nano-devkit"


@pytest.fixture(autouse=True)
def _ready(project: Path, fakes: Path, probes) -> None:  # type: ignore[no-untyped-def]
    mark_checked_out(project)


def test_success_runs_kas_shell_with_the_machine_chain_and_summarises(project, fakes, alma):
    code, out, err = alma("build")
    assert code == 0, err
    calls = read_record(fakes)
    kas = next(c for c in calls if c["tool"] == "kas")
    assert kas["argv"][:2] == ["shell", f"kas/alma.yml:kas/machines/{MACHINE}.yml"]
    assert kas["argv"][2] == "-c"
    conf = project / "build" / MACHINE / "alma-build.conf"
    assert kas["argv"][3] == f"bitbake -R {conf} alma-image"
    assert kas["cwd"] == str(project)
    assert kas["env"]["KAS_WORK_DIR"] == str(project / "build")
    assert kas["env"]["KAS_BUILD_DIR"] == str(project / "build" / MACHINE)
    assert kas["env"]["SSTATE_DIR"] == str(project / "build" / "sstate-cache")
    bb = next(c for c in calls if c["tool"] == "bitbake")
    assert bb["argv"] == ["-R", str(conf), "alma-image"]
    assert bb["cwd"] == str(project / "build" / MACHINE)
    # the summary: bitbake's own numbers
    assert "build succeeded" in out
    assert "tasks: 60 attempted, 40 run, 20 reused" in out
    assert "setscene restored 20" in out
    assert "sstate: 76% match (16 local, 4 mirror, 6 missed of 26 wanted)" in out
    # the full log is kept, with a latest link
    latest = project / "build" / MACHINE / "alma-build-latest.log"
    assert latest.is_symlink()
    text = latest.read_text()
    assert "NOTE: Running task 60 of 60" in text
    assert "Sstate summary: Wanted 26" in text
    assert text.rstrip().splitlines()[-1].startswith("#   full log:")


def test_plain_progress_lines_are_printed_when_not_a_tty(alma):
    code, out, _ = alma("build")
    assert code == 0
    assert "parsed 2174 recipes" in out
    assert "executing tasks" in out
    # the first status line comes at once, later ones at most every 30 s
    status = [ln for ln in out.splitlines() if ln.startswith("setscene ")]
    assert status == ["setscene 1/20 | glibc_2.39:do_populate_sysroot_setscene"]


def test_failed_compile_exits_with_bitbakes_code_and_lists_the_task_log(project, alma, monkeypatch):
    monkeypatch.setenv("FAKE_BITBAKE_SCENARIO", "fail")
    code, out, err = alma("build")
    assert code == 1
    log = project / "build" / MACHINE / "tmp/work/cortexa78ae-alma-linux/busybox/1.36.1/temp/log.do_compile.4242"
    assert out.count(f"FAILED busybox_1.36.1:do_compile  log: {log}") == 1  # announced once, as it happens
    assert "build failed" in out
    assert f"busybox_1.36.1:do_compile  log: {log}" in out
    assert "tasks: 45 attempted, 25 run, 20 reused" in out
    assert "bitbake reported 2 ERROR message(s)" in out
    assert "bitbake exited with code 1" in err
    assert "try: read the failed tasks' logs" in err
    full = (project / "build" / MACHINE / "alma-build-latest.log").read_text()
    assert "| libbb/appletlib.c:42:10: fatal error" in full  # bitbake's raw output is kept


def test_json_summary(project, alma, monkeypatch):
    import json

    monkeypatch.setenv("FAKE_BITBAKE_SCENARIO", "fail")
    code, out, _ = alma("build", "--json")
    assert code == 1
    data = json.loads(out)
    assert data["status"] == "failed" and data["tool_returncode"] == 1 and data["failed_in"] == "bitbake"
    assert data["tasks_attempted"] == 45 and data["tasks_reused"] == 20 and data["tasks_run"] == 25
    assert data["sstate"]["match_percent"] == 76
    assert data["failed_tasks"][0]["task"].endswith("busybox_1.36.1.bb:do_compile")
    assert data["failed_tasks"][0]["log"].endswith("log.do_compile.4242")


def test_shared_cache_options_reach_bitbake_through_the_generated_conf(project, fakes, alma):
    code, _, err = alma(
        "build", "--sstate-mirror", "https://cache.lab/sstate/", "--hashserv", "hashserv.lab:8686", "--jobs", "4"
    )
    assert code == 0, err
    conf = (project / "build" / MACHINE / "alma-build.conf").read_text()
    assert 'SSTATE_MIRRORS = "file://.* https://cache.lab/sstate/PATH;downloadfilename=PATH"' in conf
    assert 'BB_SIGNATURE_HANDLER = "OEEquivHash"' in conf
    assert 'BB_HASHSERVE = "auto"' in conf
    assert 'BB_HASHSERVE_UPSTREAM = "hashserv.lab:8686"' in conf
    # 8 CPUs, 64 GiB = 32 compilers at 2 GiB: 4 tasks x make -j 8 (not bitbake's 4 x 8 CPUs unbounded)
    assert 'BB_NUMBER_THREADS = "4"' in conf and 'PARALLEL_MAKE = "-j 8"' in conf
    bb = next(c for c in read_record(fakes) if c["tool"] == "bitbake")
    assert bb["argv"][:2] == ["-R", str(project / "build" / MACHINE / "alma-build.conf")]


def test_local_directory_sstate_mirror_becomes_a_file_url(project, alma):
    assert alma("build", "--sstate-mirror", "/srv/sstate")[0] == 0
    conf = (project / "build" / MACHINE / "alma-build.conf").read_text()
    assert 'SSTATE_MIRRORS = "file://.* file:///srv/sstate/PATH;downloadfilename=PATH"' in conf


@pytest.mark.parametrize(
    ("opt", "value", "needle"),
    [
        ("--sstate-mirror", "ftp://x/y", "--sstate-mirror 'ftp://x/y'"),
        ("--sstate-mirror", "relative/dir", "expected an http(s)://"),
        ("--hashserv", "not a server", "--hashserv 'not a server'"),
        ("--jobs", "0", "--jobs 0: must be at least 1"),
    ],
)
def test_bad_option_values_are_user_errors(project, fakes, alma, opt, value, needle):
    code, _, err = alma("build", opt, value)
    assert code == 2
    assert needle in err and "try:" in err
    assert read_record(fakes) == []  # nothing ran
    assert not (project / "build" / MACHINE / "alma-build.conf").exists()


def test_check_parses_and_computes_the_task_graph_without_compiling(project, fakes, alma):
    code, out, err = alma("build", "--check", "--machine", "jetson-agx-orin-devkit")
    assert code == 0, err
    conf = project / "build" / "jetson-agx-orin-devkit" / "alma-build.conf"
    kas = next(c for c in read_record(fakes) if c["tool"] == "kas")
    assert kas["argv"][1] == "kas/alma.yml:kas/machines/jetson-agx-orin-devkit.yml"
    assert kas["argv"][3] == f"bitbake -R {conf} -p && bitbake -R {conf} -g alma-image"
    bbs = [c["argv"] for c in read_record(fakes) if c["tool"] == "bitbake"]
    assert bbs == [["-R", str(conf), "-p"], ["-R", str(conf), "-g", "alma-image"]]
    assert (project / "build" / "jetson-agx-orin-devkit" / "pn-buildlist").exists()
    assert "check succeeded" in out and "recipes parsed: 2174" in out
    assert "graph: alma-image needs 11 recipes, 79 tasks" in out
    assert "alma components: 4 of 4 in the graph" in out
    assert "kernel: linux-jammy-nvidia-tegra 5.15.185+git-r0" in out


def test_check_never_needs_the_network(project, fakes, alma, monkeypatch):
    # a CI host with cached repos and no internet: sanity.bbclass's connectivity check fails
    # unless BB_NO_NETWORK is set (parse and graph never fetch)
    monkeypatch.setenv("FAKE_NO_NETWORK", "1")
    code, out, err = alma("build", "--check")
    assert code == 0, out + err
    conf = (project / "build" / MACHINE / "alma-build.conf").read_text()
    assert 'BB_NO_NETWORK = "1"' in conf
    code, out, err = alma("build")  # a real build fetches: no BB_NO_NETWORK there
    assert "BB_NO_NETWORK" not in (project / "build" / MACHINE / "alma-build.conf").read_text()
    assert code == 1 and "connectivity.html" in out


def test_check_json_reports_the_graph(project, fakes, alma):
    code, out, err = alma("build", "--check", "--json")
    assert code == 0, err
    g = json.loads(out)["graph"]
    assert g["recipes"] == 11 and g["tasks"] == 79
    assert g["components"] == {"alma-guard": True, "alma-watchdog-config": True, "alma-health": True, "eran-grid": True}
    assert g["kernel"] == {"recipe": "linux-jammy-nvidia-tegra", "version": "5.15.185+git-r0"}


def test_check_fails_when_a_component_is_not_in_the_graph(project, fakes, alma, monkeypatch):
    monkeypatch.setenv("FAKE_BITBAKE_SCENARIO", "missing-component")
    code, out, err = alma("build", "--check")
    assert code == 1
    assert "MISSING: eran-grid" in out
    assert "alma-image would lack ALMA components: eran-grid" in err
    assert "IMAGE_INSTALL" in err


def test_a_stale_graph_is_not_reported_as_this_runs(project, fakes, alma, monkeypatch):
    assert alma("build", "--check")[0] == 0
    monkeypatch.setenv("FAKE_BITBAKE_SCENARIO", "parse-error")
    code, out, err = alma("build", "--check")
    assert code == 1 and "graph:" not in out
    assert not (project / "build" / MACHINE / "pn-buildlist").exists()


def test_check_reports_a_parse_error_with_bitbakes_exit_code(project, alma, monkeypatch):
    monkeypatch.setenv("FAKE_BITBAKE_SCENARIO", "parse-error")
    code, out, err = alma("build", "--check")
    assert code == 1
    assert "check failed" in out
    assert "bitbake exited with code 1" in err and "ERROR lines above" in err


def test_features_are_appended_in_order(project, fakes, alma):
    assert alma("build", "--feature", "release", "--feature", "shared-sstate")[0] == 0
    kas = next(c for c in read_record(fakes) if c["tool"] == "kas")
    assert kas["argv"][1] == (
        f"kas/alma.yml:kas/machines/{MACHINE}.yml:kas/features/release.yml:kas/features/shared-sstate.yml"
    )


def test_jobs_are_capped_by_ram_when_not_given(project, probes, alma):
    probes(cpu_count=lambda: 16, mem_total=lambda: 12 * pf.GIB)
    code, out, _ = alma("build", "--dry-run")
    assert code == 0
    assert 'BB_NUMBER_THREADS = "6"' in out
    assert "jobs: 6 parallel bitbake tasks" in out


def test_dry_run_prints_commands_and_config_and_runs_nothing(project, fakes, alma):
    code, out, _ = alma("build", "--dry-run", "--hashserv", "unix:///srv/hashserv.sock")
    assert code == 0
    conf = project / "build" / MACHINE / "alma-build.conf"
    assert (
        f"{project}$ " in out
        and f"shell kas/alma.yml:kas/machines/{MACHINE}.yml -c 'bitbake -R {conf} alma-image'" in out
    )
    assert '  | BB_HASHSERVE_UPSTREAM = "unix:///srv/hashserv.sock"' in out
    assert "KAS_BUILD_DIR=" in out
    assert "preflight (offline part): ok" in out
    assert read_record(fakes) == []
    assert not conf.exists()


def test_dry_run_lists_reachability_checks_for_repos_not_checked_out(project, alma):
    import shutil

    shutil.rmtree(project / "build" / "openembedded-core")
    code, out, _ = alma("build", "--dry-run")
    assert code == 0
    assert "git ls-remote --quiet https://git.openembedded.org/openembedded-core HEAD" in out
    assert "git ls-remote --quiet https://git.openembedded.org/bitbake HEAD" not in out


def test_dry_run_json(project, alma):
    import json

    code, out, _ = alma("build", "--dry-run", "--json", "--machine", "jetson-orin-nano-devkit-nvme")
    assert code == 0
    plan = json.loads(out)
    assert plan["machine"] == "jetson-orin-nano-devkit-nvme"
    assert plan["argv"][1:3] == ["shell", "kas/alma.yml:kas/machines/jetson-orin-nano-devkit-nvme.yml"]
    assert plan["preflight_offline"] == []


def test_lock_file_commits_override_and_are_used(project, alma):
    (project / "kas" / "alma.lock.yml").write_text(
        f"header:\n  version: 14\noverrides:\n  repos:\n    openembedded-core:\n      commit: {OE_SHA}\n"
    )
    assert alma("build", "--dry-run")[0] == 0


def test_build_dir_option_moves_everything(project, fakes, alma, tmp_path):
    big = tmp_path / "big"
    mark_checked_out(big.parent / "big-unused")  # unrelated
    for r in ("bitbake", "openembedded-core"):
        (big / r / ".git").mkdir(parents=True)
    assert alma("build", "--build-dir", str(big))[0] == 0
    kas = next(c for c in read_record(fakes) if c["tool"] == "kas")
    assert kas["env"]["KAS_WORK_DIR"] == str(big)
    assert (big / MACHINE / "alma-build-latest.log").exists()
    assert os.path.islink(big / MACHINE / "alma-build-latest.log")


def test_kas_failing_before_bitbake_shows_its_last_words(project, fakes, alma, monkeypatch):
    # a config file vanishes between alma's checks and kas's: kas refuses it with exit 2
    monkeypatch.setenv("FAKE_KAS_DROP", "1")
    code, out, err = alma("build")
    assert code == 1  # kas's own 2 is reported, not passed on as alma's "usage error"
    assert "build failed" in out
    assert "last output:" in out and "Configuration file not found: kas/features/vanished.yml" in out
    assert "kas exited with code 2" in err
    assert "kas stopped before bitbake started" in err
    assert "failed tasks' logs" not in err  # none are listed: the hint must not point at them
