"""The layer's admin access: the release check run on generated rootfs trees, the
alma-access recipe's key handling, and the keys-only sshd drop-in checked with the real sshd."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from support import require_tool
from support_build import ADMIN_PUB
from support_guard import REPO

LAYER = REPO / "layers" / "meta-alma"
CHECK = LAYER / "classes" / "alma-release-check.bbclass"
ACCESS = LAYER / "recipes-alma" / "alma-access" / "alma-access_0.1.0.bb"
DROPIN = LAYER / "recipes-alma" / "alma-access" / "files" / "50-alma-keys-only.conf"
SUDOERS = LAYER / "recipes-alma" / "alma-access" / "files" / "50-alma-admin.sudoers"
SESSION_END = LAYER / "recipes-alma" / "alma-access" / "files" / "50-alma-session-end.conf"
CLIENT_ALIVE = LAYER / "recipes-alma" / "alma-access" / "files" / "50-alma-client-alive.conf"

# oe-core scarthgap's openssh sshd_config, the lines that matter (Include first, defaults commented)
OE_SSHD_CONFIG = """\
Include /etc/ssh/sshd_config.d/*.conf
#PermitRootLogin prohibit-password
#PubkeyAuthentication yes
#PasswordAuthentication yes
#PermitEmptyPasswords no
KbdInteractiveAuthentication no
#UsePAM no
Subsystem\tsftp\t/usr/libexec/sftp-server
"""


class Fatal(Exception):
    pass


class BB:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def fatal(self, msg: str) -> None:
        raise Fatal(msg)

    def note(self, msg: str) -> None:
        self.notes.append(msg)


class D:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def getVar(self, name: str) -> str | None:
        return self.values.get(name)


def python_body(path: Path, func: str) -> str:
    m = re.search(rf"^python {func}\(\) \{{\n(.*?)^\}}", path.read_text(), re.MULTILINE | re.DOTALL)
    assert m, func
    # run as a function: bitbake's python functions may return early
    return f"def _{func}():\n{m.group(1)}\n_{func}()\n"


def run_check(rootfs: Path, **over: str) -> BB:
    values = {"IMAGE_ROOTFS": str(rootfs), "sysconfdir": "/etc", "ALMA_RELEASE": "1", "ALMA_ADMIN_ACCESS": "1",
              "ALMA_ADMIN_USER": "alma", **over}  # fmt: skip
    bb = BB()
    exec(compile(python_body(CHECK, "alma_release_check"), str(CHECK), "exec"), {"d": D(values), "bb": bb})
    return bb


def write_keys(workdir: Path, keys: str) -> BB:
    bb = BB()
    d = D({"ALMA_ADMIN_KEYS": keys, "WORKDIR": str(workdir)})
    body = python_body(ACCESS, "alma_write_authorized_keys")
    exec(compile(body, str(ACCESS), "exec"), {"d": d, "bb": bb, "os": __import__("os")})
    return bb


def do_install(workdir: Path, dest: Path) -> None:
    """The recipe's do_install with bash (owner flags dropped: the host has no user alma)."""
    text = ACCESS.read_text()
    m = re.search(r"^do_install\(\) \{\n(.*?)^\}", text, re.MULTILINE | re.DOTALL)
    assert m
    body = m.group(1).replace("-o ${ALMA_ADMIN_USER} -g ${ALMA_ADMIN_USER} ", "")
    for k, v in {"D": str(dest), "WORKDIR": str(workdir), "sysconfdir": "/etc", "ALMA_ADMIN_USER": "alma",
                 "systemd_system_unitdir": "/usr/lib/systemd/system"}.items():  # fmt: skip
        body = body.replace("${" + k + "}", v)
    assert "${" not in body
    subprocess.run(["bash", "-euc", body], check=True)


def postinst(dest: Path) -> None:
    m = re.search(r"^pkg_postinst:\$\{PN\}-admin\(\) \{\n(.*?)^\}", ACCESS.read_text(), re.MULTILINE | re.DOTALL)
    assert m
    body = m.group(1).replace("${ALMA_ADMIN_USER}", "alma").replace("${sysconfdir}", "/etc")
    subprocess.run(["sh", "-euc", body], check=True, env={"D": str(dest), "PATH": "/usr/bin:/bin"})


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    """A release rootfs as alma-image makes it: oe-core's sshd_config, the layer's recipe
    installed (its own python and shell), useradd's result, the postinst run."""
    root = tmp_path / "rootfs"
    work = tmp_path / "work"
    work.mkdir()
    for f in (DROPIN, SUDOERS, SESSION_END, CLIENT_ALIVE):
        (work / f.name).write_bytes(f.read_bytes())
    assert write_keys(work, ADMIN_PUB).notes == []
    do_install(work, root)
    etc = root / "etc"
    (etc / "ssh" / "sshd_config").write_text(OE_SSHD_CONFIG)
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nalma:x:1000:1000::/home/alma:/bin/sh\n")
    (etc / "shadow").write_text("root:*:19000:0:99999:7:::\nalma:!:19000:0:99999:7:::\n")  # useradd: locked
    (etc / "group").write_text("root:x:0:\nwheel:x:10:alma\nalma:x:1000:\n")
    (etc / "sudoers").write_text("root ALL=(ALL:ALL) ALL\n@includedir /etc/sudoers.d\n")
    (etc / "machine-id").write_text("")
    postinst(root)
    return root


def test_the_release_rootfs_as_built_passes(rootfs):
    assert "alma:*:" in (rootfs / "etc/shadow").read_text()  # the postinst made it keys-only, not locked
    assert (rootfs / "home/alma/.ssh/authorized_keys").read_text() == ADMIN_PUB + "\n"
    bb = run_check(rootfs)
    assert bb.notes and "keys-only sshd" in bb.notes[0]


def test_password_login_on_fails(rootfs):
    (rootfs / "etc/ssh/sshd_config.d/50-alma-keys-only.conf").unlink()  # back to sshd's defaults
    with pytest.raises(Fatal, match=r"password login is on \(PasswordAuthentication\)") as e:
        run_check(rootfs)
    assert "root login is allowed" in str(e.value)  # the default prohibit-password is not "no"


def test_an_earlier_dropin_wins_like_sshd(rootfs):
    (rootfs / "etc/ssh/sshd_config.d/10-vendor.conf").write_text("PasswordAuthentication yes\n")
    with pytest.raises(Fatal, match="password login is on"):
        run_check(rootfs)


def test_root_login_on_fails(rootfs):
    (rootfs / "etc/ssh/sshd_config.d/40-debug.conf").write_text("PermitRootLogin yes\n")
    with pytest.raises(Fatal, match=r"root login is allowed \(PermitRootLogin\)"):
        run_check(rootfs)


def test_a_later_line_in_sshd_config_loses_to_the_dropin(rootfs):
    """oe-core's ssh_allow_root_login seds sshd_config; the drop-in read first still wins."""
    cfg = rootfs / "etc/ssh/sshd_config"
    cfg.write_text(cfg.read_text().replace("#PermitRootLogin prohibit-password", "PermitRootLogin yes"))
    run_check(rootfs)


def test_match_block_reenabling_passwords_fails(rootfs):
    cfg = rootfs / "etc/ssh/sshd_config"
    cfg.write_text(cfg.read_text() + "Match Address 10.0.0.0/8\n    PasswordAuthentication yes\n")
    with pytest.raises(Fatal, match="a Match block sets passwordauthentication yes"):
        run_check(rootfs)


def test_missing_key_fails(rootfs):
    (rootfs / "home/alma/.ssh/authorized_keys").write_text("")
    with pytest.raises(Fatal, match=r"alma has no admin key in /home/alma/.ssh/authorized_keys"):
        run_check(rootfs)


def test_locked_or_password_admin_fails(rootfs):
    shadow = rootfs / "etc/shadow"
    shadow.write_text(shadow.read_text().replace("alma:*:", "alma:!:"))
    with pytest.raises(Fatal, match="alma is locked"):
        run_check(rootfs)
    shadow.write_text(shadow.read_text().replace("alma:!:", "alma:$6$salt$hash:"))
    with pytest.raises(Fatal, match="alma has a password; release images are keys only"):
        run_check(rootfs)


def test_admin_without_sudo_fails(rootfs):
    (rootfs / "etc/group").write_text("root:x:0:\nwheel:x:10:\nalma:x:1000:\n")
    with pytest.raises(Fatal, match="alma may not use sudo"):
        run_check(rootfs)


def test_missing_admin_user_fails_unless_sealed(rootfs):
    (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    with pytest.raises(Fatal, match="admin user alma is missing"):
        run_check(rootfs)
    run_check(rootfs, ALMA_ADMIN_ACCESS="0")


def test_baked_in_host_identity_fails(rootfs):
    (rootfs / "etc/ssh/ssh_host_ed25519_key").write_text("x")
    (rootfs / "etc/machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    with pytest.raises(Fatal) as e:
        run_check(rootfs)
    assert "ssh host keys are in the image (ssh_host_ed25519_key)" in str(e.value)
    assert "/etc/machine-id is set in the image" in str(e.value)


def test_uninitialized_machine_id_is_fine(rootfs):
    (rootfs / "etc/machine-id").write_text("uninitialized\n")
    run_check(rootfs)
    (rootfs / "etc/machine-id").unlink()
    run_check(rootfs)


def test_read_only_rootfs_volatile_host_keys_fail(rootfs):
    (rootfs / "etc/default").mkdir()
    (rootfs / "etc/default/ssh").write_text(
        "SYSCONFDIR=${SYSCONFDIR:-/var/run/ssh}\nSSHD_OPTS='-f /etc/ssh/sshd_config_readonly'\n"
    )
    with pytest.raises(Fatal, match="a new key at every boot"):
        run_check(rootfs)


def test_development_build_is_not_checked(rootfs):
    (rootfs / "etc/ssh/sshd_config.d/50-alma-keys-only.conf").unlink()
    assert run_check(rootfs, ALMA_RELEASE="0").notes == []


@pytest.mark.parametrize(
    "keys",
    [
        'ssh-ed25519 AAAA ${@os.system("x")}',
        'ssh-ed25519 "AAAA"',
        "ssh-dss AAAAB3NzaC1kc3M=",
        "garbage",
        "ssh-rsa " + ADMIN_PUB.split()[1],
    ],  # fmt: skip
)
def test_recipe_refuses_keys_that_are_not_plain_key_lines(tmp_path, keys):
    with pytest.raises(Fatal, match="ALMA_ADMIN_KEYS entry 1"):
        write_keys(tmp_path, keys)
    assert not (tmp_path / "authorized_keys").exists()


def test_recipe_writes_one_line_per_key(tmp_path):
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFjZ9Vv0J7m2bqS3mBzU5xS3b1s0d2Yc6m7Q4b7nQ9xV"
    write_keys(tmp_path, f"{ADMIN_PUB};{other};")
    assert (tmp_path / "authorized_keys").read_text() == f"{ADMIN_PUB}\n{other}\n"


def test_real_sshd_reads_the_dropin_as_keys_only(tmp_path):
    """sshd -T (the real sshd's effective config): first value wins, so the drop-in beats
    a later PasswordAuthentication yes / PermitRootLogin yes in sshd_config."""
    sshd = require_tool("sshd")
    hk = tmp_path / "hk"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hk)], check=True)
    cfg = tmp_path / "sshd_config"
    cfg.write_text(f"Include {DROPIN}\nPasswordAuthentication yes\nPermitRootLogin yes\n")
    r = subprocess.run([sshd, "-T", "-f", str(cfg), "-h", str(hk)], capture_output=True, text=True, timeout=30)
    eff = dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if " " in ln)
    assert r.returncode == 0, r.stderr
    assert eff["passwordauthentication"] == "no" and eff["kbdinteractiveauthentication"] == "no"
    assert eff["permitrootlogin"] == "no" and eff["permitemptypasswords"] == "no"
    assert eff["authenticationmethods"] == "publickey" and eff["pubkeyauthentication"] == "yes"


def test_oelint_adv_has_zero_findings_on_the_access_recipes():
    import shutil
    import sys

    oelint = shutil.which("oelint-adv", path=str(Path(sys.executable).parent)) or require_tool("oelint-adv")
    files = [
        ACCESS,
        LAYER / "recipes-alma/alma-board-id/alma-board-id_0.1.0.bb",
        CHECK,
        LAYER / "dynamic-layers/tegra/recipes-core/initrdscripts/tegra-flash-init_%.bbappend",
        LAYER / "recipes-core/images/alma-image.bb",
        LAYER / "recipes-core/packagegroups/packagegroup-alma.bb",
    ]
    r = subprocess.run(
        [oelint, "--release", "scarthgap", "--mode", "all", "--suppress", "oelint.vars.homepageping", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    findings = [ln for ln in (r.stdout + r.stderr).splitlines() if re.search(r":\d+:(error|warning|info):", ln)]
    assert r.returncode == 0 and findings == [], "\n".join(findings)
