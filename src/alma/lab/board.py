"""A lab of virtual boards: the on-board userland (tools/board-layout.toml) over this host's
own tree, booted with ``systemd-nspawn -b`` under real systemd (docs/lab.md).

One lab is one directory (``--dir``, default /run/alma-lab)::

    id_ed25519, known_hosts, ssh_config   the admin key and the boards' pinned host keys
    id_flash                              the flash-time extra admin key (board.conf ADMIN_KEY)
    ota-cert.pem, ota-key.pem             the lab's OTA signing pair (the boards' baked-in certificate)
    <board>/disk/{upper,work}             a tmpfs: the board's own disk (the overlay's upper layer)
    <board>/root                          overlayfs: lower = /, upper = disk/upper
    <board>/machine/thermal, slot/        the fake machine (alma.lab.machine), outside the board
    <board>/machine/disk/APP, APP_b       the rootfs slots (the board's /dev/disk/by-partlabel/)
    <board>/machine/identity/             each slot's identity files (its /etc's hostname, host key...)
    <board>/board.json                    name, ssh port, supervisor pid
    <board>/console.log                   the container's console (every boot)

Each board has a supervisor (alma.lab.supervise) that boots the container again after a
reboot or a power cut; the network is the host's (no namespace or link is created): each
board's sshd listens on 127.0.0.1 at its own port, keys only, as the image's drop-in says.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from alma import runner
from alma.errors import ToolError, UserError
from alma.lab import layout as board_layout
from alma.lab import machine, supervise

DEFAULT_DIR = Path("/run/alma-lab")
ADMIN = "alma"
BOOT_TIMEOUT_S = 240.0
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
# The container's PATH (nsenter keeps the caller's environment otherwise).
BOARD_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# The host's own services (its tree is the board's lower layer) are not the board's: every
# unit the host enabled is masked except sshd.
KEEP_HOST_UNITS = {"ssh.service"}
# Units the lower layer starts on every boot that the image never runs, masked too. The image
# is built without PAM (no "pam" in the distro's DISTRO_FEATURES), so no login starts a
# per-user manager there; Debian's PAM (pam_systemd) starts user@UID.service at the admin's
# first login after each boot: a second systemd in the board, in the path of every
# post-reboot call (and the stop a reboot waited on, docs/lab.md).
LOWER_LAYER_MASKS = {"user@.service"}
OTA_CERT, OTA_KEY = "ota-cert.pem", "ota-key.pem"
# The boards share the host's network namespace, and SWUpdate 2022.12 talks to itself over the
# abstract unix socket "NotifyServer", which belongs to the network namespace: two boards
# installing at once would meet on it (one blocks for ever). A board has a namespace of its
# own; here SWUpdate gets one (first on sudo's secure_path and the units' PATH).
SWUPDATE_WRAPPER = """#!/bin/sh
# alma lab: SWUpdate in a network namespace of its own, as on a board (docs/lab.md)
exec /usr/bin/unshare --net -- /usr/bin/swupdate "$@"
"""


def _namespace_init(pid: int) -> bool:
    """Whether ``pid`` is PID 1 of a pid namespace below the host's (NSpid ends in 1)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                ids = line.split()[1:]
                return len(ids) > 1 and ids[-1] == "1"
    return False


def require_root() -> None:
    if os.geteuid() != 0:
        raise UserError(
            "alma lab needs root (it mounts the boards' disks and boots them with systemd-nspawn)",
            hint="run it as root: sudo alma lab ...",
        )
    for tool in ("systemd-nspawn", "nsenter", "useradd", "ssh-keygen", "ssh"):
        if shutil.which(tool) is None:
            raise UserError(
                f"{tool} is not installed",
                hint="apt-get install systemd-container openssh-server openssh-client passwd util-linux",
            )


# The board binds its ssh port only when it boots, after this picked it. A port from the
# kernel's ephemeral range (what bind(0) hands out) can meanwhile become the local port of
# any outgoing connection on the host (the lab's own ssh, another test's client): then the
# board's sshd.socket fails with EADDRINUSE and, a socket unit having no restart, nothing
# ever listens. Ports below that range are never handed out implicitly.
LOW_PORT = 20000


