"""A labgrid lab on loopback for tests/labgrid and bench/: the real labgrid-coordinator, the real
exporter (alma-labgrid-exporter) on a umockdev bus (tests/labgrid/lab_bus.py) and real
labgrid-client processes. Every process is started here, on free ports, with bounded waits
(polling, no fixed sleeps), and torn down in ``close``."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from support import require_tool
from support_flash import Station

BUS = Path(__file__).resolve().parent / "labgrid" / "lab_bus.py"
BIN = Path(sys.executable).parent
DEADLINE_S = 60.0  # generous: 8 test processes share 2 cores


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], Any], timeout: float = DEADLINE_S, every: float = 0.1) -> Any:
    end = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() >= end:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


class Lab:
    def __init__(self, base: Path) -> None:
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen[Any]] = []
        self.address = ""
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.bus: subprocess.Popen[str] | None = None
        self.exporter_pid: int | None = None
        self.power_fifo = base / "power.fifo"
        # the exporter's station (records are written here) and the client's checkout (facts)
        self.station = Station(base / "station")
        self.client = Station(base / "client")

    # -- processes -----------------------------------------------------------------
    def _log(self, name: str) -> Any:
        return open(self.base / f"{name}.log", "ab")

    def env(self, **extra: str) -> dict[str, str]:
        env = self.client.env(LG_COORDINATOR=self.address, **extra)
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        return env

    def start_coordinator(self) -> None:
        for _ in range(5):  # a free port can be taken between probe and bind: try another
            port = free_port()
            self.address = f"127.0.0.1:{port}"
            cdir = self.base / "coordinator"
            cdir.mkdir(exist_ok=True)
            self.coordinator = subprocess.Popen(
                [str(BIN / "labgrid-coordinator"), "--listen", self.address],
                cwd=cdir, stdout=self._log("coordinator"), stderr=subprocess.STDOUT, env=self.env(),
            )  # fmt: skip
            self.procs.append(self.coordinator)
            try:
                wait_for("the coordinator", self._coordinator_up, timeout=DEADLINE_S)
                return
            except AssertionError:
                if self.coordinator.poll() is None:
                    raise
        raise AssertionError("labgrid-coordinator did not start (see coordinator.log)")

    def _coordinator_up(self) -> bool:
        assert self.coordinator is not None
        if self.coordinator.poll() is not None:
            raise AssertionError(f"coordinator exited {self.coordinator.returncode}")
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", int(self.address.rsplit(":", 1)[1]))) == 0

    def start_exporter(self, name: str = "station-1", usb_path: str = "1-3", device: str = "apx-7523-orin-nano-8gb",
                       groups: tuple[str, ...] = ("bench-1",), **station_env: str) -> None:  # fmt: skip
        """The exporter on its umockdev bus; each of ``groups`` exports the same board (more than
        one: a misconfigured lab where two places reach one board)."""
        cfg = self.base / f"{name}.yaml"
        # same host: the client's bundles are shared with the exporter (used in place, not uploaded)
        board = {"usb_path": usb_path, "bundle_dirs": [str(self.client.base / "deploy")]}
        # a copy per group: YAML aliases would make labgrid's per-group edits land in all of them
        config = {g: {"location": "loopback", "AlmaRecoveryBoard": copy.deepcopy(board)} for g in groups}
        cfg.write_text(yaml.safe_dump(config))
        env = self.station.env(**station_env)
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        wrapper = require_tool("umockdev-wrapper")
        self.power_fifo = self.base / f"{name}.power"
        argv = [wrapper, sys.executable, str(BUS), device, str(self.power_fifo), "--",
                str(BIN / "alma-labgrid-exporter"), "--coordinator", self.address, "--name", name,
                "--hostname", "127.0.0.1", str(cfg)]  # fmt: skip
        self.bus = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log(name), text=True,
            env=env, cwd=self.base, start_new_session=True,
        )  # fmt: skip
        self.procs.append(self.bus)
        self.exporter_pid = int(self._bus_reply()["exporter"])
        for g in groups:
            wait_for(f"{name}'s board on the coordinator", lambda g=g: self.resource(name, avail=True, group=g))

    def _bus_reply(self) -> dict[str, Any]:
        assert self.bus is not None and self.bus.stdout is not None
        line = self.bus.stdout.readline()
        if not line:
            raise AssertionError(f"lab_bus exited {self.bus.poll()} (see the exporter log in {self.base})")
        return json.loads(line)  # type: ignore[no-any-return]

    def bus_command(self, cmd: str) -> dict[str, Any]:
        assert self.bus is not None and self.bus.stdin is not None
        self.bus.stdin.write(cmd + "\n")
        self.bus.stdin.flush()
        return self._bus_reply()

    def client_cmd(self, *args: str, timeout: float = DEADLINE_S, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "labgrid-client"), "-x", self.address, *args],
            capture_output=True, text=True, timeout=timeout, env=self.env(**env), cwd=self.base, check=False,
        )  # fmt: skip

    def client_popen(self, *args: str, **env: str) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [str(BIN / "labgrid-client"), "-x", self.address, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env(**env), cwd=self.base,
        )  # fmt: skip
        self.procs.append(p)
        return p

    def ok(self, *args: str, **env: str) -> str:
        r = self.client_cmd(*args, **env)
        assert r.returncode == 0, f"labgrid-client {' '.join(args)}: rc {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r.stdout

    # -- what the coordinator says ------------------------------------------------------
    def resource(self, exporter: str, *, avail: bool, group: str = "bench-1") -> bool:
        """Does the coordinator list ``exporter``'s board as (un)available?"""
        r = self.client_cmd("-vv", "resources")  # -vv: unavailable ones too
        name = f"{exporter}/{group}/NetworkAlmaRecoveryBoard"
        if r.returncode != 0 or name not in r.stdout:
            return False
        block = r.stdout.split(name, 1)[1].split("Exporter '", 1)[0].split("Group '", 1)[0]
        return ("'avail': True" in block) is avail

    def place(self, name: str = "jetson-1", exporter: str = "station-1", group: str = "bench-1") -> str:
        self.ok("-p", name, "create")
        self.ok("-p", name, "add-match", f"{exporter}/{group}/NetworkAlmaRecoveryBoard")
        return name

    def env_file(
        self, place: str, bundle: Path, strategy: dict[str, Any] | None = None, *, cabled: bool = True, **flasher: Any
    ) -> Path:
        """A labgrid env for the place: power by command, recovery line in a file, our drivers.

        With ``cabled``, power reaches the simulated board: off unplugs it from the bus, on with
        the recovery line held plugs it in (in recovery mode), on without it leaves it off the bus
        (a board booting its OS is no recovery-mode device)."""
        power_log = self.base / "power.log"
        line = self.base / "recovery-line"
        line.write_text("0\n")
        fifo = self.power_fifo if cabled else Path(os.devnull)
        on = f"echo on >> {power_log}; if [ \"$(cat {line})\" = 1 ]; then echo add > {fifo}; fi"
        off = f"echo off >> {power_log}; echo remove > {fifo}"
        env = {
            "imports": ["alma.labgrid"],
            "images": {"bundle": str(bundle)},
            "options": {"coordinator_address": self.address},
            "targets": {
                place: {
                    "resources": {"RemotePlace": {"name": place}},
                    "drivers": [
                        {"ExternalPowerDriver": {"cmd_on": shlex.join(["sh", "-c", on]),
                                                 "cmd_off": shlex.join(["sh", "-c", off])}},  # fmt: skip
                        {"FileDigitalOutputDriver": {"filepath": str(line)}},
                        {"AlmaRecoveryDriver": {"off_s": 0.0, "hold_s": 0.0}},
                        {"AlmaFlashDriver": flasher},
                        {"AlmaStrategy": strategy or {}},
                    ],
                }
            },
        }
        path = self.base / f"{place}.env.yaml"
        path.write_text(yaml.safe_dump(env))
        return path

    def close(self) -> None:
        if self.bus is not None and self.bus.poll() is None:
            with contextlib.suppress(OSError, ValueError, AssertionError):
                self.bus_command("quit")
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
            for stream in (p.stdin, p.stdout, p.stderr):
                if stream is not None:
                    stream.close()
        if self.bus is not None:  # the exporter and its flash service, if the bus left them behind
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.bus.pid, signal.SIGKILL)


def require_labgrid() -> None:
    if shutil.which("labgrid-coordinator", path=str(BIN)) is None:
        raise AssertionError("labgrid is not installed in this venv: pip install -e '.[test]' (it pins labgrid 26)")
