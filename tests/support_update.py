"""A simulated A/B Jetson for tests/update and bench/bench_update.py.

Real parts: OpenSSH's sshd on loopback per board (tests/support_fleet), the REAL SWUpdate
binary writing file-backed slots (``<root>/dev/disk/by-partlabel/APP`` and ``APP_b``), the
REAL ``alma-health`` reading the board's tree, our real ``alma-ota`` agent. Simulated
(NVIDIA's tools and a boot cannot run here): ``nvbootctrl`` replaying the R36 tool's
documented commands and ``dump-slots-info`` output, ``oe4t-set-uefi-OSIndications``,
``systemctl is-active``, ``reboot``, and the UEFI boot itself:

- the bootloader boots the active rootfs slot; an uncommitted slot costs one of its 3
  retries per boot; at 0 it is marked unbootable (RootfsStatusSlotX = 0xff) and the other
  slot boots; ``mark-boot-successful`` commits the running slot;
- an armed capsule (ESP/EFI/UpdateCapsule + OsIndications) is applied on the next boot:
  the bootloader switches to the chain paired with the active rootfs slot; a power loss
  during it leaves the old chain, and the rootfs follows its paired (old) slot;
- after every boot the agent's ``settle`` runs, as the image's alma-ota-settle.service does;
- a rootfs image says how it behaves: its first line is ``{"alma-sim": {...}}`` with
  ``version``, ``health`` (ok | critical | warning) and ``boots`` (false: it hangs, the
  watchdog resets, the retry count goes down).

The sim tools are this file run as a script: ``python3 support_update.py <tool> ARGS``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
AGENT = REPO / "tools" / "ota" / "alma-ota"
HEALTH = REPO / "tools" / "guard" / "alma-health"
SLOT_BYTES = 256 * 1024
MACHINE = "jetson-agx-orin-devkit"
BOOTLOADER = "36.4.3"
RETRIES = 3
# One SWUpdate at a time on this host: its sockets (/tmp, an abstract "NotifyServer") are
# host-wide; real boards each run their own.
INSTALL_LOCK = Path(tempfile.gettempdir()) / "alma-sim-swupdate.lock"


def rootfs_image(path: Path, version: str, *, health: str = "ok", boots: bool = True, size: int = 96 * 1024,
                 ota_cert: bytes | None = None) -> Path:  # fmt: skip
    """``ota_cert``: the image bakes in this OTA certificate (a rotation ships the next one)."""
    sim: dict[str, Any] = {"version": version, "health": health, "boots": boots}
    if ota_cert is not None:
        sim["ota_cert"] = ota_cert.decode()
    head = (json.dumps({"alma-sim": sim}) + "\n").encode()
    body = (head + os.urandom(size))[:size]
    path.write_bytes(body)
    return path


def make_swu(
    tmp: Path, signer: tuple[bytes, bytes], version: str = "1.1.0", machine: str = MACHINE, **img: object
) -> Path:
    """A signed ``.swu`` (meta-swupdate's cpio) carrying a :func:`rootfs_image` of ``version``."""
    from support_swu import build_swu

    rootfs = rootfs_image(tmp / f"rootfs-{version}.ext4", version, **img)  # type: ignore[arg-type]
    out = tmp / f"alma-{machine}-{version}.swu"
    build_swu(out, machine=machine, version=version, rootfs=rootfs, cert_pem=signer[0], key_pem=signer[1], root="")
    return out


def desktop_env(desk: Path) -> dict[str, str]:
    """One desktop: its own HOME and records dir (XDG_STATE_HOME) under ``desk``."""
    return {**os.environ, "HOME": str(desk / "home"), "XDG_STATE_HOME": str(desk / "state")}


def alma(desk: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """``alma ARGS`` from the desktop ``desk``; the timeout is a hang guard only (a loaded CI
    host makes one board's update take minutes)."""
    return subprocess.run(
        [sys.executable, "-m", "alma", *args], capture_output=True, text=True, env=desktop_env(desk),
        timeout=timeout, cwd=REPO,
    )  # fmt: skip


def records(desk: Path, swu: Path) -> dict[str, Any]:
    """The desktop's update records of ``swu``, by node."""
    from alma.update import records as R
    from alma.update.swu import read_swu

    d = R.campaign_dir(desk / "state" / "alma" / "update", read_swu(swu).sha256)
    return {p.stem: R.load(p) for p in d.glob("*.json")}


def make_cert(
    d: Path, cn: str = "ALMA-OS OTA test", *, days: float = 365, since_days: float = 1
) -> tuple[bytes, bytes]:
    """A self-signed signing certificate + key (PEM), as `alma` users make with openssl, valid
    from ``since_days`` ago for ``days`` (negative ``days - since_days``: already expired)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=since_days))
        .not_valid_after(now - datetime.timedelta(days=since_days) + datetime.timedelta(days=days))
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{cn.replace(' ', '_')}.pem").write_bytes(cert_pem)
    return cert_pem, key_pem


# ---- the board's UEFI / nvbootctrl state ------------------------------------------------------


def _state_path(root: Path) -> Path:
    return root / "sim" / "uefi.json"


def load_state(root: Path) -> dict[str, Any]:
    return json.loads(_state_path(root).read_text())


def save_state(root: Path, st: dict[str, Any]) -> None:
    p = _state_path(root)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(json.dumps(st, indent=1))
    tmp.replace(p)


def _letter(n: int) -> str:
    return "AB"[n]


def nvbootctrl(root: Path, argv: list[str]) -> int:
    """Replays nvbootctrl (L4T R36, T234) for the commands alma-ota uses."""
    target = "bootloader"
    if argv[:1] == ["-t"]:
        target, argv = argv[1], argv[2:]
    st = load_state(root)
    rf, bl = st["rootfs"], st["bootloader"]
    cmd = argv[0] if argv else ""
    if target == "rootfs":
        if cmd == "get-current-slot":
            print(rf["current"])
        elif cmd == "get-number-slots":
            print(2)
        elif cmd == "dump-slots-info":
            print(f"Current rootfs slot: {_letter(rf['current'])}")
            print(f"Active rootfs slot: {_letter(rf['active'])}")
            print("num_slots: 2")
            for i, s in enumerate(rf["slots"]):
                print(f"slot: {i},             retry_count: {s['retry_count']},             status: {s['status']}")
        elif cmd == "set-active-boot-slot":
            n = int(argv[1])
            rf["active"] = n
            rf["slots"][n].update(retry_count=RETRIES, status="normal")
            if n != rf["current"]:
                rf["successful"][n] = False
        elif cmd == "mark-boot-successful":
            cur = rf["current"]
            rf["successful"][cur] = True
            rf["slots"][cur].update(retry_count=RETRIES, status="normal")
        elif cmd == "set-slot-as-unbootable":
            rf["slots"][int(argv[1])]["status"] = "unbootable"
        else:
            print(f"nvbootctrl: unknown command {cmd}", file=sys.stderr)
            return 1
    else:
        if cmd == "dump-slots-info":
            print(f"Current version: {bl['version']}")
            print(f"Capsule update status: {bl['capsule_status']}")
            print(f"Current bootloader slot: {_letter(bl['current'])}")
            print(f"Active bootloader slot: {_letter(bl['active'])}")
            print("num_slots: 2")
            for i in range(2):
                print(f"slot: {i},             status: normal")
        elif cmd == "verify":
            bl["capsule_status"] = 0
        elif cmd == "get-current-slot":
            print(bl["current"])
        else:
            print(f"nvbootctrl: unknown command {cmd}", file=sys.stderr)
            return 1
    save_state(root, st)
    return 0


def sim_tool(name: str, argv: list[str]) -> int:
    root = Path(os.environ["ALMA_OTA_ROOT"])
    if name == "nvbootctrl":
        return nvbootctrl(root, argv)
    st = load_state(root)
    if name == "oe4t-set-uefi-OSIndications":
        st["os_indications"] = True
    elif name == "reboot":
        st["reboot_requested"] = True
    elif name == "systemctl":
        print("active" if st.get("guard", True) else "inactive")
        return 0 if st.get("guard", True) else 3
    elif name == "swupdate":
        if st.get("fault") == "power-loss-install":
            st["power_cut"] = True
            save_state(root, st)
            time.sleep(60)  # the power goes before SWUpdate finishes; the sim cuts us off
        argv_ = swupdate_argv(*argv)
        os.execv(argv_[0], argv_)
    save_state(root, st)
    return 0


def agent(b: SimBoard, *args: str, stdin: bytes | None = None) -> tuple[int, dict[str, Any]]:
    """One call of the board's agent, as root on the board: exit code and its JSON answer."""
    env = {**os.environ, "ALMA_OTA_ROOT": str(b.root), "PATH": f"{b.root / 'bin'}:{os.environ['PATH']}"}
    r = subprocess.run([sys.executable, str(AGENT), *args], input=stdin or b"", capture_output=True, env=env,
                       timeout=600)  # fmt: skip
    return r.returncode, json.loads(r.stdout.decode().strip().splitlines()[-1])


# ---- one board --------------------------------------------------------------------------------


class SimBoard:
    def __init__(
        self,
        base: Path,
        name: str,
        cert_pem: bytes,
        *,
        version: str = "1.0.0",
        machine: str = MACHINE,
        down_s: float = 0.3,
        hang_s: float = 0.5,
    ) -> None:
        self.name, self.root, self.down_s, self.hang_s = name, base / name, down_s, hang_s
        self.sshd: Any = None
        self.dead = False
        r = self.root
        for d in ("dev/disk/by-partlabel", "etc/alma", "sim", "bin", "data/alma-ota", "var/lib/alma-ota/capsule"):
            (r / d).mkdir(parents=True, exist_ok=True)
        for label in ("APP", "APP_b"):
            (r / "dev/disk/by-partlabel" / label).write_bytes(b"\0" * SLOT_BYTES)
        img = rootfs_image(base / f".{name}-factory.img", version, ota_cert=cert_pem)
        with (r / "dev/disk/by-partlabel/APP").open("r+b") as f:
            f.write(img.read_bytes())
        (r / "etc/alma/ota-cert.pem").write_bytes(cert_pem)
        (r / "etc/alma/ota.json").write_text(
            json.dumps(
                {
                    "machine": machine,
                    "hw_revision": "1.0",
                    "cert": "/etc/alma/ota-cert.pem",
                    "state_dir": "/data/alma-ota",
                    "lowest_bootloader": "36.4.0",
                    "install_lock": str(INSTALL_LOCK),
                }
            )
        )
        save_state(
            r,
            {
                "rootfs": {
                    "current": 0,
                    "active": 0,
                    "successful": [True, False],
                    "slots": [
                        {"retry_count": RETRIES, "status": "normal"},
                        {"retry_count": RETRIES, "status": "normal"},
                    ],
                },
                "bootloader": {"current": 0, "active": 0, "version": BOOTLOADER, "capsule_status": 0},
                "os_indications": False,
                "reboot_requested": False,
                "guard": True,
                "boots": 0,
            },
        )
        for tool in ("nvbootctrl", "oe4t-set-uefi-OSIndications", "reboot", "systemctl", "swupdate"):
            p = r / "bin" / tool
            p.write_text(f'#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} {tool} "$@"\n')
            p.chmod(0o755)
        (r / "bin/alma-ota").symlink_to(AGENT)
        # the board's own health report, read from this tree (the agent judges a hawkBit install with it)
        (r / "bin/alma-health").write_text(f'#!/bin/sh\nexec {sys.executable} {HEALTH} "$@"\n')
        (r / "bin/alma-health").chmod(0o755)
        self._health_tree()
        self._running(load_state(r))

    # ---- what runs after a boot ------------------------------------------------------------

    def _health_tree(self) -> None:
        from support_guard import FakeBoard, orin_zones

        b = FakeBoard(self.root)
        orin_zones(b, 50.0)
        b.set_meminfo(total_kb=32_000_000, avail_kb=20_000_000)
        b.set_psi(0.0, 0.0)
        b.add_watchdog()
        b.write_guard_state(shedding=False)
        b.write_config("health.toml", "[disk]\nwarn_pct = 0.0\ncrit_pct = 0.0\n")
        self.fake = b

    def slot_image(self, n: int) -> dict[str, Any] | None:
        dev = self.root / "dev/disk/by-partlabel" / ("APP", "APP_b")[n]
        first = dev.read_bytes()[:4096].split(b"\n", 1)[0]
        try:
            return json.loads(first)["alma-sim"]  # type: ignore[no-any-return]
        except (ValueError, KeyError, TypeError):
            return None  # a torn or foreign image: does not boot

    def _running(self, st: dict[str, Any]) -> None:
        img = self.slot_image(st["rootfs"]["current"]) or {}
        (self.root / "etc/alma-release").write_text(f'ID=alma\nVERSION_ID="{img.get("version", "?")}"\n')
        if isinstance(img.get("ota_cert"), str):  # the running rootfs's certificate is the one SWUpdate trusts
            (self.root / "etc/alma/ota-cert.pem").write_text(img["ota_cert"])
        self.fake.set_boot_id(str(uuid.uuid4()))
        # "sick": this board's hardware makes the new slot fail health (the others pass it)
        sick = st.get("sick") and st["rootfs"]["current"] == 1
        self.fake.set_all_temps(106.0 if img.get("health") == "critical" or sick else 50.0)
        self.fake.write_guard_state(shedding=False)

    # ---- the bootloader ---------------------------------------------------------------------

    def boot(self) -> bool:
        """One power-on: pick the slot the way UEFI + nvbootctrl do; True when it came up."""
        st = load_state(self.root)
        rf, bl = st["rootfs"], st["bootloader"]
        st["reboot_requested"] = False
        st["boots"] += 1
        esp = self.root / "boot/efi/EFI/UpdateCapsule/TEGRA_BL.Cap"
        if st.get("os_indications") and esp.exists():
            st["os_indications"] = False
            if st.get("fault") == "power-loss-capsule":
                bl["capsule_status"] = 3  # failed: the inactive chain is half-written
                rf["active"] = bl["current"]  # the rootfs follows its paired slot
                st.pop("fault")
            else:
                bl["version"] = esp.read_text().split()[-1]
                bl["current"] = bl["active"] = rf["active"]
                bl["capsule_status"] = 1
            esp.unlink()
        target = rf["active"]
        for _ in range(2 * (RETRIES + 1)):
            slot = rf["slots"][target]
            if slot["status"] == "unbootable":
                target = 1 - target
                rf["active"] = target
                continue
            if not rf["successful"][target]:
                if slot["retry_count"] == 0:
                    slot["status"] = "unbootable"  # RootfsStatusSlotX = 0xff
                    target = 1 - target
                    rf["active"] = target
                    continue
                slot["retry_count"] -= 1
            img = self.slot_image(target)
            if img is None or not img.get("boots", True):
                time.sleep(self.hang_s)  # hangs; the watchdog resets it
                continue
            rf["current"] = target
            save_state(self.root, st)
            self._running(st)
            return True
        save_state(self.root, st)
        return False

    # ---- power, sshd, supervisor -------------------------------------------------------------

    def start(self, ssh_base: Path) -> None:
        from support_fleet import start_sshd

        env = f"SetEnv ALMA_OTA_ROOT={self.root} PATH={self.root / 'bin'}:/usr/local/bin:/usr/bin:/bin\n"
        self.sshd = start_sshd(ssh_base / self.name, extra=env)

    def power_off(self) -> None:
        if self.sshd is None:
            return
        kill_tree(self.sshd.proc.pid)
        self.sshd.proc.wait()

    def power_on(self) -> None:
        from support_fleet import launch_sshd

        if self.dead:  # stays off: nothing will reboot it until someone powers it on
            self.set(reboot_requested=False, power_cut=False)
            return
        if self.boot():
            self.settle()
            if self.sshd is None:  # a board driven without ssh (tests of the agent alone)
                return
            for attempt in range(3):  # a loaded CI host can be slow to bring sshd up
                try:
                    self.sshd.proc = launch_sshd(self.sshd.dir, self.sshd.port)
                    return
                except RuntimeError:
                    if attempt == 2:
                        raise

    def settle(self) -> None:
        """What the image's alma-ota-settle.service does at every boot: the agent finishes
        what no desktop will (a fallback, a rollback, an expired lease)."""
        env = {**os.environ, "ALMA_OTA_ROOT": str(self.root), "PATH": f"{self.root / 'bin'}:{os.environ['PATH']}"}
        subprocess.run([sys.executable, str(AGENT), "settle"], env=env, capture_output=True, timeout=600, check=False)

    def reboot(self) -> None:
        self.power_off()
        time.sleep(self.down_s)
        self.power_on()

    def refresh_guard(self) -> None:
        """What a running alma-guard does: keep its state file fresh (alma-health: stale after 30 s)."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        state = {"schema": "alma.guard-state/1", "updated": stamp, "shedding": False, "since": stamp,
                 "reason": "normal", "zones": {"tj-thermal": 50.0}, "unreadable": []}  # fmt: skip
        path = self.root / "run/alma-guard/state.json"
        tmp = path.with_name(f".state.{threading.get_ident()}")
        tmp.write_text(json.dumps(state))
        tmp.replace(path)  # atomic: alma-health never reads half a file

    def set(self, **kw: Any) -> None:
        st = load_state(self.root)
        st.update(kw)
        save_state(self.root, st)

    def poll(self) -> None:
        st = load_state(self.root)
        if st.get("reboot_requested") or st.get("power_cut"):
            if st.get("power_cut"):
                st["power_cut"] = False
                st.pop("fault", None)
                save_state(self.root, st)
            time.sleep(0.05)  # let the reboot command's answer leave
            self.reboot()


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every descendant (a power cut: the board's sessions die with it)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += children.get(p, [])
    for p in seen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


class Lab:
    """N simulated boards, a fleet file pinning their host keys, and the supervisor thread."""

    def __init__(self, base: Path, cert_pem: bytes, names: list[str], **kw: Any) -> None:
        self.base = base
        self.ctl = Path(tempfile.mkdtemp(prefix="alma-ctl-"))  # ssh's ControlPath must stay < 108 bytes
        self.boards = {n: SimBoard(base / "boards", n, cert_pem, **kw) for n in names}
        for b in self.boards.values():
            b.start(base / "ssh")
        self._stop = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._supervise, daemon=True)
        self._thread.start()
        self.fleet = self._fleet_file()

    def _supervise(self) -> None:
        last_guard = 0.0
        while not self._stop.is_set():
            if time.monotonic() - last_guard > 1.0:
                last_guard = time.monotonic()
                for b in self.boards.values():
                    if b.sshd is not None and b.sshd.proc.poll() is None:
                        with contextlib.suppress(OSError):
                            b.refresh_guard()
            for b in self.boards.values():
                try:
                    b.poll()
                except Exception as exc:  # the supervisor must outlive one board's failure
                    self.errors.append(f"{b.name}: {exc!r}")
            time.sleep(0.05)

    def _fleet_file(self) -> Path:
        import getpass

        cfg = self.base / "ssh_config"
        lines, nodes = [], []
        for b in self.boards.values():
            s = b.sshd
            lines.append(
                f"Host {b.name}\n    HostName 127.0.0.1\n    Port {s.port}\n    User {getpass.getuser()}\n"
                f"    IdentityFile {s.dir / 'id_ed25519'}\n    IdentitiesOnly yes\n"
            )
            key = " ".join((s.dir / "host_ed25519.pub").read_text().split()[:2])
            nodes.append(f'[[node]]\nname = "{b.name}"\nssh = "{b.name}"\nrole = "board"\nhost_key = "{key}"\n')
        cfg.write_text("".join(lines))
        fleet = self.base / "fleet.toml"
        fleet.write_text(
            f'[ssh]\nconfig = "{cfg}"\nconnect_timeout = 5\ncontrol_persist = 20\ncontrol_dir = "{self.ctl}"\n'
            f'[health]\ntimeout = 30\ncommand = "python3 {HEALTH} --root \\"$ALMA_OTA_ROOT\\" --json --no-save"\n\n'
            + "\n".join(nodes)
        )
        return fleet

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for b in self.boards.values():
            if b.sshd is not None and b.sshd.proc.poll() is None:
                kill_tree(b.sshd.proc.pid)
                b.sshd.proc.wait()
        shutil.rmtree(self.ctl, ignore_errors=True)


def swupdate_argv(*args: str) -> list[str]:
    """The real SWUpdate's command line, in a network namespace of its own when we are root.
    SWUpdate 2022.12 talks to itself over the abstract unix socket "NotifyServer": two runs at
    once (tests in parallel) found each other's, and one blocked for ever in sendto to the
    other. Abstract sockets belong to a network namespace: one each, as each board has."""
    real = shutil.which("swupdate", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    exe = real or "/usr/bin/swupdate"
    unshare = shutil.which("unshare", path="/usr/bin:/bin")
    if os.geteuid() == 0 and unshare:
        return [unshare, "--net", "--", exe, *args]
    return [exe, *args]


def require_swupdate() -> str:
    exe = shutil.which("swupdate")
    if exe is None:
        import pytest

        pytest.skip("swupdate not installed (Debian: swupdate; .ci/run installs it)")
    return exe


if __name__ == "__main__":
    sys.exit(sim_tool(sys.argv[1], sys.argv[2:]))
