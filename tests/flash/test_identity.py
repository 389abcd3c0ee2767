"""Per-board identity at flash time: names checked on the host and by the device
hook (run here under dash and bash against a temporary rootfs), the flashpkg-extra contract,
and the board's console line parsed strictly."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import require_tool
from support_build import ADMIN_PUB
from support_guard import REPO

from alma.errors import UserError
from alma.flash import identity as I
from alma.sshkeys import parse_public_key

HOOK = REPO / "layers/meta-alma/dynamic-layers/tegra/recipes-core/initrdscripts/files/alma-board-identity"
BBAPPEND = HOOK.parent.parent / "tegra-flash-init_%.bbappend"
SHELLS = ("dash", "bash")
OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFjZ9Vv0J7m2bqS3mBzU5xS3b1s0d2Yc6m7Q4b7nQ9xV"
HOSTILE = ["../x", "a/b", "edge-01\nHOSTNAME=evil", "x" * 300, "édge", "edge\u202e10", "-edge", "edge-", "",
           "12345", "edge 01", "edge.lab", "$(touch /tmp/pwned)", "edge;reboot", "ed\x00ge", "EDGE_01"]  # fmt: skip


def board_rootfs(root: Path) -> Path:
    """The flashed rootfs as the image has it: default hostname, admin user's key file."""
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text("jetson-orin-nano-devkit\n")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nalma:x:1000:1000::/home/alma:/bin/sh\n")
    ssh = root / "home/alma/.ssh"
    ssh.mkdir(parents=True)
    (ssh / "authorized_keys").write_text(ADMIN_PUB + "\n")
    os.chmod(ssh / "authorized_keys", 0o600)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/alma-health").write_text("#!/bin/sh\n")
    return root