def _ephemeral_ports() -> range:
    try:
        lo, hi = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999  # Linux's default
    return range(lo, hi + 1)


def _free_port() -> int:
    """A free port outside the ephemeral range (LOW_PORT's comment), picked at random so that
    boards made at once by parallel labs do not try the same ones in turn."""
    ephemeral = _ephemeral_ports()
    lowest = LOW_PORT if ephemeral.start > LOW_PORT + 1000 else 1024
    candidates = [p for p in range(lowest, 65536) if p not in ephemeral]
    for port in random.sample(candidates, min(200, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    span = f"{ephemeral.start}-{ephemeral.stop - 1}"
    raise ToolError(f"no free port for a board's sshd outside the ephemeral ports ({span})")


@dataclass
class Board:
    lab: Path
    name: str
    not_ready: str = field(default="", repr=False, compare=False)  # why the last ready() said no

    @property
    def dir(self) -> Path:
        return self.lab / self.name

    @property
    def disk(self) -> Path:
        return self.dir / "disk"

    @property
    def upper(self) -> Path:
        return self.disk / "upper"

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def thermal(self) -> Path:
        return self.dir / "machine" / "thermal"

    @property
    def slot_dir(self) -> Path:
        return self.dir / "machine" / "slot"

    @property
    def identity_dir(self) -> Path:
        """Each rootfs slot's identity files (alma.lab.machine.switch_identity)."""
        return self.dir / "machine" / "identity"

    @property
    def disk_dir(self) -> Path:
        """The rootfs slot files (``APP``, ``APP_b``)."""
        return self.dir / "machine" / "disk"

    def info(self) -> dict[str, object]:
        try:
            data: dict[str, object] = json.loads((self.dir / "board.json").read_text())
        except (OSError, ValueError):
            raise UserError(f"no board {self.name!r} in {self.lab}", hint="alma lab status") from None
        return data

    @property
    def port(self) -> int:
        return int(str(self.info()["port"]))

    # ---- processes --------------------------------------------------------------------------

    def _pid(self, what: str) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.dir / f"{what}.pid").read_text())
            os.kill(pid, 0)
            return pid
        return None

    def supervisor(self) -> int | None:
        return self._pid("supervisor")

    def init_pid(self) -> int | None:
        """The container's PID 1, as a host pid: the descendant of systemd-nspawn that is PID 1
        of its own pid namespace. Not merely nspawn's first child: while the container starts,
        that is nspawn's outer child (in the host's namespace), and a power cut or an nsenter
        aimed at it would miss the board."""
        nspawn = self._pid("nspawn")
        if nspawn is None:
            return None
        level = [nspawn]
        for _ in range(3):  # nspawn -> outer child -> PID 1, until the outer child exits
            below: list[int] = []
            for pid in level:
                with contextlib.suppress(OSError, ValueError):
                    below += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
            for pid in below:
                if _namespace_init(pid):
                    return pid
            level = below
        return None

    def boots(self) -> int:
        return int(machine.slots(self.slot_dir)["boots"])

    def exec(self, argv: list[str], *, timeout: float = 60.0, check: bool = True) -> runner.Result:
        """Run ``argv`` inside the board (all its namespaces, as root), output kept."""
        pid = self.init_pid()
        if pid is None:
            raise UserError(f"board {self.name} is not running", hint=f"alma lab reboot {self.name}")
        return runner.capture(["nsenter", "-t", str(pid), "-a", *argv], env=BOARD_ENV, timeout=timeout, check=check)

    def ssh_argv(self, command: list[str] | None = None) -> list[str]:
        return ["ssh", "-F", str(self.lab / "ssh_config"), self.name, *(command or [])]

    def ready(self) -> bool:
        """systemd reached its target (running or degraded) and sshd lets the admin in. What
        stood in the way is kept in ``not_ready`` for the error a boot that never gets there raises."""
        self.not_ready = "no init process"
        if self.init_pid() is None:
            return False
        try:
            state = self.exec(["systemctl", "is-system-running"], timeout=30, check=False)
        except (ToolError, UserError) as exc:
            self.not_ready = f"systemctl is-system-running: {exc}"
            return False
        said = state.lines[-1].strip() if state.lines else "(nothing)"
        if said not in ("running", "degraded"):
            self.not_ready = f"systemd is {said}"  # its jobs are asked once, if it never gets there
            return False
        probe = runner.capture(self.ssh_argv(["-o", "BatchMode=yes", "true"]), timeout=30, check=False)
        said = " ".join(ln.strip() for ln in probe.lines[-3:])[-300:]
        self.not_ready = f"the admin's ssh login: exit {probe.returncode} {said}".strip()
        return probe.ok

    def wait_ready(self, timeout: float = BOOT_TIMEOUT_S, after_boot: int = 0) -> float:
        """Wait until the boot after ``after_boot`` is ready; returns its boot-to-ready seconds
        (from the power-on the supervisor recorded, CLOCK_MONOTONIC is system-wide)."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.supervisor() is None:
                raise UserError(
                    f"board {self.name} stopped while booting",
                    hint=f"read {self.dir / 'supervisor.log'} and {self.dir / 'console.log'}",
                )
            if self.boots() > after_boot and self.ready():
                with contextlib.suppress(OSError, ValueError):
                    return time.monotonic() - float((self.dir / "powered-on").read_text())
                return time.monotonic() - start
            time.sleep(0.2)
        if self.not_ready.startswith("systemd is "):  # what its boot still waits on
            with contextlib.suppress(ToolError, UserError):
                jobs = self.exec(["systemctl", "list-jobs", "--no-legend"], timeout=30, check=False)
                self.not_ready += f"; jobs: {'; '.join(ln.strip() for ln in jobs.lines[:5]) or 'none'}"
        raise UserError(
            f"board {self.name} was not ready after {timeout:.0f} s (last seen: {self.not_ready or '?'})",
            hint=f"read {self.dir / 'console.log'}",
        )

    # ---- power ------------------------------------------------------------------------------

    def reboot(self, power_cut: bool = False, timeout: float = BOOT_TIMEOUT_S) -> float:
        before = self.boots()
        pid = self.init_pid()
        if pid is None:
            raise UserError(f"board {self.name} is not running", hint="alma lab up")
        if power_cut:
            os.kill(pid, signal.SIGKILL)  # PID 1 of the namespace: every process of the board dies at once
        else:
            self.exec(["systemctl", "reboot"], check=False)
        return self.wait_ready(timeout, after_boot=before)

    def heat(self, zone: str, celsius: float) -> Path:
        return machine.set_temp(self.thermal, zone, celsius)

    def stop(self, timeout: float = 90.0) -> None:
        """Power off cleanly (halt), else kill; unmount the board's disk and root."""
        (self.dir / "stop").touch()
        nspawn = self._pid("nspawn")
        if nspawn is not None:
            os.kill(nspawn, signal.SIGTERM)  # nspawn halts the container (systemd's poweroff)
        deadline = time.monotonic() + timeout
        while self.supervisor() is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        pid = self.init_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        sup = self.supervisor()
        if sup is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(sup, signal.SIGKILL)
        while not supervise.remove_cgroup(self.dir) and time.monotonic() < deadline + 30:
            time.sleep(0.1)  # killed processes leave their cgroup as they exit
        for mnt in (self.root, self.disk):
            if os.path.ismount(mnt):
                runner.capture(["umount", str(mnt)], timeout=60)
        # nspawn leaves its propagation directory behind when it cannot remove it itself
        with contextlib.suppress(OSError):
            Path("/run/systemd/nspawn/propagate", self.name).rmdir()
        if any(os.path.ismount(m) for m in (self.root, self.disk)):
            raise UserError(f"board {self.name}: its disk is still mounted", hint=f"umount {self.root} {self.disk}")
        shutil.rmtree(self.dir, ignore_errors=True)  # never while mounted: root is the host's tree


