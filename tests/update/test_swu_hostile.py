""".swu files our writer never makes: a signed sw-description that points SWUpdate outside the
inactive slot (the running slot, a disk, a file, a script), and hostile cpio framing.

The signature is not the only line: a description signed by the right key but naming the
running slot (a build bug, a leaked key) is refused by the host reader AND by the board's
agent before SWUpdate runs (the real SWUpdate would write it: checked below).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from almaboard.swu import DESCRIPTION, SIGNATURE, Payload
from artefacts.alma_deployfix import alma, build_deploy, project  # noqa: F401 - fixtures
from support_swu import description, pack, sign_detached
from support_update import AGENT, MACHINE, SimBoard, load_state, require_swupdate, rootfs_image, swupdate_argv

from alma.update import swu as S

RUN = "run1"


def forge(tmp: Path, signer: tuple[bytes, bytes], mutate: Callable[[dict[str, Any]], None], name: str = "f",
          extra: list[tuple[str, bytes]] | None = None) -> Path:  # fmt: skip
    """A .swu signed with the fleet's key whose description ``mutate`` changed before signing,
    packed by meta-swupdate's cpio command (tests/support_swu.py)."""
    img = rootfs_image(tmp / f"{name}.ext4", "2.0.0")
    p = Payload("rootfs.ext4", "rootfs", hashlib.sha256(img.read_bytes()).hexdigest(), img.stat().st_size)
    doc = json.loads(description(machine=MACHINE, version="2.0.0", payloads=[p], root=""))
    mutate(doc["software"])
    desc = (json.dumps(doc, indent=2) + "\n").encode()
    sig = sign_detached(desc, *signer)
    members: list[tuple[str, bytes | Path]] = [(DESCRIPTION, desc), (SIGNATURE, sig), ("rootfs.ext4", img)]
    return pack(tmp / f"{name}.swu", members + list(extra or []))


def _images(sw: dict[str, Any], slot: str = "b") -> list[dict[str, Any]]:
    return sw[MACHINE]["alma"][f"slot-{slot}"]["images"]  # type: ignore[no-any-return]


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def m(sw: dict[str, Any]) -> None:
        _images(sw)[0][key] = value

    return m


HOSTILE: dict[str, Callable[[dict[str, Any]], None]] = {
    "slot-b writes the running slot A": _set("device", "dev/disk/by-partlabel/APP"),
    "a whole disk": _set("device", "/dev/mmcblk0"),
    "dot-dot out of the partition dir": _set("device", "dev/disk/by-partlabel/../../../etc/passwd"),
    "another root prefix": _set("device", "/mnt/dev/disk/by-partlabel/APP_b"),
    "an attribute we never write": _set("installed-directly", True),
    "a file handler": _set("type", "archive"),
    "a second rootfs image": lambda sw: _images(sw).append(dict(_images(sw)[0])),
    "a shell script in the set": lambda sw: sw[MACHINE]["alma"]["slot-b"].update(
        scripts=[{"filename": "rootfs.ext4", "type": "shellscript", "sha256": "0" * 64}]
    ),
    "an embedded Lua script": lambda sw: sw.update({"embedded-script": "os.execute('reboot')"}),
    "a top-level image list": lambda sw: sw.update(images=list(_images(sw))),
    "a bootenv change": lambda sw: sw[MACHINE].update(bootenv=[{"name": "x", "value": "y"}]),
    "a selection hidden in the metadata": lambda sw: sw["alma"].update({"slot-b": {"images": list(_images(sw))}}),
    # the rootfs bytes armed as the UEFI capsule as well
    "one file as rootfs and as capsule": lambda sw: [
        _images(sw, s).append(
            {
                "filename": "rootfs.ext4",
                "type": "rawfile",
                "sha256": _images(sw, s)[0]["sha256"],
                "path": "var/lib/alma-ota/capsule/TEGRA_BL.Cap",
                "version": "99.0.0",
            }
        )
        for s in ("a", "b")
    ],  # fmt: skip
    "an image name outside the grammar": lambda sw: [
        _images(sw, s)[0].update(filename="rootfs.ext4;reboot") for s in ("a", "b")
    ],  # fmt: skip
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_reader_refuses_a_description_that_writes_outside_the_slots(tmp_path: Path, signer: tuple[bytes, bytes],
                                                                    case: str) -> None:  # fmt: skip
    swu = forge(tmp_path, signer, HOSTILE[case])
    with pytest.raises(S.SwuError, match="sw-description"):
        S.read_swu(swu)


def test_our_own_description_passes_both_checks(tmp_path: Path, signer: tuple[bytes, bytes]) -> None:
    swu = forge(tmp_path, signer, lambda sw: None)
    assert S.read_swu(swu).signed


def _agent(b: SimBoard, *args: str, stdin: bytes | None = None) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, "ALMA_OTA_ROOT": str(b.root), "PATH": f"{b.root / 'bin'}:{os.environ['PATH']}"}
    r = subprocess.run([sys.executable, str(AGENT), *args], input=stdin or b"", capture_output=True, env=env,
                       timeout=600)  # fmt: skip
    return r.returncode, json.loads(r.stdout.decode().strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(HOSTILE))
