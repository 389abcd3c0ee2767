"""The one tar header reader (alma.tegraflash.headers) attacked from its invariants: the
pax ReDoS of CVE-2024-6232, sparse-map floods (old-GNU extension blocks, pax 0.1 and 1.0
maps), malformed sparse headers, a corrupt header mid-archive, a metadata flood over the
archive budget; and agreement with tarfile and GNU tar on the archives GNU tar writes.

Every hostile kind must be refused (UserError, exit 2) by verify (`reader.scan`) *and*
flash (`unpack`), quickly and in bounded memory, on every interpreter the station runs
(the bench, bench/bench_flash_hostile.py, measures 3.11.2, 3.11.7, 3.12 and 3.13)."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from flash import hostile_tar as H

from alma.errors import UserError
from alma.tegraflash import headers as hd
from alma.tegraflash import reader
from alma.tegraflash.stream import BundleStream
from alma.tegraflash.unpack import Budget, unpack

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, kind: str) -> Path:
    p = tmp_path / f"{kind}.tegraflash.tar.gz"
    p.write_bytes(H.gz(H.KINDS[kind]()))
    return p


@pytest.mark.parametrize("kind", sorted(H.KINDS))
def test_every_hostile_kind_is_refused_by_verify_and_by_flash(tmp_path: Path, kind: str) -> None:
    b = _write(tmp_path, kind)
    t0 = time.process_time()  # CPU, not wall: the machine's load does not count
    with pytest.raises(UserError) as by_verify:
        reader.scan(b)
    with pytest.raises(UserError) as by_flash:
        unpack(b, tmp_path / "work" / "bundle", None, budget=Budget(margin=0))
    assert time.process_time() - t0 < 30  # the bench measures < 2 s
    assert "refused" in by_verify.value.message and "refused" in by_flash.value.message
    assert sorted(os.listdir(tmp_path / "work")) == []  # nothing half-unpacked is left


def test_hostile_kinds_are_refused_in_bounded_memory_in_a_fresh_interpreter(tmp_path: Path) -> None:
    """The 0.36 MB old-GNU map flood took 607 MB through tarfile; here every kind together
    stays far below 100 MB of peak RSS (a fresh process, so the figure is this reader's)."""
    paths = [str(_write(tmp_path, k)) for k in sorted(H.KINDS)]
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from alma.errors import UserError\n"
        "from alma.tegraflash import reader\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        reader.scan(Path(p))\n"
        "        print('ACCEPTED', p)\n"
        "    except UserError:\n"
        "        pass\n"
        # VmHWM: this process image's peak (ru_maxrss would keep the forking parent's)
        "print([ln.split()[1] for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, check=True).stdout
    assert "ACCEPTED" not in out
    assert int(out.split()[-1]) < 100 * 1024  # KiB


def test_pax_redos_header_is_linear(tmp_path: Path) -> None:
    """CVE-2024-6232's shape (digits and `hdrcharset=` without a newline): tarfile on 3.11.7
    spends seconds per 64 KiB header here, quadratically more for bigger ones; the reader
    looks at each byte once."""
    data = b"0" * (1 << 20) + b"1 hdrcharset=" * 10_000
    t0 = time.process_time()  # CPU, not wall: the machine's load does not count
    with pytest.raises(hd.MalformedHeader):
        hd.parse_pax(data, 0)
    assert time.process_time() - t0 < 30  # quadratic: minutes; linear: well under 1 s


def test_a_corrupt_header_mid_archive_is_refused_not_taken_as_the_end(tmp_path: Path) -> None:
    """tarfile stopped at the bad checksum and verify said 'complete'; GNU tar reports it."""
    b = _write(tmp_path, "corrupt-header-midway")
    with pytest.raises(UserError, match="checksum mismatch"):
        reader.scan(b)
    gnu = subprocess.run(["tar", "-tzf", str(b)], capture_output=True, text=True, check=False)
    assert gnu.returncode == 2  # the reference agrees: a corrupt archive, not an end


def test_malformed_sparse_headers_are_refused_not_crashes(tmp_path: Path) -> None:
    for kind, why in (
        ("sparse-bad-number", "not a number"),
        ("sparse-truncated-map", "ends early"),
        ("pax-0.1-bad-map", "not a decimal number"),
        ("sparse-map-larger-than-data", "the archive stores 4"),
    ):
        with pytest.raises(UserError, match=why):
            reader.scan(_write(tmp_path, kind))


def test_the_metadata_budget_covers_the_whole_archive(tmp_path: Path) -> None:
    """17 pax headers of 1 MiB: each under the 16 MiB per-header cap, together over the budget."""
    with pytest.raises(UserError, match="more than 16 MiB of tar metadata"):
        reader.scan(_write(tmp_path, "metadata-flood"))


def test_an_archive_without_its_end_blocks_is_refused(tmp_path: Path) -> None:
    b = tmp_path / "cut.tegraflash.tar.gz"
    b.write_bytes(H.gz(H.member(b".env.initrd-flash", H.ENV) + H.member(b"initrd-flash", b"x")))
    with pytest.raises(UserError, match="end-of-archive"):
        reader.scan(b)


def _tree(base: Path) -> Path:
    d = base / "d"
    d.mkdir()
    with open(d / "sparse.img", "wb") as fh:
        fh.truncate(40 << 20)
        fh.seek(3 << 20)
        fh.write(os.urandom(5000))
        fh.seek(30 << 20)
        fh.write(b"tail")
    (d / ("n" * 150)).write_text("long name\n")
    (d / "sub").mkdir()
    (d / "sub" / ("l" * 120)).symlink_to("../" + "n" * 150)
    os.link(d / "sparse.img", d / "hard")
    (d / "env").write_bytes(H.ENV)
    return d


def _mine(path: Path) -> list[tuple[object, ...]]:
    with open(path, "rb") as fh:
        s = BundleStream(fh, path.stat().st_size)
        return [(t.name, t.type, t.size, t.linkname, t.sparse, t.offset_data) for t in hd.headers(s)]


def _tarfile(path: Path) -> list[tuple[object, ...]]:
    out = []
    with tarfile.open(path) as t:
        for x in t:
            sparse = (
                [tuple(p) for p in x.sparse if p != (0, 0) or x.type != tarfile.GNUTYPE_SPARSE] if x.sparse else None
            )
            kind = tarfile.REGTYPE if x.type == tarfile.GNUTYPE_SPARSE else x.type
            out.append((x.name, kind, x.size, x.linkname, sparse, x.offset_data))
    return out


@pytest.mark.parametrize(
    "opts",
    [
        ["--format=gnu"],
        ["--format=oldgnu"],
        ["--format=ustar"],
        ["--format=posix"],
        ["--format=posix", "--sparse-version=0.0"],
        ["--format=posix", "--sparse-version=0.1"],
        ["--format=posix", "--sparse-version=1.0"],
    ],
)
def test_reads_what_gnu_tar_writes_as_tarfile_does(tmp_path: Path, opts: list[str]) -> None:
    tar = shutil.which("tar")
    if tar is None:
        pytest.skip("GNU tar not installed")
    d = _tree(tmp_path)
    if opts == ["--format=ustar"]:
        (d / ("n" * 150)).unlink()  # ustar cannot store a 150-byte name without a prefix split
        (d / "sub" / ("l" * 120)).unlink()
    out = tmp_path / "t.tar.gz"
    sparse_opt = [] if opts == ["--format=ustar"] else ["--sparse"]  # ustar has no sparse members
    subprocess.run([tar, *sparse_opt, *opts, "-czf", str(out), "-C", str(d), "."], check=True)
    mine = _mine(out)
    assert mine == _tarfile(out)
    sparse = [m for m in mine if str(m[0]).endswith("sparse.img")]
    assert sparse and (bool(sparse[0][4]) == bool(sparse_opt)), "the sparse member keeps its map"


def test_unpack_keeps_holes_of_every_sparse_format(tmp_path: Path) -> None:
    tar = shutil.which("tar")
    if tar is None:
        pytest.skip("GNU tar not installed")
    d = _tree(tmp_path)
    (d / ".env.initrd-flash").write_bytes(H.ENV)
    want = (d / "sparse.img").read_bytes()
    for i, v in enumerate(("oldgnu", "0.0", "0.1", "1.0")):
        fmt = ["--format=oldgnu"] if v == "oldgnu" else ["--format=posix", f"--sparse-version={v}"]
        out = tmp_path / f"{i}.tegraflash.tar.gz"
        subprocess.run([tar, "--sparse", *fmt, "-czf", str(out), "-C", str(d), "."], check=True)
        u = unpack(out, tmp_path / f"w{i}" / "bundle", None, budget=Budget(margin=0))
        got = u.root / "sparse.img"
        assert got.read_bytes() == want, v
        assert got.stat().st_blocks * 512 < 1 << 20, v  # holes stay holes


FLOOD_HEADERS = 190_000


@pytest.fixture(scope="module")
def header_flood(tmp_path_factory: pytest.TempPathFactory) -> Path:
    many = H.header(b"d", 0, b"5") * FLOOD_HEADERS  # one directory, again and again: legal, slow to work through
    b = tmp_path_factory.mktemp("flood") / "many.tegraflash.tar.gz"
    b.write_bytes(gzip.compress(H.bundle(many), compresslevel=1))
    return b


def test_ctrl_c_is_honoured_while_verify_parses_headers(header_flood: Path) -> None:
    """SIGINT reaches a verify that is parsing headers (tarfile's regex held it for minutes).
    Sent once the child is 1000 headers in; it must stop before the last header, whatever
    the machine's speed or load (no sleep guessing how far the parse got)."""
    code = (
        "import sys; from pathlib import Path; from alma.tegraflash import reader\n"
        "inner, seen = reader.headers, [0]\n"
        "def counted(stream):\n"
        "    for ti in inner(stream):\n"
        "        seen[0] += 1\n"
        "        if seen[0] == 1000:\n"
        "            print('go', flush=True)\n"
        "        yield ti\n"
        "reader.headers = counted\n"
        "try:\n    reader.scan(Path(sys.argv[1]))\n"
        "except KeyboardInterrupt:\n    print(seen[0], flush=True); sys.exit(130)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(header_flood)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "go"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    assert int(proc.stdout.read()) < FLOOD_HEADERS  # interrupted mid-parse, not after it


def test_the_flash_cancel_flag_is_honoured_while_parsing_headers(
    tmp_path: Path, header_flood: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancel flag, set 1000 headers in, stops the unpack within a few headers (a check
    only after the parse would read all 190,000): counted, not timed."""
    from alma.errors import Interrupted

    cancel = threading.Event()
    seen = {"all": 0, "after": 0}
    inner = reader.headers

    def counted(stream):  # type: ignore[no-untyped-def]
        for ti in inner(stream):
            seen["all"] += 1
            seen["after"] += cancel.is_set()
            if seen["all"] == 1000:
                cancel.set()
            yield ti

    monkeypatch.setattr(reader, "headers", counted)
    with pytest.raises(Interrupted):
        unpack(header_flood, tmp_path / "work" / "bundle", None, budget=Budget(margin=0), cancel=cancel)
    assert seen["after"] < 1000, seen
    assert os.listdir(tmp_path / "work") == []


def test_global_pax_keys_are_bounded_over_the_archive(tmp_path: Path) -> None:
    """Each 'g' header under the per-header key cap, 300,000 keys together: refused at the
    2nd header (the reader copied every global key into each later member: minutes, 245 MB)."""
    t0 = time.process_time()  # CPU, not wall: the machine's load does not count
    with pytest.raises(UserError, match="more than 1024 keys"):
        reader.scan(_write(tmp_path, "pax-global-key-flood"))
    assert time.process_time() - t0 < 10


def test_many_members_after_global_keys_cost_no_copy(tmp_path: Path) -> None:
    """1000 global keys (under the cap) and 20,000 members: linear, no per-member copy."""
    b = tmp_path / "g.tegraflash.tar.gz"
    b.write_bytes(H.gz(H.pax_global_key_flood(headers=1, members=20_000)))
    t0 = time.process_time()  # CPU, not wall: the machine's load does not count
    scan = reader.scan(b)
    assert "initrd-flash" in scan.members
    assert time.process_time() - t0 < 20  # the copying reader: 20,000 copies of 1000 keys


def test_a_global_key_is_overridden_by_the_members_own_pax_header() -> None:
    """As tarfile does: the member's 'x' path wins over a later 'g' path."""
    tar = (
        H.member(b".env.initrd-flash", H.ENV)
        + H.pax(H.pax_record(b"path", b"mine"))
        + H.pax(H.pax_record(b"path", b"global"), kind=b"g")
        + H.member(b"orig", b"1")
        + H.member(b"next", b"2")
        + H.END
    )

    class S(io.BytesIO):
        @property
        def pos(self) -> int:
            return self.tell()

    ours = [t.name for t in hd.headers(S(tar))]
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        theirs = [m.name for m in t]
    assert ours == theirs == [".env.initrd-flash", "mine", "global"]


def test_symlinks_naming_links_resolve_in_linear_time(tmp_path: Path) -> None:
    """``a12 -> a11/a11/...``, each level naming the one below ~25 times: the checker expanded
    every name again (25**12 steps: verify and flash hung, no signal checked); each link is
    resolved once now. Run in a child so the old code's hang is a failure, not a stuck suite."""
    b = tmp_path / "links.tegraflash.tar.gz"
    b.write_bytes(H.gz(H.symlink_power()))
    code = (
        "import sys\nfrom pathlib import Path\n"
        "from alma.tegraflash import reader\nfrom alma.tegraflash.unpack import Budget, unpack\n"
        "s = reader.scan(Path(sys.argv[1]))\n"
        "assert 'a12' in s.members or s.complete, s\n"
        "unpack(Path(sys.argv[1]), Path(sys.argv[2]), None, budget=Budget(margin=0))\n"
        "print('ok')\n"
    )
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", code, str(b), str(tmp_path / "work" / "bundle")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "ok"
    assert time.monotonic() - t0 < 60
    assert os.readlink(tmp_path / "work" / "bundle" / "a1").startswith("a0/a0")


def test_a_symlink_walk_deeper_than_any_member_is_refused(tmp_path: Path) -> None:
    """Members are at most 64 deep, so a link whose walk goes deeper names nothing the bundle
    has; refusing it keeps each step of the walk bounded (the path it builds is <= 64 names)."""
    b = tmp_path / "deep.tegraflash.tar.gz"
    # 49 names through a link to ".": the walk stays at the top; fine
    b.write_bytes(H.gz(H.bundle(H.header(b"d", 0, b"2", linkname=b"."), H.header(b"x", 0, b"2", linkname=b"d/" * 49))))
    reader.scan(b)
    deep = H.pax(H.pax_record(b"linkpath", b"/".join([b"e"] * 70))) + H.header(b"y", 0, b"2", linkname=b"e")
    b.write_bytes(H.gz(H.bundle(deep)))
    with pytest.raises(UserError, match="resolves deeper than 64"):
        reader.scan(b)


def test_directories_implied_by_deep_paths_count_against_the_name_cap(tmp_path: Path) -> None:
    """20,000 empty files 60 deep under distinct top dirs imply 1.2 million directories; the
    checker kept every one uncounted (266 MB, a minute). They count like members now."""
    b = tmp_path / "dirs.tegraflash.tar.gz"
    b.write_bytes(H.gz(H.implied_dir_flood()))
    with pytest.raises(UserError, match="more than 200000 names"):
        reader.scan(b)
