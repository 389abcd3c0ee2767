"""What a kas user expects from `alma build`: a target, a task, -k, bitbake
arguments after `--`, extra kas files with kas's colon semantics through the same checks,
`alma shell` (kas shell with the plan) and `alma dump` (the merged config, --lock)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from support_build import BITBAKE_SHA, OE_SHA, mark_checked_out, read_record

MACHINE = "jetson-orin-nano-devkit"


def _kas_calls(record: Path) -> list[dict]:
    return [r for r in read_record(record) if r["tool"] == "kas"]


def test_target_task_keep_going_and_passthrough_reach_bitbake(project, fakes, alma, probes) -> None:
    mark_checked_out(project)
    code, out, err = alma("build", "--target", "busybox", "--task", "fetch", "-k", "--", "-DD", "--runall=fetch")
    [call] = _kas_calls(fakes)
    conf = project / "build" / MACHINE / "alma-build.conf"
    assert call["argv"][-1] == f"bitbake -R {conf} -k -c fetch busybox -DD --runall=fetch", call["argv"]


def test_passthrough_arguments_are_quoted_for_the_shell(project, alma) -> None:
    code, out, _ = alma("build", "--dry-run", "--json", "--", "-c", "x; rm -rf /")
    assert code == 0
    assert json.loads(out)["argv"][-1].endswith("alma-image -c 'x; rm -rf /'")
    code, _, err = alma("build", "--dry-run", "--target", "busybox;id")
    assert code == 2 and "not a recipe name" in err
    code, _, err = alma("build", "--dry-run", "--check", "--task", "fetch")
    assert code == 2 and "--check parses and computes the graph only" in err


def test_extra_kas_files_follow_kas_colon_semantics_and_the_same_checks(project, alma) -> None:
    local = project / "kas" / "local"
    local.mkdir()
    (local / "a.yml").write_text('header:\n  version: 14\nlocal_conf_header:\n  zz-a: |\n    A = "1"\n')
    (local / "b.yml").write_text('header:\n  version: 14\nlocal_conf_header:\n  zz-b: |\n    B = "1"\n')
    code, out, err = alma("build", "--dry-run", "--json", "--kas-file", "kas/local/a.yml:kas/local/b.yml")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["argv"][2].endswith(":kas/local/a.yml:kas/local/b.yml")
    (local / "b.yml").write_text("header:\n  version: 14\nbogus: 1\n")
    code, out, err = alma("build", "--dry-run", "--kas-file", "kas/local/a.yml:kas/local/b.yml")
    assert code == 2 and "kas/local/b.yml:3" in err and "'bogus' was unexpected" in err
    outside = project.parent / "mine.yml"
    outside.write_text("header:\n  version: 14\n")
    code, _, err = alma("build", "--dry-run", "--kas-file", str(outside))
    assert code == 2 and "outside the checkout" in err


def test_alma_shell_runs_kas_shell_with_the_plan_and_build_drops_an_old_auto_conf(project, fakes, alma, probes) -> None:
    mark_checked_out(project)
    auto = project / "build" / MACHINE / "conf" / "auto.conf"  # what an earlier alma shell left
    auto.parent.mkdir(parents=True)
    auto.write_text("# Written by `alma shell`; alma build removes it. The plan's config:\nrequire x\n")
    code, out, err = alma("shell", "-c", "true")
    assert code == 0, err
    [call] = _kas_calls(fakes)
    conf = project / "build" / MACHINE / "alma-build.conf"
    assert call["argv"][:2] == ["shell", f"kas/alma.yml:kas/machines/{MACHINE}.yml"] and call["argv"][-2:] == [
        "-c",
        f"export BBPOSTCONF={conf}; true",  # bitbake reads it as -R: the build's config, at the build's point
    ]
    assert call["env"]["KAS_BUILD_DIR"] == str(project / "build" / MACHINE)
    assert conf.is_file() and not auto.exists()
    # a build typed in the shell is verified where it went: the tree is recorded as alma build records it
    assert json.loads((project / "build" / MACHINE / "alma-build-tree.json").read_text())["KAS_BUILD_DIR"] == str(
        project / "build" / MACHINE
    )
    code, _, err = alma("shell", "-c", "false")
    assert code == 1 and "kas shell exited with code 1" in err


def test_alma_shell_stops_on_the_same_preflight_problems(project, fakes, alma, probes, admin_key) -> None:
    admin_key.unlink()
    code, _, err = alma("shell", "-c", "true")
    assert code == 2 and "a release image needs an admin key" in err and _kas_calls(fakes) == []


def test_alma_dump_prints_the_merged_config_and_its_lock(project, alma) -> None:
    (project / "kas" / "alma.lock.yml").write_text(
        f"header:\n  version: 14\noverrides:\n  repos:\n    bitbake:\n      commit: {'a' * 40}\n"
    )
    code, out, err = alma("dump", "--feature", "release")
    assert code == 0, err
    merged = yaml.safe_load(out)
    assert merged["machine"] == MACHINE and merged["distro"] == "alma" and "release" in merged["local_conf_header"]
    code, out, _ = alma("dump", "--lock", "--json")
    pins = json.loads(out)["overrides"]["repos"]
    assert pins == {"bitbake": {"commit": "a" * 40}, "openembedded-core": {"commit": OE_SHA}}
    assert BITBAKE_SHA not in out  # the lock file's pin wins, as kas applies it