# ---- assembly -----------------------------------------------------------------------------------


def use_ota_cert(lab: Path, cert: Path) -> None:
    """The lab's boards bake in ``cert`` (a PEM certificate, never a key) instead of the lab's own."""
    from alma.imagebuild.ota import check_cert  # the image build's own rule for what may be baked in

    text = check_cert(cert).read_bytes()
    lab.mkdir(parents=True, exist_ok=True)
    os.chmod(lab, 0o700)
    (lab / OTA_KEY).unlink(missing_ok=True)  # the lab's own key does not sign for this certificate
    (lab / OTA_CERT).write_bytes(text)


def _ensure_keys(lab: Path) -> None:
    for name, comment in (("id_ed25519", "alma-lab"), (FLASH_KEY, "alma-lab-flash")):
        key = lab / name
        if not key.exists():
            runner.capture(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)])
    for name in ("known_hosts", "ssh_config"):
        (lab / name).touch(mode=0o600)
    if not (lab / OTA_CERT).exists():  # the lab's own fleet OTA pair, unless one was given
        runner.capture(
            [
                "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
                "-subj", "/CN=alma lab OTA", "-keyout", str(lab / OTA_KEY), "-out", str(lab / OTA_CERT),
            ]
        )  # fmt: skip
        os.chmod(lab / OTA_KEY, 0o600)