def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    out = {}
    for p in sorted(root.rglob("*")):
        st_ = p.lstat()
        out[str(p.relative_to(root))] = (st_.st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
    return out


def run_hook(shell: str, conf: Path, rootfs: Path, **env: str) -> subprocess.CompletedProcess[str]:
    sh = require_tool(shell)
    full = {"PATH": "/usr/bin:/bin", "ALMA_BOARD_CONF": str(conf), "ALMA_ROOTFS_DIR": str(rootfs), **env}
    return subprocess.run([sh, str(HOOK)], env=full, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("shell", SHELLS)
def test_hook_writes_hostname_and_key_and_nothing_else(tmp_path, shell):
    root = board_rootfs(tmp_path / "rootfs")
    before = snapshot(root)
    conf = tmp_path / "board.conf"
    conf.write_text(I.BoardIdentity("edge-07", parse_public_key(OTHER_KEY)).conf_text())
    r = run_hook(shell, conf, root)
    assert r.returncode == 0, r.stderr
    after = snapshot(root)
    changed = {k for k in after if after[k] != before.get(k)} | (before.keys() - after.keys())
    # and, for alma-identity's first boot (docs/ota.md): this flash's stamp and the key alone
    flash_keys = "etc/alma/flash-authorized_keys.alma"
    assert changed == {"etc/hostname", "home/alma/.ssh/authorized_keys", "etc/alma", "etc/alma/flashed", flash_keys}
    assert (root / flash_keys).read_text() == f"{OTHER_KEY}\n" and after[flash_keys][0] & 0o777 == 0o644
    stamp = (root / "etc/alma/flashed").read_text()
    assert (root / "etc/hostname").read_text() == "edge-07\n"
    assert (root / "home/alma/.ssh/authorized_keys").read_text() == f"{ADMIN_PUB}\n{OTHER_KEY}\n"
    assert after["home/alma/.ssh/authorized_keys"][0] == before["home/alma/.ssh/authorized_keys"][0]  # still 0600
    assert "[alma-board-identity] hostname: edge-07" in r.stdout
    # run twice (a re-flash of the same package): the key is not added again
    assert run_hook(shell, conf, root).returncode == 0
    assert (root / "home/alma/.ssh/authorized_keys").read_text().count(OTHER_KEY) == 1
    assert (root / "etc/alma/flashed").read_text().strip() not in ("", stamp.strip())  # a new flash, a new stamp


@pytest.mark.parametrize("shell", SHELLS)
def test_hook_without_a_config_leaves_the_board_alone(tmp_path, shell):
    root = board_rootfs(tmp_path / "rootfs")
    before = snapshot(root)
    r = run_hook(shell, tmp_path / "absent.conf", root)
    assert r.returncode == 0 and "keeps the image's identity" in r.stdout
    assert snapshot(root) == before


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_refused_by_the_device_hook(tmp_path, shell, name):
    root = board_rootfs(tmp_path / "rootfs")
    before = snapshot(root)
    conf = tmp_path / "board.conf"
    conf.write_bytes(f"FORMAT=alma-board/1\nHOSTNAME={name}\n".encode("utf-8", "surrogateescape"))
    r = run_hook(shell, conf, root)
    assert r.returncode != 0 and "refused" in r.stderr, (name, r.stdout, r.stderr)
    assert snapshot(root) == before
    assert not (tmp_path / "pwned").exists()


# A trailing newline only matters on the host (re's "$" would let it through; in the config
# file it is just the line's end).
@pytest.mark.parametrize("name", [*HOSTILE, "edge-01\n"])
def test_hostile_names_are_refused_by_the_host(name):
    with pytest.raises(UserError, match="is not a host name"):
        I.check_hostname(name)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("HOSTNAME=edge-01\n", "FORMAT must be alma-board/1"),
        ("FORMAT=alma-board/1\nHOSTNAME=edge-01\nHOSTNAME=edge-02\n", "HOSTNAME given twice"),
        ("FORMAT=alma-board/1\nHOSTNAME=edge-01\nPATH=/tmp\n", "unknown key"),
        ("FORMAT=alma-board/1\nHOSTNAME=edge-01\nrm -rf /\n", "not KEY=VALUE"),
        ("FORMAT=alma-board/1\nHOSTNAME=edge-01\nADMIN_KEY=ssh-ed25519 AAAA;reboot\n", "ADMIN_KEY is not"),
        ("FORMAT=alma-board/1\nHOSTNAME=edge-01\nADMIN_KEY=ssh-dss AAAA\n", "ADMIN_KEY is not"),
        ("FORMAT=alma-board/1\nHOSTNAME=edge-01\nADMIN_KEY=ssh-ed25519 $(reboot)\n", "ADMIN_KEY is not"),
        ("FORMAT=alma-board/1\nHOSTNAME=edge-01\r\n", "other than printable ASCII"),
        ("FORMAT=alma-board/1\nHOSTNAME=ed\x00ge\n", "other than printable ASCII"),
        ("FORMAT=alma-board/1\n" + "#\n" * 70 + "HOSTNAME=edge-01\n", "more than 64 lines"),
    ],
)
def test_hostile_configs_are_refused_and_nothing_is_written(tmp_path, shell, text, why):
    root = board_rootfs(tmp_path / "rootfs")
    before = snapshot(root)
    conf = tmp_path / "board.conf"
    conf.write_text(text)
    r = run_hook(shell, conf, root)
    assert r.returncode != 0 and why in r.stderr, r.stderr
    assert snapshot(root) == before


@pytest.mark.parametrize("shell", SHELLS)
def test_symlinked_config_and_missing_admin_home_are_refused(tmp_path, shell):
    root = board_rootfs(tmp_path / "rootfs")
    real = tmp_path / "real.conf"
    real.write_text("FORMAT=alma-board/1\nHOSTNAME=edge-01\n")
    link = tmp_path / "board.conf"
    link.symlink_to(real)
    assert "is a symlink" in run_hook(shell, link, root).stderr
    (root / "home/alma/.ssh/authorized_keys").unlink()  # a sealed image: no admin user
    real.write_text(I.BoardIdentity("edge-01", parse_public_key(OTHER_KEY)).conf_text())
    before = snapshot(root)
    r = run_hook(shell, real, root)
    assert r.returncode != 0 and "image without admin access" in r.stderr
    assert snapshot(root) == before  # not even the hostname: all or nothing