def test_agent_refuses_before_swupdate_a_signed_swu_that_writes_outside_the_target_slot(
    tmp_path: Path, signer: tuple[bytes, bytes], case: str
) -> None:
    require_swupdate()
    board = SimBoard(tmp_path / "boards", "h1", signer[0])
    running = (board.root / "dev/disk/by-partlabel/APP").read_bytes()
    data = forge(tmp_path, signer, HOSTILE[case]).read_bytes()
    assert _agent(board, "begin", "--run", RUN)[0] == 0
    rc, out = _agent(board, "receive", "--run", RUN, "--sha256", hashlib.sha256(data).hexdigest(),
                     "--size", str(len(data)), stdin=data)  # fmt: skip
    assert rc == 0, out
    rc, out = _agent(board, "install", "--run", RUN)
    assert rc == 2 and "refused" in str(out["error"]), out
    _untouched(board, running)


def _untouched(board: SimBoard, running: bytes) -> None:
    assert (board.root / "dev/disk/by-partlabel/APP").read_bytes() == running  # the running slot untouched
    assert not list((board.root / "data/alma-ota").glob("swupdate-*.log"))  # SWUpdate never ran
    st = load_state(board.root)["rootfs"]
    assert st["active"] == 0 and st["current"] == 0


def test_real_swupdate_itself_would_write_the_running_slot(tmp_path: Path, signer: tuple[bytes, bytes]) -> None:
    """Why the agent checks first: SWUpdate installs what a correctly signed description says."""
    require_swupdate()
    board = tmp_path / "board"
    app = board / "dev/disk/by-partlabel/APP"
    app.parent.mkdir(parents=True)
    app.write_bytes(b"\0" * 200_000)
    (board / "dev/disk/by-partlabel/APP_b").write_bytes(b"\0" * 200_000)
    (tmp_path / "cert.pem").write_bytes(signer[0])
    swu = forge(tmp_path, signer, HOSTILE["slot-b writes the running slot A"])
    (tmp_path / "swtmp").mkdir()
    r = subprocess.run([*swupdate_argv("-k", str(tmp_path / "cert.pem"), "-H", f"{MACHINE}:1.0", "-e", "alma,slot-b",
                        "-i", str(swu))], cwd=board, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TMPDIR": str(tmp_path / "swtmp")})  # fmt: skip
    assert "SWUPDATE successful" in r.stdout + r.stderr
    assert app.read_bytes() != b"\0" * 200_000


# ---- hostile cpio framing (the reader parses it before anything is trusted) ---------------------


def _member(name: bytes, data: bytes, *, namesize: int | None = None, size: int | None = None) -> bytes:
    raw = name + b"\0"
    fields = [1, 0o100644, 0, 0, 1, 0, len(data) if size is None else size, 0, 0, 0, 0,
              len(raw) if namesize is None else namesize, 0]  # fmt: skip
    head = b"070701" + b"".join(b"%08X" % f for f in fields) + raw
    head += b"\0" * (-len(head) % 4)
    return head + data + b"\0" * (-len(data) % 4)


def _desc() -> bytes:
    return _member(b"sw-description", b'{"software": {}}')


CPIO: dict[str, tuple[bytes, str]] = {
    "dot-dot name": (_desc() + _member(b"../../etc/shadow", b"x"), "not allowed"),
    "absolute name": (_desc() + _member(b"/etc/shadow", b"x"), "not allowed"),
    "name with ESC": (_desc() + _member(b"a\x1b[2Jb", b"x"), "not allowed"),
    "huge name length": (_member(b"sw-description", b"{}", namesize=0xFFFFFFFF), "name length"),
    "huge member size": (_member(b"sw-description", b"{}", size=0xFFFFFFF0), "past the end"),
    "non-hex header": (b"070701" + b"ZZZZZZZZ" * 13 + b"sw-description\0\0\0", "bad cpio header"),
    "header cut short": (_desc()[:60], "not a cpio"),
    "no trailer": (_desc(), "not a cpio"),
    "too many members": (_desc() + b"".join(_member(b"m%d" % i, b"") for i in range(80)), "more than"),
    "name twice": (_desc() + _member(b"a", b"1") + _member(b"a", b"2") + _member(b"TRAILER!!!", b""), "twice"),
}


@pytest.mark.parametrize("case", list(CPIO))
def test_reader_refuses_hostile_cpio_framing(tmp_path: Path, case: str) -> None:
    data, why = CPIO[case]
    p = tmp_path / "h.swu"
    p.write_bytes(data)
    with pytest.raises(S.SwuError, match=why):
        S.read_swu(p)


def test_the_layers_sw_description_template_passes_the_reader_and_the_agent(
    tmp_path: Path, signer: tuple[bytes, bytes]
) -> None:
    """What meta-swupdate makes of layers/meta-alma's template (capsule included) is not refused
    by the allowlists above: the desktop reader and the board agent's pre-SWUpdate check."""
    template = (Path(__file__).resolve().parents[2] / "layers/meta-alma/dynamic-layers/swupdate/recipes-core/images"
                / "files/sw-description").read_text()  # fmt: skip
    rootfs_name = f"alma-image-{MACHINE}.rootfs.ext4"
    files = {rootfs_name: rootfs_image(tmp_path / "r.ext4", "2.0.0").read_bytes(), "tegra-bl.cap": b"CAPSULE 36.5.0"}
    text = template.replace("@@MACHINE@@", MACHINE).replace("@@ALMA_OTA_VERSION@@", "2.0.0")
    text = text.replace("@@ALMA_OTA_LOWEST_BOOTLOADER@@", "36.4.0").replace("@@L4T_VERSION@@", "36.5.0")
    for name, data in files.items():
        text = text.replace(f"$swupdate_get_sha256({name})", hashlib.sha256(data).hexdigest())
    desc = text.encode()
    sig = sign_detached(desc, *signer)
    out = pack(tmp_path / "layer.swu", [(DESCRIPTION, desc), (SIGNATURE, sig), *files.items()])
    info = S.read_swu(out)
    assert info.capsule is not None and info.capsule.version == "36.5.0"
    sys.path.insert(0, str(AGENT.parent))
    try:
        from almaota import agent as A
    finally:
        sys.path.remove(str(AGENT.parent))
    got = A._read_swu(out)
    for target in ("a", "b"):
        assert [im["type"] for im in got.images[target]] == ["raw", "rawfile"]


# ---- the same tables through `alma verify` and the board's reader ------------------------------


def _agent_module() -> Any:
    sys.path.insert(0, str(AGENT.parent))
    try:
        from almaota import agent as A
    finally:
        sys.path.remove(str(AGENT.parent))
    return A


@pytest.mark.parametrize("case", list(HOSTILE))
def test_verify_refuses_the_hostile_descriptions(project: Path, alma, signer: tuple[bytes, bytes],  # type: ignore[no-untyped-def]  # noqa: F811
                                                 tmp_path: Path, case: str) -> None:  # fmt: skip
    d = build_deploy(project, MACHINE)
    forge(tmp_path, signer, HOSTILE[case]).replace(d.dir / f"alma-image-swu-{MACHINE}.swu")
    r = alma("verify", d.dir, "--root", project)
    assert r.code != 0 and "sw-description refused" in r.err + r.out


@pytest.mark.parametrize("case", list(CPIO))
def test_board_reader_refuses_hostile_cpio_framing(tmp_path: Path, case: str) -> None:
    data, why = CPIO[case]
    p = tmp_path / "h.swu"
    p.write_bytes(data)
    A = _agent_module()
    with pytest.raises(A.UserError, match=why):
        A._read_swu(p)


def test_an_unlisted_member_is_refused_by_desktop_verify_and_board(  # type: ignore[no-untyped-def]
    project: Path,  # noqa: F811
    alma,  # noqa: F811
    signer: tuple[bytes, bytes],
    tmp_path: Path,
) -> None:
    """SWUpdate skips a member no image names; nothing may ride along in an ALMA-OS .swu unread."""
    require_swupdate()
    swu = forge(tmp_path, signer, lambda sw: None, extra=[("payload.sh", b"#!/bin/sh\nreboot\n")])
    with pytest.raises(S.SwuError, match="does not list: payload.sh"):
        S.read_swu(swu)
    d = build_deploy(project, MACHINE)
    (d.dir / f"alma-image-swu-{MACHINE}.swu").write_bytes(swu.read_bytes())
    r = alma("verify", d.dir, "--root", project)
    assert r.code != 0 and "does not list: payload.sh" in r.err + r.out
    board = SimBoard(tmp_path / "boards", "u1", signer[0])
    running = (board.root / "dev/disk/by-partlabel/APP").read_bytes()
    data = swu.read_bytes()
    assert _agent(board, "begin", "--run", RUN)[0] == 0
    assert _agent(board, "receive", "--run", RUN, "--sha256", hashlib.sha256(data).hexdigest(),
                  "--size", str(len(data)), stdin=data)[0] == 0  # fmt: skip
    rc, out = _agent(board, "install", "--run", RUN)
    assert rc == 2 and "does not list: payload.sh" in out["error"], out
    _untouched(board, running)


def test_a_crc_member_whose_checksum_is_wrong_is_refused_as_by_swupdate(
    tmp_path: Path, signer: tuple[bytes, bytes]
) -> None:
    """cpio -H crc: each header's check field is the sum of the member's bytes; a payload whose
    sum differs (a flipped check digit here: the payload itself still matches its sha256) is
    refused by the desktop, as the real SWUpdate refuses it."""
    swu = forge(tmp_path, signer, lambda sw: None)
    assert S.read_swu(swu).format == "crc"
    data = bytearray(swu.read_bytes())
    at = data.index(b"rootfs.ext4\0") - 8  # the rootfs member's check field ends at its name
    data[at + 7] = ord("0") if data[at + 7] != ord("0") else ord("1")
    swu.write_bytes(bytes(data))
    with pytest.raises(S.SwuError, match="crc checksum"):
        S.read_swu(swu)
    require_swupdate()
    board = tmp_path / "board"
    (board / "dev/disk/by-partlabel").mkdir(parents=True)
    (board / "dev/disk/by-partlabel/APP_b").write_bytes(b"\0" * 200_000)
    (tmp_path / "cert.pem").write_bytes(signer[0])
    (tmp_path / "swtmp").mkdir()
    r = subprocess.run([*swupdate_argv("-k", str(tmp_path / "cert.pem"), "-H", f"{MACHINE}:1.0", "-e", "alma,slot-b",
                        "-i", str(swu))], cwd=board, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TMPDIR": str(tmp_path / "swtmp")})  # fmt: skip
    log = r.stdout + r.stderr
    assert "SWUPDATE successful" not in log and "Checksum WRONG" in log, log
