"""Admin access for release images: keys decided offline by the plan, refused
when missing or unusable, never a private key read or echoed."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import require_tool
from support_build import ADMIN_FPR, ADMIN_PUB, mark_checked_out, read_record

from alma.sshkeys import BadKey, parse_public_key, read_public_key_file

SAFE_LINE = re.compile(r"^[a-z0-9@.-]+ [A-Za-z0-9+/]+={0,2}( [A-Za-z0-9@._+-]{1,64})?$")


@pytest.fixture(autouse=True)
def _ready(project: Path, fakes: Path, probes) -> None:  # type: ignore[no-untyped-def]
    mark_checked_out(project)


def _conf(out: str) -> str:
    return "\n".join(ln.split("| ", 1)[1] for ln in out.splitlines() if ln.startswith("  | "))


def keygen(tmp_path: Path, kind: str, bits: int | None = None, comment: str = "k") -> Path:
    require_tool("ssh-keygen")
    path = tmp_path / f"id_{kind}{bits or ''}"
    argv = ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", comment, "-f", str(path)]
    if bits:
        argv += ["-b", str(bits)]
    subprocess.run(argv, check=True, capture_output=True)
    return path


def test_release_build_without_any_key_is_refused_by_the_plan(project, fakes, alma, admin_key):
    admin_key.unlink()
    for argv in (("build",), ("build", "--check")):  # one of the preflight problems
        code, out, err = alma(*argv)
        assert code == 2, argv
        assert "a release image needs an admin key" in err and "nobody can ever log into the board" in err
        assert "fix: alma build --admin-key ~/.ssh/id_ed25519.pub" in err and "--no-admin-access" in err
    assert read_record(fakes) == [] and not list(project.glob("build/*/alma-build*"))
    code, out, err = alma("build", "--dry-run")  # the plan is still shown, with the problem, and exit 2
    assert code == 2 and "a release image needs an admin key" in out and "commands:" in out
    assert "a release image needs an admin key" in err
    code, out, _ = alma("build", "--dry-run", "--json")
    assert code == 2 and json.loads(out)["problems"]


def test_development_build_needs_no_key(project, alma, admin_key):
    admin_key.unlink()
    dev = project / "kas/features/development.yml"
    dev.write_text('header:\n  version: 14\nlocal_conf_header:\n  alma-60-mode: |\n    ALMA_RELEASE = "0"\n')
    code, out, _ = alma("build", "--dry-run", "--feature", "development")
    assert code == 0
    assert "admin access: no key (development build" in out and "ALMA_ADMIN_KEYS" not in _conf(out)
    # the release feature after it wins again (kas: the last file named wins)
    rel = project / "kas/features/release.yml"
    rel.write_text('header:\n  version: 14\nlocal_conf_header:\n  alma-60-mode: |\n    ALMA_RELEASE = "1"\n')
    code, out, _ = alma("build", "--dry-run", "--feature", "development", "--feature", "release")
    assert code == 2 and "needs an admin key" in out


def test_default_key_from_home_is_used_and_the_plan_says_so(alma, admin_key):
    code, out, _ = alma("build", "--dry-run")
    assert code == 0
    assert f"admin access: ssh alma@<board> with 1 key(s) from the default {admin_key}" in out
    assert ADMIN_FPR in out and "--admin-key FILE" in out
    conf = _conf(out)
    assert 'ALMA_ADMIN_ACCESS = "1"' in conf
    assert f'ALMA_ADMIN_KEYS = "{ADMIN_PUB}"' in conf


def test_default_key_order_is_ed25519_then_ecdsa_then_rsa(tmp_path, alma, admin_key):
    ssh = admin_key.parent
    admin_key.unlink()
    ecdsa = keygen(tmp_path, "ecdsa")
    rsa = keygen(tmp_path, "rsa", 3072)
    (ssh / "id_rsa.pub").write_text(Path(f"{rsa}.pub").read_text())
    (ssh / "id_ecdsa.pub").write_text(Path(f"{ecdsa}.pub").read_text())
    _, out, _ = alma("build", "--dry-run")
    assert f"from the default {ssh / 'id_ecdsa.pub'}" in out
    (ssh / "id_ecdsa.pub").unlink()
    _, out, _ = alma("build", "--dry-run")
    assert f"from the default {ssh / 'id_rsa.pub'}" in out


def test_admin_key_option_replaces_the_default_and_repeats(tmp_path, alma):
    a, b = keygen(tmp_path, "ed25519", comment="ops@lab"), keygen(tmp_path, "ecdsa", comment="ci")
    code, out, _ = alma("build", "--dry-run", "--admin-key", f"{a}.pub", "--admin-key", f"{b}.pub",
                        "--admin-key", f"{a}.pub")  # fmt: skip
    assert code == 0
    conf = _conf(out)
    keys = re.search(r'ALMA_ADMIN_KEYS = "([^"]*)"', conf)
    assert keys is not None
    lines = keys.group(1).split(";")
    assert lines == [Path(f"{a}.pub").read_text().strip(), Path(f"{b}.pub").read_text().strip()]
    assert ADMIN_PUB not in conf and "2 key(s) from --admin-key" in out


def test_alma_toml_admin_keys(project, tmp_path, alma):
    k = keygen(tmp_path, "ed25519")
    (project / "keys").mkdir()
    (project / "keys" / "ops.pub").write_text(Path(f"{k}.pub").read_text())
    (project / "alma.toml").write_text('[image]\nadmin_keys = ["keys/ops.pub"]\n')
    from alma.settings import _config

    _config.cache_clear()
    code, out, _ = alma("build", "--dry-run")
    _config.cache_clear()
    assert code == 0 and "from alma.toml [image] admin_keys" in out
    assert Path(f"{k}.pub").read_text().split()[1] in _conf(out)


def test_private_key_is_refused_never_read_or_echoed(tmp_path, project, alma):
    k = keygen(tmp_path, "ed25519")
    secret = k.read_text()
    body = secret.splitlines()[1]  # a line of the private key's base64
    code, out, err = alma("build", "--admin-key", str(k))
    assert code == 2
    assert "this is a PRIVATE key" in err and "never copied" in err and f"pass the public half: {k}.pub" in err
    assert body not in out + err
    for f in project.rglob("*"):
        if f.is_file():
            assert body not in f.read_text(errors="replace"), f


def test_pem_and_putty_private_keys_are_refused(tmp_path):
    for head in ("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n", "PuTTY-User-Key-File-3: ssh-ed25519\n"):
        p = tmp_path / "k"
        p.write_text(head)
        with pytest.raises(BadKey, match="PRIVATE key"):
            read_public_key_file(p)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"hello world\n", "unsupported key type 'hello'"),
        (b"ssh-ed25519\n", "not an OpenSSH public key"),
        (b"ssh-ed25519 AAAA!!!!\n", "not valid base64"),
        (b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHxw\n", "truncated or corrupt"),
        (b"ssh-rsa " + ADMIN_PUB.split()[1].encode() + b"\n", "its data is another kind of key"),
        (b"\x00\xff\xfebinary", "not a text file"),
        ((ADMIN_PUB + "\n" + ADMIN_PUB + "\n").encode(), "holds 2 key lines"),
        (b"", "holds 0 key lines"),
        (b"A" * 20000, "too large"),
    ],
)
def test_malformed_key_files_are_refused_with_the_reason(tmp_path, project, alma, content, why):
    p = tmp_path / "bad.pub"
    p.write_bytes(content)
    code, out, err = alma("build", "--dry-run", "--admin-key", str(p))
    assert code == 2 and why in err, err
    assert "Traceback" not in err and not list(project.glob("build/*/alma-build.conf"))


def test_short_rsa_key_is_refused(tmp_path):
    k = keygen(tmp_path, "rsa", 1024)
    with pytest.raises(BadKey, match="RSA key of 1024 bits; OpenSSH needs at least 2048"):
        read_public_key_file(Path(f"{k}.pub"))


def test_missing_and_directory_key_files(tmp_path):
    with pytest.raises(BadKey, match="no such file"):
        read_public_key_file(tmp_path / "nope.pub")
    with pytest.raises(BadKey, match="is a directory"):
        read_public_key_file(tmp_path)


def test_hostile_comment_never_reaches_bitbake(tmp_path, alma):
    blob = ADMIN_PUB.split()[1]
    p = tmp_path / "k.pub"
    p.write_text(f'ssh-ed25519 {blob} ${{@os.system("touch /tmp/pwned")}}"; rm -rf /\n')
    code, out, _ = alma("build", "--dry-run", "--admin-key", str(p))
    assert code == 0
    assert f'ALMA_ADMIN_KEYS = "ssh-ed25519 {blob}"' in _conf(out)


def test_no_admin_access_seals_the_image_and_excludes_admin_key(tmp_path, alma):
    code, out, _ = alma("build", "--dry-run", "--no-admin-access")
    assert code == 0 and 'ALMA_ADMIN_ACCESS = "0"' in _conf(out) and "sealed appliance" in out
    code, _, err = alma("build", "--dry-run", "--no-admin-access", "--admin-key", str(tmp_path / "x.pub"))
    assert code == 2 and "exclude each other" in err


def test_json_plan_carries_the_note(alma):
    import json

    code, out, _ = alma("build", "--dry-run", "--json")
    plan = json.loads(out)
    assert code == 0 and any(ADMIN_FPR in n for n in plan["notes"]) and ADMIN_PUB in plan["config"]


@pytest.mark.parametrize(("kind", "bits"), [("ed25519", None), ("ecdsa", 384), ("rsa", 2048)])
def test_fingerprint_matches_ssh_keygen(tmp_path, kind, bits):
    k = keygen(tmp_path, kind, bits)
    real = subprocess.run(["ssh-keygen", "-l", "-f", f"{k}.pub"], capture_output=True, text=True, check=True)
    assert read_public_key_file(Path(f"{k}.pub")).fingerprint == real.stdout.split()[1]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_a_clean_key_line_or_refused(text):
    try:
        key = parse_public_key(text)
    except BadKey as exc:
        assert exc.message.isprintable()  # nothing of the input can smuggle controls into the terminal
        return
    assert SAFE_LINE.match(key.line), key.line


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_any_comment_after_a_real_key_is_kept_only_if_plain(comment):
    key = parse_public_key(f"{ADMIN_PUB.rsplit(' ', 1)[0]} {comment}")
    assert SAFE_LINE.match(key.line) and "\n" not in key.line and '"' not in key.line and "$" not in key.line