def _host_enabled_units() -> set[str]:
    units: set[str] = set()
    for wants in Path("/etc/systemd/system").glob("*.wants"):
        units.update(p.name for p in wants.iterdir())
    return units - KEEP_HOST_UNITS


def assemble(board: Board, port: int, pubkey: str) -> None:
    """The board's disk: what the image installs (the layout), its users as the recipes add
    them, its own identity (hostname, machine-id, host key) and the lab's sshd port."""
    up = board.root  # written through the overlay (never into a mounted upper layer directly)
    lay = board_layout.load()
    board_layout.install(lay, up)
    machine.install_nvbootctrl(up)
    # Users through the real useradd, with the recipes' parameters, into the board's root.
    groups = {g for u in lay.users for g in u.groups}
    for g in sorted(groups):
        runner.capture(["groupadd", "--prefix", str(board.root), "-f", g])
    for u in lay.users:
        argv = ["useradd", "--prefix", str(board.root), "--home-dir", u.home, "--shell", u.shell, "--user-group"]
        argv += ["--system", "--no-create-home"] if u.system else ["--create-home"]
        if u.groups:
            argv += ["--groups", ",".join(u.groups)]
        runner.capture([*argv, u.name])
    # alma-access's postinst: the admin is keys-only ("*": no password, not locked).
    shadow = up / "etc/shadow"
    shadow.write_text(re.sub(rf"^{ADMIN}:![^:]*:", f"{ADMIN}:*:", shadow.read_text(), flags=re.MULTILINE))
    uid, gid = _ids(up, ADMIN)
    ssh_dir = board.root / "home" / ADMIN / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(pubkey)
    for p, mode in ((ssh_dir, 0o700), (ssh_dir / "authorized_keys", 0o600), (ssh_dir.parent, 0o755)):
        os.chown(p, uid, gid)
        os.chmod(p, mode)
    # Presets: enabled units linked where their [Install] says; the host's own services masked.
    system = up / "etc/systemd/system"
    system.mkdir(parents=True, exist_ok=True)
    for unit in lay.units:
        target = board_layout.unit_wants(up, unit.name)
        if unit.enabled and target:
            (system / f"{target}.wants").mkdir(exist_ok=True)
            link = system / f"{target}.wants" / unit.name
            link.unlink(missing_ok=True)
            link.symlink_to(f"/usr/lib/systemd/system/{unit.name}")
    (system / "alma-lab-boot-id.service").write_text(machine.BOOT_ID_UNIT)
    (system / "sysinit.target.wants").mkdir(exist_ok=True)
    (system / "sysinit.target.wants/alma-lab-boot-id.service").symlink_to("../alma-lab-boot-id.service")
    for f in lay.files:  # services that mount their own /proc (ProtectProc=): the board's boot id
        unit = up / f.dest.lstrip("/")
        text = unit.read_text() if f.dest.endswith(".service") else ""
        if "ProtectProc=" in text and "ProcSubset=pid" not in text:  # ProcSubset=pid: no /proc/sys
            dropin = system / f"{unit.name}.d"
            dropin.mkdir(exist_ok=True)
            (dropin / "50-alma-lab-boot-id.conf").write_text(machine.BOOT_ID_DROPIN)
    for unit in _host_enabled_units() | LOWER_LAYER_MASKS:
        mask = system / unit
        mask.unlink(missing_ok=True)
        mask.symlink_to("/dev/null")
    # Identity: the image's hostname (OE's base-files: the MACHINE), kept as the image's
    # identity files (a rewritten slot gets them back); then the real flash hook writes the
    # board's name and the flash-time admin key, and the first boot makes the host key.
    (up / "etc/hostname").write_text(MACHINE + "\n")
    for key in (up / "etc/ssh").glob("ssh_host_*"):  # the host's own (lower layer): the image has none
        key.unlink()
    (up / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    machine.save_identity(up, board.identity_dir / machine.IMAGE)
    _flash_hook(board)
    sshd = up / "etc/ssh"
    sshd.mkdir(parents=True, exist_ok=True)
    host_key = sshd / "ssh_host_ed25519_key"
    runner.capture(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", board.name, "-f", str(host_key)])
    (sshd / "sshd_config.d").mkdir(exist_ok=True)
    (sshd / "sshd_config.d/00-alma-lab.conf").write_text(
        f"# alma lab: this board's address on the host's network\nPort {port}\nListenAddress 127.0.0.1\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\n"
    )
    _generated(board.lab, lay, up)
    (up / "data").mkdir(mode=0o755, exist_ok=True)  # the data partition's mount point, as in the image
    wrapper = up / "usr/local/sbin/swupdate"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(SWUPDATE_WRAPPER)
    os.chmod(wrapper, 0o755)


MACHINE = "jetson-agx-orin-devkit"  # the lab's MACHINE: an AGX Orin devkit
FLASH_HOOK = "layers/meta-alma/dynamic-layers/tegra/recipes-core/initrdscripts/files/alma-board-identity"
FLASH_KEY = "id_flash"  # the lab's flash-time extra admin key (board.conf ADMIN_KEY)


def _flash_hook(board: Board) -> None:
    """The image's flash-time hook, run on the board's root as on the flashed rootfs, with a
    board.conf naming the board and the lab's flash-time admin key (docs/formats.md#board-conf)."""
    conf = board.dir / "board.conf"
    pub = (board.lab / f"{FLASH_KEY}.pub").read_text().split()
    conf.write_text(f"FORMAT=alma-board/1\nHOSTNAME={board.name}\nADMIN_KEY={pub[0]} {pub[1]} alma-lab-flash\n")
    env = {**BOARD_ENV, "ALMA_BOARD_CONF": str(conf), "ALMA_ROOTFS_DIR": str(board.root)}
    runner.capture(["sh", str(board_layout.root() / FLASH_HOOK)], env=env, timeout=60)


def _generated(lab: Path, lay: board_layout.Layout, up: Path) -> None:
    """The files recipes write from the build's settings, as they write them, with the lab's
    values: the lab's OTA certificate, ota.json as alma-ota's recipe prints it. The hawkBit
    client config is not written (the lab updates its boards over ssh)."""
    values = {
        "ALMA_OTA_CERT": (lab / OTA_CERT).read_bytes(),
        "printf": (
            json.dumps(
                {
                    "machine": MACHINE,
                    "hw_revision": "1.0",
                    "cert": "/etc/alma/ota-cert.pem",
                    "state_dir": "/data/alma-ota",
                    "lowest_bootloader": "",
                }
            )
            + "\n"
        ).encode(),
    }
    for g in lay.generated:
        if g.source not in values:
            continue
        target = up / g.dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(values[g.source])
        os.chmod(target, g.mode)


def _ids(upper: Path, user: str) -> tuple[int, int]:
    for line in (upper / "etc/passwd").read_text().splitlines():
        f = line.split(":")
        if f[0] == user:
            return int(f[2]), int(f[3])
    raise UserError(f"user {user} was not created on the board")


def _write_ssh(lab: Path) -> None:
    """ssh_config and known_hosts for every board of the lab (pinned host keys, keys only)."""
    cfg, known = [], []
    for d in sorted(p.parent for p in lab.glob("*/board.json")):  # complete boards only
        b = Board(lab, d.name)
        port = b.port
        pub = (b.root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
        cfg.append(
            f"Host {b.name}\n  HostName 127.0.0.1\n  Port {port}\n  User {ADMIN}\n"
            f'  IdentityFile "{lab / "id_ed25519"}"\n  IdentitiesOnly yes\n'
            f'  UserKnownHostsFile "{lab / "known_hosts"}"\n  StrictHostKeyChecking yes\n'
            "  PasswordAuthentication no\n  LogLevel ERROR\n"
        )
        known.append(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
    (lab / "ssh_config").write_text("".join(cfg))
    (lab / "known_hosts").write_text("".join(known))


# The image's sshd as oe-core's openssh installs it (scarthgap 9.6p1, its default PACKAGECONFIG
# systemd-sshd-socket-mode; @BASE_BINDIR@/@SBINDIR@ as usrmerge sets them, the port the lab's):
# one sshd per connection, each its own sshd@.service, and no PAM (ALMA-OS has no pam feature),
# so a session's processes stay in that unit's cgroup instead of a logind session scope.
IMAGE_SSHD_SOCKET = """[Unit]
Conflicts=sshd.service
Wants=sshdgenkeys.service

[Socket]
ExecStartPre=/usr/bin/mkdir -p /var/run/sshd
ListenStream=127.0.0.1:{port}
Accept=yes

[Install]
WantedBy=sockets.target
"""
IMAGE_SSHD_SERVICE = """[Unit]
Description=OpenSSH Per-Connection Daemon
After=sshdgenkeys.service

[Service]
Environment="SSHD_OPTS="
EnvironmentFile=-/etc/default/ssh
ExecStart=-/usr/sbin/sshd -i $SSHD_OPTS
StandardInput=socket
KillMode=process
"""


def use_image_sshd(board: Board) -> None:
    """Before it boots: the board runs sshd as the image does (IMAGE_SSHD_*, ``UsePAM no``),
    not as this host's ssh.service with PAM (every login a logind session, docs/lab.md)."""
    up = board.root
    units, system = up / "usr/lib/systemd/system", up / "etc/systemd/system"
    (units / "sshd.socket").write_text(IMAGE_SSHD_SOCKET.format(port=board.port))
    (units / "sshd@.service").write_text(IMAGE_SSHD_SERVICE)
    (system / "sockets.target.wants").mkdir(exist_ok=True)
    (system / "sockets.target.wants/sshd.socket").symlink_to("/usr/lib/systemd/system/sshd.socket")
    for unit in ("ssh.service", "ssh.socket"):  # this host's sshd: not the image's
        mask = system / unit
        mask.unlink(missing_ok=True)
        mask.symlink_to("/dev/null")
    with open(up / "etc/ssh/sshd_config.d/00-alma-lab.conf", "a") as conf:
        conf.write("UsePAM no\n")  # first value wins: before sshd_config's UsePAM yes


def boards(lab: Path) -> list[Board]:
    """Every board of the lab, half-made ones included (down must find them too)."""
    return [Board(lab, p.parent.name) for p in sorted(lab.glob("*/disk"))]


def create(lab: Path, name: str, image_sshd: bool = False, cpus: float | None = None) -> Board:
    """Mount the board's disk and root, assemble it, start its supervisor (which boots it);
    ``image_sshd``: its sshd as the image runs it (use_image_sshd); ``cpus``: the board's own
    CPU budget in cores (supervise.cpu_budget), None: it shares the host's."""
    if not _NAME.match(name):
        raise UserError(f"board name {name!r}: lower-case letters, digits and '-' (at most 31)")
    board = Board(lab, name)
    if board.dir.exists():
        raise UserError(f"board {name} already exists in {lab}", hint="alma lab down, or another --prefix")
    lab.mkdir(parents=True, exist_ok=True)
    os.chmod(lab, 0o700)
    _ensure_keys(lab)
    for d in (board.disk, board.root):
        d.mkdir(parents=True)
    try:
        runner.capture(["mount", "-t", "tmpfs", "-o", "mode=0755,size=2g", "tmpfs", str(board.disk)])
        board.upper.mkdir()
        (board.disk / "work").mkdir()
        for path in board_layout.board_state_paths(board_layout.load()):
            # a whiteout (0/0 char device) in the upper layer: the host's copy does not show
            hide = board.upper / path.lstrip("/")
            hide.parent.mkdir(parents=True, exist_ok=True)
            os.mknod(hide, 0o600 | stat.S_IFCHR, os.makedev(0, 0))
        runner.capture(
            [
                "mount", "-t", "overlay", "overlay", "-o",
                f"lowerdir=/,upperdir={board.upper},workdir={board.disk / 'work'}", str(board.root),
            ]
        )  # fmt: skip
        machine.make_thermal(board.thermal)
        machine.new_slots(board.slot_dir)
        machine.new_disk(board.disk_dir)
        port = _free_port()
        assemble(board, port, (lab / "id_ed25519.pub").read_text())
        machine.flashed_identity(board.identity_dir, board.root, board.disk_dir)
        (board.dir / "board.json").write_text(json.dumps({"name": name, "port": port}) + "\n")
        _write_ssh(lab)
        if image_sshd:
            use_image_sshd(board)
        if cpus is not None:
            (board.dir / supervise.CPUS_FILE).write_text(f"{cpus}\n")
        start_supervisor(board)
    except BaseException:
        board.stop(timeout=30)
        raise
    return board


def start_supervisor(board: Board) -> None:
    with open(board.dir / "supervisor.log", "ab") as log:
        subprocess.Popen(  # detached: it outlives `alma lab up` until `alma lab down`
            [sys.executable, "-m", "alma.lab.supervise", str(board.dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + 30
    while board.supervisor() is None:
        if time.monotonic() > deadline:
            raise UserError(
                f"board {board.name}: its supervisor did not start", hint=f"read {board.dir}/supervisor.log"
            )
        time.sleep(0.05)


def up(
    lab: Path,
    count: int,
    prefix: str,
    progress: Callable[[str], None] = lambda _: None,
    image_sshd: bool = False,
    cpus: float | None = None,
) -> list[tuple[Board, float]]:
    made = [create(lab, f"{prefix}{i}", image_sshd, cpus) for i in range(1, count + 1)]
    progress(f"booting {', '.join(b.name for b in made)}")
    out = []
    for b in made:
        secs = b.wait_ready()
        progress(f"{b.name}: ready (ssh 127.0.0.1:{b.port})")
        out.append((b, secs))
    return out


def down(lab: Path) -> list[str]:
    gone = []
    for b in boards(lab):
        b.stop()
        gone.append(b.name)
    keys = ("id_ed25519", "id_ed25519.pub", FLASH_KEY, f"{FLASH_KEY}.pub")
    for name in (*keys, "known_hosts", "ssh_config", OTA_CERT, OTA_KEY):
        (lab / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        lab.rmdir()
    return gone


def fleet_toml(lab: Path) -> str:
    """A fleet file (alma.fleet.inventory) reaching every board of the lab."""
    text = (
        "# Written by `alma lab up`: the lab's virtual boards (docs/lab.md).\n[ssh]\n"
        f'config = "{lab / "ssh_config"}"\nknown_hosts = "{lab / "known_hosts"}"\n'
        'strict_host_key_checking = "yes"\nconnect_timeout = 10\n\n'
        # As root through the image's admin sudo: the kernel log (GPU faults) and health's
        # own state need it (this host's kernel has dmesg_restrict=1).
        '[health]\ntimeout = 60\ncommand = "sudo -n alma-health --json"\n'
    )
    for b in boards(lab):
        if not (b.dir / "board.json").exists():
            continue
        text += f'\n[[node]]\nname = "{b.name}"\nssh = "{b.name}"\nrole = "board"\n'
    return text
