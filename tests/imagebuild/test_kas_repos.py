"""`alma checkout` and `alma lock [--update]` through the REAL kas 5.5 on local git repositories
(offline: the kas files name an unreachable https host, KAS_PREMIRRORS points kas at the local
repositories, as on a host with mirrors and no network)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from imagebuild.test_build_real_kas import git, real_kas_project  # noqa: F401 (a fixture)
from imagebuild.test_kas_env import RealKas
from support_build import read_record

from alma.imagebuild import preflight as pf

NANO = "jetson-orin-nano-devkit"


def _offline(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probes) -> str:  # type: ignore[no-untyped-def]
    kas = RealKas(root, tmp_path, monkeypatch, probes)
    remote = kas.remote_urls()
    kas.export(KAS_PREMIRRORS=f"https://git\\.example\\.invalid/(.*) file://{tmp_path / 'upstream'}/\\1")
    return remote


@pytest.fixture
def offline(real_kas_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probes) -> Path:  # type: ignore[no-untyped-def]  # noqa: F811
    """The real-kas project whose repositories only a premirror reaches; returns its root."""
    _offline(real_kas_project, tmp_path, monkeypatch, probes)
    return real_kas_project


def _lock_pins(root: Path) -> dict[str, str]:
    data = yaml.safe_load((root / "kas" / "alma.lock.yml").read_text())
    return {k: v["commit"] for k, v in data["overrides"]["repos"].items()}


@pytest.mark.slow
def test_alma_checkout_checks_out_the_pins_offline_through_premirrors_and_builds_nothing(
    offline: Path, tmp_path: Path, alma
) -> None:
    root = offline
    code, out, err = alma("checkout", "--json")
    assert code == 0, out + err
    got = {r["repo"]: r for r in json.loads(out)["repos"]}
    pins = _lock_pins(root)
    assert got["bitbake"]["head"] == pins["bitbake"] == git("rev-parse", "HEAD", cwd=root / "build" / "bitbake")
    oe_head = git("rev-parse", "HEAD", cwd=root / "build" / "openembedded-core")
    assert got["openembedded-core"]["head"] == got["openembedded-core"]["pinned"] == oe_head
    assert "Cloning repository bitbake" in err  # kas's progress, passed on
    assert not (tmp_path / "record.jsonl").exists() or all(
        c["tool"] != "bitbake" for c in read_record(tmp_path / "record.jsonl")
    )
    # the human form names each repository at its commit
    code, out, err = alma("checkout")
    assert code == 0 and f"bitbake: {pins['bitbake'][:12]}  build/bitbake" in out, out + err


@pytest.mark.slow
def test_alma_checkout_without_the_premirror_is_refused_before_kas_with_the_fix(
    real_kas_project: Path,  # noqa: F811
    tmp_path: Path,
    alma,
    monkeypatch,
    probes,
) -> None:
    remote = _offline(real_kas_project, tmp_path, monkeypatch, probes)
    monkeypatch.delenv("KAS_PREMIRRORS")
    probes(ls_remote=pf._ls_remote, env=dict(os.environ))
    code, _, err = alma("checkout")
    assert code == 2 and f"repository bitbake ({remote}bitbake)" in err and "export KAS_PREMIRRORS=" in err, err
    assert not (real_kas_project / "build" / "bitbake").exists()


@pytest.mark.slow
def test_alma_lock_keeps_good_locks_and_update_moves_them_to_the_branch_head(
    offline: Path, tmp_path: Path, alma
) -> None:
    root = offline
    lock = root / "kas" / "alma.lock.yml"
    old = _lock_pins(root)["bitbake"]
    up = tmp_path / "upstream" / "bitbake"
    (up / "README").write_text("next\n")
    git("add", "-A", cwd=up)
    git("commit", "-qm", "next", cwd=up)
    new = git("rev-parse", "HEAD", cwd=up)
    before = lock.read_bytes()
    code, out, err = alma("lock")
    assert code == 0, out + err
    assert lock.read_bytes() == before and "no lock file changed" in out  # kas keeps a lock that holds
    code, out, err = alma("lock", "--update", "--json")
    assert code == 0, out + err
    res = json.loads(out)
    bb = next(r for r in res["repos"] if r["repo"] == "bitbake")
    assert (bb["before"], bb["pinned"], bb["changed"]) == (old, new, True)
    assert res["lock_files_written"] == [str(lock)] and _lock_pins(root) == {"bitbake": new}
    oe = next(r for r in res["repos"] if r["repo"] == "openembedded-core")
    assert oe["changed"] is False  # pinned by commit: in the kas file itself, not a lock's to move
    # alma build now plans the new pin
    code, out, err = alma("dump", "--lock", "--json")
    assert json.loads(out)["overrides"]["repos"]["bitbake"] == {"commit": new}


@pytest.mark.slow
def test_alma_lock_writes_the_lock_file_next_to_the_first_kas_file_for_a_floating_repository(
    offline: Path, tmp_path: Path, alma
) -> None:
    root = offline
    (root / "kas" / "alma.lock.yml").unlink()
    code, _, err = alma("build", "--dry-run")
    assert code == 2 and "not pinned" in err and "alma lock" in err  # the fix names the verb that exists
    code, out, err = alma("lock")
    assert code == 0, out + err
    assert _lock_pins(root) == {"bitbake": git("rev-parse", "HEAD", cwd=tmp_path / "upstream" / "bitbake")}
    assert "bitbake: (none) -> " in out and "written: kas/alma.lock.yml" in out
    code, _, err = alma("build", "--dry-run")
    assert code == 0, err


@pytest.mark.slow
def test_a_kas_failure_is_exit_1_with_kas_own_words_and_a_next_step(offline: Path, tmp_path: Path, alma) -> None:
    git("branch", "-m", "main", "trunk", cwd=tmp_path / "upstream" / "bitbake")  # the kas file's branch is gone
    code, out, err = alma("lock", "--update")
    assert code == 1, out + err
    assert (
        "kas lock failed (kas exited with code" in err
        and "bitbake" in err
        and "alma build --dry-run lists each repository" in err
    )


@pytest.mark.slow
def test_alma_dump_and_its_lock_are_what_real_kas_dump_prints(offline: Path, tmp_path: Path, alma) -> None:
    import subprocess
    import sys

    root = offline
    kas = Path(sys.executable).parent / "kas"
    env = {**os.environ, "KAS_WORK_DIR": str(root / "build"), "KAS_BUILD_DIR": str(root / "build" / NANO)}
    (root / "build" / NANO).mkdir(parents=True)
    chain = f"kas/alma.yml:kas/machines/{NANO}.yml"
    for extra in ([], ["--lock"]):
        res = subprocess.run([str(kas), "dump", *extra, chain], cwd=root, env=env, capture_output=True, text=True,
                             timeout=600)  # fmt: skip
        assert res.returncode == 0, res.stderr
        code, out, err = alma("dump", *extra)
        assert code == 0, err
        assert yaml.safe_load(out) == yaml.safe_load(res.stdout), extra


@pytest.mark.slow
def test_the_build_rows_of_the_table_reach_bitbake_through_real_kas(offline: Path, tmp_path: Path, alma) -> None:
    """docs/build.md "For kas users": repeated and virtual targets, a task, -k, extra kas files
    and arguments after `--`, as real kas hands them to bitbake."""
    root = offline
    (root / "kas" / "extra.yml").write_text('header:\n  version: 14\nlocal_conf_header:\n  zz: |\n    EXTRA = "1"\n')
    targets = ["--target", "core-image-minimal", "--target", "virtual/kernel"]
    code, out, err = alma("build", "--kas-file", "kas/extra.yml", *targets, "--task", "fetch", "-k", "--", "-DD")
    assert code == 0, out + err
    [bb] = [c for c in read_record(tmp_path / "record.jsonl") if c["tool"] == "bitbake" and "argv" in c]
    conf = root / "build" / NANO / "alma-build.conf"
    assert bb["argv"] == ["-R", str(conf), "-k", "-c", "fetch", "core-image-minimal", "virtual/kernel", "-DD"]
    assert 'EXTRA = "1"' in (root / "build" / NANO / "conf" / "local.conf").read_text()  # kas merged the extra file


@pytest.mark.parametrize("verb", ["checkout", "lock"])
def test_checkout_and_lock_take_kas_machine_as_alma_build_does(project, alma, probes, verb: str) -> None:  # type: ignore[no-untyped-def]
    """The exported KAS_MACHINE is judged once for every verb: named when ALMA-OS has no file
    for it, refused when --machine asks for another."""
    probes(env={"KAS_MACHINE": "qemux86-64"})
    code, _, err = alma(verb)
    assert code == 2 and "KAS_MACHINE=qemux86-64 is exported, but ALMA-OS has no kas/machines/qemux86-64.yml" in err
    probes(env={"KAS_MACHINE": NANO})
    code, _, err = alma(verb, "--machine", "jetson-agx-orin-devkit")
    assert code == 2 and f"KAS_MACHINE={NANO} is exported but --machine is jetson-agx-orin-devkit" in err