@pytest.mark.parametrize("shell", SHELLS)
def test_hook_finds_the_app_partitions_through_sysfs(tmp_path, shell):
    """Without ALMA_ROOTFS_DIR the hook mounts every APP/APP_b partition at /mnt/rootfs.
    mount/umount cannot run here: stand-ins copy the 'partition' tree in and back out."""
    sysblock = tmp_path / "sys/class/block"
    parts = {"nvme0n1p1": "APP", "nvme0n1p2": "APP_b", "nvme0n1p3": "esp"}
    for dev, name in parts.items():
        (sysblock / dev).mkdir(parents=True)
        (sysblock / dev / "uevent").write_text(
            f"MAJOR=259\nMINOR=1\nDEVNAME={dev}\nDEVTYPE=partition\nPARTNAME={name}\n"
        )
        board_rootfs(tmp_path / "dev" / dev)
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "mount").write_text(
        '#!/bin/sh\necho "mount $*" >> "$FAKE_LOG"\neval dev=\\${$(($#-1))}; eval mnt=\\${$#}\n'
        'cp -a "$FAKE_DEVS/$(basename "$dev")/." "$mnt/" && echo "$dev" > "$FAKE_DEVS/.mounted"\n'
    )
    (fakebin / "umount").write_text(
        '#!/bin/sh\necho "umount $*" >> "$FAKE_LOG"\ndev=$(cat "$FAKE_DEVS/.mounted")\n'
        'rm -rf "$FAKE_DEVS/$(basename "$dev")" && cp -a "$1/." "$FAKE_DEVS/$(basename "$dev")/" && '
        'find "$1" -mindepth 1 -delete\n'
    )
    for f in fakebin.iterdir():
        f.chmod(0o755)
    conf = tmp_path / "board.conf"
    conf.write_text(I.BoardIdentity("edge-02").conf_text())
    sh = require_tool(shell)
    r = subprocess.run(
        [sh, str(HOOK)],
        env={
            "PATH": f"{fakebin}:/usr/bin:/bin",
            "ALMA_BOARD_CONF": str(conf),
            "ALMA_SYS_BLOCK": str(sysblock),
            "ALMA_ROOTFS_MNT": str(tmp_path / "mnt"),
            "FAKE_LOG": str(tmp_path / "log"),
            "FAKE_DEVS": str(tmp_path / "dev"),
        },  # fmt: skip
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for dev, name in parts.items():
        want = "edge-02\n" if name.startswith("APP") else "jetson-orin-nano-devkit\n"
        assert (tmp_path / "dev" / dev / "etc/hostname").read_text() == want, dev
    log = (tmp_path / "log").read_text().splitlines()
    assert log == [f"mount -t ext4 -o rw /dev/nvme0n1p1 {tmp_path / 'mnt'}", f"umount {tmp_path / 'mnt'}",
                   f"mount -t ext4 -o rw /dev/nvme0n1p2 {tmp_path / 'mnt'}", f"umount {tmp_path / 'mnt'}"]  # fmt: skip


def test_bbappend_installs_the_hook_into_init_extra_d():
    text = BBAPPEND.read_text()
    assert 'SRC_URI:append:alma = " file://alma-board-identity"' in text  # only for the alma distro
    assert "install -m 0755 ${WORKDIR}/alma-board-identity ${D}/init-extra.d/" in text
    layer_conf = (REPO / "layers/meta-alma/conf/layer.conf").read_text()
    assert 'BBFILES_DYNAMIC += "tegra:${LAYERDIR}/dynamic-layers/tegra/' in layer_conf
    # the device reads the path initrd-flash.sh copies to ($mnt/flashpkg/flashpkg-extra)
    assert I.DEVICE_CONF in HOOK.read_text()


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\n\r\x00"), max_size=70))
def test_host_and_device_agree_on_every_name(tmp_path_factory, name):
    """One rule on both sides: the hook accepts a name exactly when the host does."""
    tmp = tmp_path_factory.mktemp("agree")
    root = board_rootfs(tmp / "rootfs")
    conf = tmp / "board.conf"
    conf.write_bytes(b"FORMAT=alma-board/1\nHOSTNAME=" + name.encode() + b"\n")
    try:
        I.check_hostname(name)
        host_ok = True
    except UserError:
        host_ok = False
    r = run_hook("dash", conf, root)
    assert (r.returncode == 0) == host_ok, (name, r.stderr)


# -- naming a batch --------------------------------------------------------------------


def test_pattern_names_boards_in_usb_order():
    plan = I.IdentityPlan.from_options(None, "edge-{n:02d}", None, None)
    assert plan is not None
    got = plan.bind(["1-10", "1-9.2", "1-9.1"])
    assert {k: v.hostname for k, v in got.items()} == {"1-9.1": "edge-01", "1-9.2": "edge-02", "1-10": "edge-03"}


@pytest.mark.parametrize("pattern", ["{n.__class__}", "{0}", "{n!r}", "{x}", "edge", "{n:>300}", "{n", "{n:02d}{n:s}"])
def test_hostile_patterns_are_refused(pattern):
    with pytest.raises(UserError, match="hostname-pattern"):
        I.IdentityPlan.from_options(None, pattern, None, None)


def test_pattern_that_makes_a_bad_name_is_refused_before_any_board():
    plan = I.IdentityPlan.from_options(None, "edge-{n}-", None, None)
    assert plan is not None
    with pytest.raises(UserError, match="not a host name"):
        plan.bind(["1-1"])


def test_one_hostname_for_many_boards_is_refused():
    plan = I.IdentityPlan.from_options("edge-01", None, None, None)
    assert plan is not None
    with pytest.raises(UserError, match="every board would get the same name"):
        plan.bind(["1-1", "1-2"])


def test_csv_of_usb_instance_to_hostname(tmp_path):
    csv = tmp_path / "boards.csv"
    csv.write_text("usb_instance,hostname\n1-8.4,edge-a\n# spare\n1-8.3 , edge-b\n")
    plan = I.IdentityPlan.from_options(None, None, csv, None)
    assert plan is not None
    assert {k: v.hostname for k, v in plan.bind(["1-8.3", "1-8.4"]).items()} == {"1-8.3": "edge-b", "1-8.4": "edge-a"}
    with pytest.raises(UserError, match="no name for the board"):
        plan.bind(["1-8.3", "1-9"])
    for bad, why in [("1-8.4,edge-a\n1-8.4,edge-b\n", "listed twice"), ("1-8.4,../x\n", "not a host name"),
                     ("1-8.4,a,b\n", "want 'USB_INSTANCE,HOSTNAME'"), ("../1,a\n", "want"),
                     ("1-1,edge\n1-2,EDGE\n", "would both be named")]:  # fmt: skip
        csv.write_text(bad)
        with pytest.raises(UserError, match=why):
            p = I.IdentityPlan.from_options(None, None, csv, None)
            assert p is not None
            p.bind(["1-1", "1-2"])


def test_name_options_exclude_each_other_and_a_key_needs_a_name(tmp_path):
    with pytest.raises(UserError, match="exclude each other"):
        I.IdentityPlan.from_options("a", "b{n}", None, None)
    key = tmp_path / "k.pub"
    key.write_text(ADMIN_PUB)
    with pytest.raises(UserError, match="needs a board name"):
        I.IdentityPlan.from_options(None, None, None, key)


# -- the flashpkg-extra contract -------------------------------------------------------


def test_each_board_copy_holds_exactly_its_own_config(tmp_path):
    plan = I.IdentityPlan.from_options(None, "edge-{n:02d}", None, None)
    assert plan is not None
    shared = tmp_path / "master.img"
    shared.write_bytes(b"rootfs")
    for inst, ident in plan.bind(["1-1", "1-2", "1-3"]).items():
        d = tmp_path / inst
        d.mkdir()
        os.link(shared, d / "rootfs.img")  # a hard-linked payload, as clone_for_board makes
        I.write_board_config(d, ident)
    for n, inst in enumerate(["1-1", "1-2", "1-3"], 1):
        extra = tmp_path / inst / "flashpkg-extra"
        files = sorted(str(p.relative_to(extra)) for p in extra.rglob("*"))
        assert files == ["alma", "alma/board.conf"]
        text = (tmp_path / inst / I.CONF_REL).read_text()
        assert re.findall(r"^[A-Z_]+=.*$", text, re.MULTILINE) == ["FORMAT=alma-board/1", f"HOSTNAME=edge-{n:02d}"]
    assert shared.read_bytes() == b"rootfs" and shared.stat().st_nlink == 4


def test_a_bundle_bringing_its_own_flashpkg_extra_is_refused(tmp_path):
    (tmp_path / "flashpkg-extra").mkdir()
    (tmp_path / "flashpkg-extra" / "evil.sh").write_text("x")
    with pytest.raises(UserError, match="already carries flashpkg-extra"):
        I.write_board_config(tmp_path, I.BoardIdentity("edge-01"))
    other = tmp_path / "b"
    other.mkdir()
    (other / "flashpkg-extra").symlink_to(tmp_path)
    with pytest.raises(UserError, match="not a directory"):
        I.write_board_config(other, I.BoardIdentity("edge-01"))


# -- the console line ------------------------------------------------------------------

FP = "SHA256:6kMpmbGgtFqJ6WpfjJYxmtZmYPO/85YCdVbzJCm3Bvs"


def test_console_line_parsed():
    got = I.parse_board_line(f"alma-board: name=edge-01 addr=192.0.2.7,fd00::7 hostkey={FP}")
    assert got == I.BoardLine("edge-01", ("192.0.2.7", "fd00::7"), FP)
    # agetty prints an absent family as nothing
    assert I.parse_board_line(f"alma-board: name=edge-01 addr=192.0.2.7, hostkey={FP}").addresses == ("192.0.2.7",)
    assert I.parse_board_line(f"alma-board: name=edge-01 addr=, hostkey={FP}").addresses == ()


@pytest.mark.parametrize(
    "line",
    [
        f"alma-board: name=../x addr=192.0.2.7 hostkey={FP}",
        f"alma-board: name=edge-01 addr=192.0.2.7;rm hostkey={FP}",
        f"alma-board: name=edge-01 addr=0.0.0.0 hostkey={FP}",
        f"alma-board: name=edge-01 addr=999.0.0.1 hostkey={FP}",
        "alma-board: name=edge-01 addr=192.0.2.7 hostkey=SHA256:short",
        f"alma-board: name=edge-01 addr=192.0.2.7 hostkey={FP} extra=1",
        f"alma-board: name=edge-01 addr=192.0.2.7 hostkey={FP}\x1b[2J",
        f"xalma-board: name=edge-01 addr=192.0.2.7 hostkey={FP}",
        f"alma-board: name=édge addr=192.0.2.7 hostkey={FP}",
        f"alma-board: name={'a' * 300} addr=192.0.2.7 hostkey={FP}",
    ],
)
def test_hostile_console_lines_are_ignored(line):
    assert I.parse_board_line(line) is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_console_parser_never_raises_and_yields_only_clean_fields(text):
    got = I.parse_board_line("alma-board: " + text)
    if got is not None:
        I.check_hostname(got.name)
        assert re.fullmatch(r"SHA256:[A-Za-z0-9+/]{43}", got.hostkey)
        assert all(re.fullmatch(r"[0-9a-f.:]+", a) for a in got.addresses)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"1-1.2,edge-01\n1-1.3,caf\xe9\n", ":2: --hostnames CSV is not UTF-8 text (byte 0xe9"),
        (b"x" * ((1 << 20) + 1), ": --hostnames CSV of 1048577 bytes, over the 1 MiB"),
    ],
)
def test_a_hostnames_csv_is_read_as_every_input_file_is(tmp_path: Path, raw: bytes, why: str) -> None:
    """Through the one reader: exit 2 naming the file (and the line of a non-UTF-8 byte)."""
    f = tmp_path / "names.csv"
    f.write_bytes(raw)
    with pytest.raises(UserError) as e:
        I.read_hostname_csv(f)
    assert e.value.exit_code == 2 and str(e.value).startswith(f"{f}{why}"), str(e.value)
