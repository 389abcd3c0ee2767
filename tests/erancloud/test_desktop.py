"""The worker on a volunteer's desktop: installed with pip into a fresh venv from the
repository, one round against a coordinator, uninstalled, and nothing left behind (no file,
no unit, no process). And ERAN-GRID's empty sensor set stays empty: traced with strace, the
worker opens no device and writes nothing outside its job directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from support import require_tool
from support_erancloud import ERANCLOUD, wait_for

pytestmark = pytest.mark.slow


def _tree(root: Path) -> set[tuple[str, int]]:
    return {(str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*")}


def _deps_dir(tmp: Path) -> Path:
    """numpy and nats-py (and setuptools, to build) as already installed for this test run:
    the test reaches no package index. Linked into one directory put on PYTHONPATH."""
    deps = tmp / "deps"
    deps.mkdir()
    for dist_name in ("numpy", "nats-py", "setuptools"):
        dist = metadata.distribution(dist_name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = Path(str(dist.locate_file(top)))
            if src.exists() and not (deps / top).exists() and top != "__pycache__":
                (deps / top).symlink_to(src)
    return deps


def _procs_running_from(path: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(path).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_pip_install_one_round_uninstall_leaves_nothing(nats_server, procs, tmp_path):
    venv, home = tmp_path / "fresh", tmp_path / "home"
    home.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    src = tmp_path / "src"
    shutil.copytree(ERANCLOUD, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(_deps_dir(tmp_path)),
           "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
    before = _tree(venv)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    res = subprocess.run([*pip, "install", "--no-index", "--no-build-isolation", str(src)],
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    record = next(venv.glob("lib/python3*/site-packages/eran_cloud-*.dist-info/RECORD")).read_text()
    assert not any(line.split(",")[0].endswith((".service", ".timer", ".socket")) for line in record.splitlines())

    procs.start("coord", "coordinator", "--nats", nats_server.url, "--rounds", "1", "--min-deltas", "1",
                "--status-file", str(tmp_path / "status.json"))  # fmt: skip
    wait_for((tmp_path / "status.json").exists, 180, "the coordinator")
    run = subprocess.run([str(venv / "bin" / "eran-cloud"), "client", "--nats", nats_server.url, "--worker-id",
                          "desk", "--rounds", "1"], env=env, capture_output=True, text=True, timeout=120,
                         cwd=home)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert '"rounds": 1' in run.stdout
    assert procs.wait("coord", 60) == 0

    res = subprocess.run([*pip, "uninstall", "-y", "eran-cloud"], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert _tree(venv) == before, sorted(_tree(venv) ^ before)[:20]
    assert list(home.iterdir()) == []  # no config, no cache, no ~/.config/systemd/user unit
    assert _procs_running_from(venv) == []


def test_worker_opens_no_device_and_writes_only_its_job_directory(nats_server, procs, tmp_path):
    strace = require_tool("strace")
    procs.start("coord", "coordinator", "--nats", nats_server.url, "--rounds", "2", "--min-deltas", "1",
                "--status-file", str(tmp_path / "status.json"))  # fmt: skip
    wait_for((tmp_path / "status.json").exists, 180, "the coordinator")
    job = tmp_path / "job"
    (job / "checkpoint").mkdir(parents=True)
    trace = tmp_path / "trace"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(job), "PYTHONPATH": str(ERANCLOUD), "PYTHONDONTWRITEBYTECODE": "1",
           "ERAN_GRID_CHECKPOINT_DIR": str(job / "checkpoint")}  # fmt: skip
    calls = "open,openat,creat,mkdir,mkdirat,rename,renameat,renameat2,unlink,unlinkat,truncate"
    res = subprocess.run([strace, "-f", "-qq", "-e", f"trace={calls}", "-o", str(trace), sys.executable, "-m",
                          "erancloud", "client", "--nats", nats_server.url, "--worker-id", "traced", "--rounds", "2"],
                         env=env, cwd=job, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in trace.read_text().splitlines() if '"' in ln and "ENOENT" not in ln]
    assert lines, "strace saw nothing"
    for ln in lines:
        path = ln.split('"')[1]
        if path.startswith("/dev/"):
            assert path in ("/dev/null", "/dev/urandom"), ln  # never a camera, microphone or input device
        if path.startswith("/sys/"):
            assert path.startswith("/sys/devices/system/cpu/"), ln  # numpy's BLAS counting CPUs
        writes = any(f in ln for f in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC")) or not ln.split()[1].startswith(
            ("open(", "openat(")
        )
        if writes:
            assert os.path.abspath(os.path.join(job, path)).startswith(str(job)), ln
