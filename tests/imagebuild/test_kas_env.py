"""What kas itself will build, through real kas 5.5 (local git repositories stand in for the
upstream ones; bitbake is the recording fake): exported KAS_MACHINE / KAS_DISTRO /
KAS_TARGET / KAS_TASK, a kas file's target, task and env:, and `alma shell` configuring
bitbake exactly as `alma build` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from imagebuild.test_build_real_kas import real_kas_project  # noqa: F401 (a fixture)
from support_build import read_record

from alma.imagebuild import kasview
from alma.imagebuild import preflight as pf

AGX = "jetson-agx-orin-devkit"
NANO = "jetson-orin-nano-devkit"


def _postread(call: dict[str, Any]) -> list[str]:
    """The files bitbake reads after local.conf: -R arguments and BBPOSTCONF (bitbake main.py)."""
    argv = call["argv"]
    files = [argv[i + 1] for i, a in enumerate(argv) if a == "-R"]
    return files + ([call["bbpostconf"]] if call.get("bbpostconf") else [])


@dataclass
class RealKas:
    """A project built by the real kas (``real_kas_project``), and the environment it sees."""

    root: Path
    tmp: Path
    monkeypatch: pytest.MonkeyPatch
    probes: Callable[..., pf.Probes]

    def export(self, **env: str) -> None:
        """Export ``env`` to alma and kas alike: the environment alma plans with is kas's."""
        self.monkeypatch.delenv("TMPDIR", raising=False)  # a login's TMPDIR moves bitbake's output (its own test below)
        for k, v in env.items():
            self.monkeypatch.setenv(k, v)
        self.probes(ls_remote=pf._ls_remote, env=dict(os.environ))

    def bitbake_calls(self) -> list[dict[str, Any]]:
        return [c for c in read_record(self.tmp / "record.jsonl") if c["tool"] == "bitbake" and "argv" in c]

    def remote_urls(self) -> str:
        """Point the kas files at an unreachable https host; the local repositories become its mirror."""
        base = self.root / "kas" / "alma.yml"
        base.write_text(base.read_text().replace(f"file://{self.tmp / 'upstream'}/", "https://git.example.invalid/"))
        return "https://git.example.invalid/"


@pytest.fixture
def real_kas(real_kas_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probes) -> RealKas:  # type: ignore[no-untyped-def]  # noqa: F811
    return RealKas(real_kas_project, tmp_path, monkeypatch, probes)


@pytest.fixture
def agx_file(real_kas: RealKas) -> Path:
    f = real_kas.root / "kas" / "machines" / f"{AGX}.yml"
    f.write_text(f"header:\n  version: 14\n  includes:\n    - kas/alma.yml\nmachine: {AGX}\n")
    return f


@pytest.mark.slow
def test_exported_kas_machine_is_what_the_plan_and_the_build_use(real_kas: RealKas, agx_file: Path, alma) -> None:  # type: ignore[no-untyped-def]
    root = real_kas.root
    real_kas.export(KAS_MACHINE=AGX)
    code, out, err = alma("build", "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["machine"] == AGX and plan["kas"]["machine"] == {"value": AGX, "source": "environment KAS_MACHINE"}
    assert plan["kas_files"][1].endswith(f"kas/machines/{AGX}.yml")
    assert plan["env"]["KAS_BUILD_DIR"] == str(root / "build" / AGX)
    code, out, err = alma("build", "--dry-run")
    assert f"MACHINE {AGX}  (environment KAS_MACHINE)" in out and NANO not in out
    code, out, err = alma("build")
    assert code == 0, out + err
    [bb] = real_kas.bitbake_calls()
    assert bb["cwd"] == str(root / "build" / AGX)
    local = (root / "build" / AGX / "conf" / "local.conf").read_text()
    assert f'MACHINE ??= "{AGX}"' in local  # what real kas wrote for bitbake
    # asking for another machine while kas would build the exported one is refused
    code, _, err = alma("build", "--dry-run", "--machine", NANO)
    assert code == 2 and f"KAS_MACHINE={AGX} is exported but --machine is {NANO}" in err


@pytest.mark.slow
def test_exported_kas_distro_other_than_the_kas_files_is_refused_with_the_reason(real_kas: RealKas, alma) -> None:  # type: ignore[no-untyped-def]
    real_kas.export(KAS_DISTRO="poky")
    code, out, err = alma("build", "--dry-run")
    assert code == 2 and "DISTRO poky  (environment KAS_DISTRO)" in out
    assert "KAS_DISTRO=poky is exported: kas would build DISTRO 'poky' instead of the kas files' 'alma'" in err
    code, _, err = alma("build")
    assert code == 2 and "unset KAS_DISTRO" in err and real_kas.bitbake_calls() == []
    real_kas.export(KAS_DISTRO="alma")  # the same distro: nothing to refuse
    code, out, _ = alma("build", "--dry-run")
    assert code == 0 and "DISTRO alma  (environment KAS_DISTRO)" in out


@pytest.mark.slow
def test_kas_target_and_task_from_the_environment_reach_bitbake(real_kas: RealKas, alma) -> None:  # type: ignore[no-untyped-def]
    real_kas.export(KAS_TARGET="core-image-minimal alma-image", KAS_TASK="fetch")
    code, out, err = alma("build")
    assert code == 0, out + err
    [bb] = real_kas.bitbake_calls()
    assert bb["argv"][2:] == ["-c", "fetch", "core-image-minimal", "alma-image"]


@pytest.mark.slow
def test_alma_shell_and_alma_build_give_bitbake_the_same_configuration(real_kas: RealKas, alma) -> None:  # type: ignore[no-untyped-def]
    # oe-core reads site.conf, auto.conf, local.conf, then -R files: a config the shell put in
    # auto.conf would lose to the kas file's BB_NUMBER_THREADS where the build's -R wins
    root = real_kas.root
    (root / "kas" / "threads.yml").write_text(
        'header:\n  version: 14\nlocal_conf_header:\n  threads: |\n    BB_NUMBER_THREADS = "1"\n'
    )
    code, out, err = alma("shell", "--kas-file", "kas/threads.yml", "-c", "bitbake alma-image")
    assert code == 0, out + err
    code, out, err = alma("build", "--kas-file", "kas/threads.yml")
    assert code == 0, out + err
    shell_bb, build_bb = real_kas.bitbake_calls()
    conf = root / "build" / NANO / "alma-build.conf"
    assert _postread(shell_bb) == _postread(build_bb) == [str(conf)]
    assert "BB_NUMBER_THREADS" not in conf.read_text()  # the kas file chose: local.conf's "1" stands in both
    assert 'BB_NUMBER_THREADS = "1"' in (root / "build" / NANO / "conf" / "local.conf").read_text()
    assert not (root / "build" / NANO / "conf" / "auto.conf").exists()


def test_targets_task_and_env_of_a_kas_file_are_honoured(project, alma, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (project / "kas" / "local").mkdir(exist_ok=True)
    (project / "kas" / "local" / "t.yml").write_text(
        f"header:\n  version: 14\ntarget: busybox\ntask: fetch\nenv:\n  DL_DIR: {tmp_path / 'dl'}\n"
    )
    code, out, err = alma("build", "--dry-run", "--json", "--kas-file", "kas/local/t.yml")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["argv"][-1].endswith(" -c fetch busybox")
    assert plan["env"]["DL_DIR"] == str(tmp_path / "dl") and plan["env_sources"]["DL_DIR"] == "kas files env:"
    assert plan["kas"]["targets"] == {"value": ["busybox"], "source": "kas files"}


def test_repeated_and_virtual_targets_and_a_task_hint_that_names_a_task(project, alma) -> None:  # type: ignore[no-untyped-def]
    code, out, err = alma("build", "--dry-run", "--json", "--target", "busybox", "--target", "zlib")
    assert code == 0, err and json.loads(out)["argv"][-1].endswith(" busybox zlib")
    assert json.loads(out)["argv"][-1].endswith(" busybox zlib")
    code, out, err = alma("build", "--dry-run", "--json", "--target", "virtual/kernel")
    assert code == 0, err
    assert json.loads(out)["argv"][-1].endswith(" virtual/kernel")
    code, _, err = alma("build", "--dry-run", "--task", "fetch;id")
    assert code == 2 and "not a task name" in err and "alma build --task fetch" in err and "--target" not in err


@pytest.mark.parametrize(
    ("env", "data"),
    [
        ({}, {"machine": "m1", "distro": "d1", "target": "t1", "task": "fetch"}),
        ({"KAS_MACHINE": "m2", "KAS_DISTRO": "d2", "KAS_TARGET": " a  b ", "KAS_TASK": "compile"}, {"machine": "m1"}),
        ({"KAS_TARGET": ""}, {"target": ["x", "y"]}),
        ({}, {}),
    ],
)
def test_the_view_resolves_as_kas_own_getters_do(env, data, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from kas.config import Config

    for k in ("KAS_MACHINE", "KAS_DISTRO", "KAS_TARGET", "KAS_TASK"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    shim = SimpleNamespace(_config=data, _override_target=None, _override_task=None)
    view = kasview.resolve(data, env)
    assert view.machine.value == Config.get_machine(shim)  # type: ignore[arg-type]
    assert view.distro.value == Config.get_distro(shim)  # type: ignore[arg-type]
    assert view.targets.value == Config.get_bitbake_targets(shim)  # type: ignore[arg-type]
    assert view.task.value == Config.get_bitbake_task(shim)  # type: ignore[arg-type]


@pytest.mark.slow
def test_an_exported_tmpdir_reaches_bitbake_through_real_kas_and_the_plan_disk_check_and_verify_follow_it(
    real_kas: RealKas,
    alma,  # type: ignore[no-untyped-def]
) -> None:
    from artefacts.alma_deployfix import build_deploy

    root = real_kas.root
    login_tmp = real_kas.tmp / "user" / "tmp"  # bitbake's TMPDIR: <it>-glibc, beside it
    login_tmp.mkdir(parents=True)
    real_kas.export(TMPDIR=str(login_tmp))
    # the fact the plan rests on: real kas hands bitbake the exported TMPDIR, listed for its datastore
    kas = Path(sys.executable).parent / "kas"
    res = subprocess.run(
        [
            str(kas),
            "shell",
            f"kas/machines/{NANO}.yml",
            "-c",
            'echo "T=$TMPDIR"; echo "P=$BB_ENV_PASSTHROUGH_ADDITIONS"',
        ],
        cwd=root,
        env={**os.environ, "KAS_WORK_DIR": str(root / "build"), "KAS_BUILD_DIR": str(real_kas.tmp / "kb")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    assert f"T={login_tmp}" in res.stdout
    assert "TMPDIR" in res.stdout.split("P=", 1)[1].split()
    bb_tmp = f"{login_tmp}-glibc"
    code, out, err = alma("build", "--dry-run", "--json")
    assert code == 0, err
    assert json.loads(out)["tmpdir"] == {"value": bb_tmp, "source": "environment"}
    code, out, _ = alma("build", "--dry-run")
    assert f"TMPDIR (bitbake's build output, deploy dir under it): {bb_tmp}" in out and "env -u TMPDIR" in out
    # the disk check measures bitbake's TMPDIR's filesystem when it is another than the build tree's
    small = {str(real_kas.tmp / "user"): 3 * pf.GB}
    real_kas.probes(
        ls_remote=pf._ls_remote,
        env=dict(os.environ),
        device=lambda p: 2 if str(p).startswith(bb_tmp) else 1,
        disk_free=lambda p: small.get(str(pf._existing_parent(p)), 500 * pf.GB),
    )
    code, _, err = alma("build")
    assert code == 2 and f"free disk at {real_kas.tmp / 'user'}: 3.0 GB, bitbake's TMPDIR {bb_tmp}" in err, err
    assert "env -u TMPDIR alma build" in err and real_kas.bitbake_calls() == []
    real_kas.export(TMPDIR=str(login_tmp))
    code, out, err = alma("build")
    assert code == 0, out + err
    [bb] = real_kas.bitbake_calls()
    # verify looks where the build put it, whatever the environment verify runs in
    real_kas.monkeypatch.delenv("TMPDIR")
    d = build_deploy(root, topdir=real_kas.tmp / "user")
    assert str(d.dir).startswith(bb_tmp)
    code, out, err = alma("verify", "--root", str(root))
    assert code == 0, out + err
    assert str(d.dir) in out + err
    # a kas file that sets bitbake's TMPDIR beats the exported one, as local.conf does
    (root / "kas" / "tmp.yml").write_text(
        'header:\n  version: 14\nlocal_conf_header:\n  tmp: |\n    TMPDIR = "${TOPDIR}/bbtmp"\n'
    )
    real_kas.export(TMPDIR=str(login_tmp))
    code, out, err = alma("build", "--dry-run", "--json", "--kas-file", "kas/tmp.yml")
    assert json.loads(out)["tmpdir"] == {
        "value": str(root / "build" / NANO / "bbtmp-glibc"),
        "source": "kas files local_conf_header",
    }


def test_a_login_tmpdir_whose_parent_is_not_writable_is_refused_with_the_fix(project, alma, probes, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """libpam-tmpdir's TMPDIR is /tmp/user/<uid>: bitbake would create /tmp/user/<uid>-glibc in root's /tmp/user."""
    locked = tmp_path / "user"
    locked.mkdir()
    probes(env={"TMPDIR": str(locked / "1000")}, access=lambda p, m: Path(p) != locked)
    code, _, err = alma("build")
    assert code == 2 and f"bitbake's TMPDIR would be {locked}/1000-glibc" in err and f"{locked} is not writable" in err
    assert "env -u TMPDIR alma build" in err


@pytest.mark.slow
def test_a_dirty_or_moved_repository_is_in_the_plan_and_force_checkout_reaches_kas(real_kas: RealKas, alma) -> None:  # type: ignore[no-untyped-def]
    from imagebuild.test_build_real_kas import git

    root = real_kas.root
    code, out, err = alma("build")  # real kas clones and checks out the pins
    assert code == 0, out + err
    oe = root / "build" / "openembedded-core"
    pinned = git("rev-parse", "HEAD", cwd=oe)
    (oe / "meta" / "conf" / "layer.conf").write_text('BBFILE_COLLECTIONS += "core"\n# moved\n')
    git("commit", "-qam", "a local commit", cwd=oe)  # moved off the pin
    (oe / "meta" / "conf" / "layer.conf").write_text('BBFILE_COLLECTIONS += "core"\n# local change\n')  # dirty
    code, out, err = alma("build", "--dry-run")
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("repository openembedded-core:"))
    assert "dirty (1 file changed" in line and f"not the pinned {pinned[:12]}" in line and "--force-checkout" in line
    code, out, err = alma("build", "--force-checkout", "--json")
    assert code == 0, out + err
    kas_log = (root / "build" / NANO / "alma-build-latest.log").read_text()
    assert "--force-checkout" in kas_log and git("rev-parse", "HEAD", cwd=oe) == pinned
    assert "# local change" not in (oe / "meta" / "conf" / "layer.conf").read_text()  # kas discarded it
    code, out, _ = alma("build", "--dry-run")
    assert "repository openembedded-core:" not in out  # clean at its pin again


@pytest.mark.slow
def test_kas_premirrors_make_the_reachability_check_and_kas_work_offline(real_kas: RealKas, alma) -> None:  # type: ignore[no-untyped-def]
    remote = real_kas.remote_urls()
    real_kas.export()
    code, _, err = alma("build")
    assert code == 2 and f"repository bitbake ({remote}bitbake)" in err and "KAS_PREMIRRORS=" in err
    real_kas.export(KAS_PREMIRRORS=f"https://git\\.example\\.invalid/(.*) file://{real_kas.tmp / 'upstream'}/\\1")
    code, out, err = alma("build")
    assert code == 0, out + err  # the preflight asked the mirror, as kas then cloned from it
    assert [c["tool"] for c in read_record(real_kas.tmp / "record.jsonl")].count("bitbake") == 1


@pytest.mark.slow
def test_an_insteadof_rule_only_in_the_users_gitconfig_is_refused_with_gitconfig_file(real_kas: RealKas, alma) -> None:  # type: ignore[no-untyped-def]
    remote = real_kas.remote_urls()
    home = Path(os.environ["HOME"])  # the per-test HOME of the autouse fixture
    cfg = home / ".gitconfig"
    cfg.write_text(f'[url "file://{real_kas.tmp / "upstream"}/"]\n\tinsteadOf = {remote}\n')
    real_kas.export()
    # git as the user passes; kas's git (its own HOME) would not see the rule: refused up front
    code, _, err = alma("build")
    assert code == 2 and f"export GITCONFIG_FILE={cfg}" in err, err
    real_kas.export(GITCONFIG_FILE=str(cfg))
    code, out, err = alma("build")
    assert code == 0, out + err  # kas took the rule into its HOME, as the preflight did


def test_an_exported_kas_machine_alma_has_no_file_for_is_refused_naming_the_variable(project, alma, probes) -> None:  # type: ignore[no-untyped-def]
    probes(env={"KAS_MACHINE": "qemux86-64"})
    code, _, err = alma("build", "--dry-run")
    assert code == 2 and "KAS_MACHINE=qemux86-64 is exported, but ALMA-OS has no kas/machines/qemux86-64.yml" in err


def test_verify_finds_the_recorded_tmpdir_whatever_tmpdir_its_own_login_exports(tmp_path: Path) -> None:
    from alma.buildtree import TREE_RECORD, build_tree

    root = tmp_path / "alma"
    mdir = root / "build" / NANO
    mdir.mkdir(parents=True)
    bb = tmp_path / "big" / "tmp"  # the build's bitbake TMPDIR (a kas file's, say)
    (mdir / TREE_RECORD).write_text(json.dumps({"TMPDIR": str(bb)}))
    deploy = Path(f"{bb}-glibc") / "deploy" / "images" / NANO
    deploy.mkdir(parents=True)
    tree = build_tree(root, None, {"TMPDIR": str(tmp_path / "login")})  # libpam-tmpdir at verify time
    assert tree.deploy_dir(NANO) == deploy
    assert tree.deploy_dirs(NANO)[0] == Path(f"{tmp_path / 'login'}-glibc/deploy/images/{NANO}")
    if os.geteuid() == 0:  # a record another user wrote is not taken (a TMPDIR's parent may be shared)
        os.lchown(mdir / TREE_RECORD, 65534, 65534)
        assert build_tree(root, None, {}).deploy_dir(NANO) is None


def test_verify_ignores_a_tree_record_another_user_could_have_written(tmp_path: Path) -> None:
    """A record that is a link (to a record of ours elsewhere) or group/other-writable is not
    ours to trust, whoever owns the file it names: verify looks in the tree's own TMPDIRs."""
    from alma.buildtree import TREE_RECORD, build_tree, read_record

    root = tmp_path / "alma"
    mdir = root / "build" / NANO
    mdir.mkdir(parents=True)
    bb = tmp_path / "elsewhere" / "tmp"
    Path(f"{bb}-glibc/deploy/images/{NANO}").mkdir(parents=True)
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps({"TMPDIR": str(bb)}))
    ours.chmod(0o644)
    assert read_record(ours) == {"TMPDIR": str(bb)}
    record = mdir / TREE_RECORD
    record.symlink_to(ours)
    assert read_record(record) is None
    assert build_tree(root, None, {}).deploy_dir(NANO) is None
    record.unlink()
    record.write_text(ours.read_text())
    record.chmod(0o666)
    assert read_record(record) is None
    assert build_tree(root, None, {}).deploy_dir(NANO) is None
    record.chmod(0o644)
    assert build_tree(root, None, {}).deploy_dir(NANO) == Path(f"{bb}-glibc/deploy/images/{NANO}")


def test_an_exported_tmpdir_that_is_a_link_puts_glibc_beside_the_link_as_bitbake_does(tmp_path: Path) -> None:
    """bitbake appends -glibc to TMPDIR as written: a link's sibling, not its target's (another
    directory, maybe another disk), is what the disk check measures and the record names."""
    from alma.buildtree import build_tree

    (tmp_path / "big" / "tmp").mkdir(parents=True)
    link = tmp_path / "scratch"
    link.symlink_to(tmp_path / "big" / "tmp")
    tree = build_tree(tmp_path / "alma", None, {"TMPDIR": str(link)})
    assert tree.tmp_dir == str(link)
    assert tree.bitbake_tmpdir(NANO) == Path(f"{link}-glibc")


@pytest.mark.parametrize("written", ["{d}/", "{d}/./", "{d}//"])
def test_a_tmpdir_written_with_a_trailing_slash_gets_glibc_inside_it_as_bitbake_does(
    written: str, tmp_path: Path
) -> None:
    """oe-core's defaultsetup.conf appends to the text (``TMPDIR .= "${TCLIBCAPPEND}"``): a TMPDIR
    written ``/x/`` is ``/x/-glibc``, a directory inside /x, not ``/x-glibc`` beside it. Exported
    or set by a kas file, the plan, the disk check and verify must look where bitbake writes."""
    from alma.buildtree import build_tree
    from alma.imagebuild.plan import kas_tmpdir

    d = tmp_path / "scratch"
    value = written.format(d=d)
    inside = d / "-glibc"
    tree = build_tree(tmp_path / "alma", None, {"TMPDIR": value})
    assert tree.bitbake_tmpdir(NANO) == inside
    assert tree.deploy_dirs(NANO)[0] == inside / "deploy" / "images" / NANO

    class Kas:
        data = {"local_conf_header": {"tmp": f'TMPDIR = "{value}"\n'}}

    got, expr = kas_tmpdir(Kas(), tmp_path / "topdir")  # type: ignore[arg-type]
    assert expr is None and got is not None
    assert build_tree(tmp_path / "alma", None, {}, kas_tmpdir=got).bitbake_tmpdir(NANO) == inside


def test_verify_reads_the_record_of_a_tmpdir_reached_through_a_link(tmp_path: Path) -> None:
    """The record names TMPDIR as bitbake got it (through a linked home, say); the deploy dir
    verify is given resolves the link: the two are one place."""
    from alma.buildtree import TREE_RECORD, build_tree, recorded_env

    (tmp_path / "data").mkdir()
    (tmp_path / "home").symlink_to(tmp_path / "data")
    bb = tmp_path / "home" / "tmp"
    deploy = Path(f"{bb}-glibc/deploy/images/{NANO}")
    deploy.mkdir(parents=True)
    tree = build_tree(tmp_path / "alma", None, {"TMPDIR": str(bb)})
    tree.machine_dir(NANO).mkdir(parents=True)
    (tree.machine_dir(NANO) / TREE_RECORD).write_text(json.dumps({"TMPDIR": str(tree.tmp_dir), "DL_DIR": "/dl"}))
    found = recorded_env(deploy, build_tree(tmp_path / "alma", None, {}), NANO)
    assert found is not None and found[0]["DL_DIR"] == "/dl"
