"""Supply-chain facts of an image, from the files its own build wrote to the deploy dir.

The shapes are the ones oe-core scarthgap writes at the commit kas/alma.lock.yml pins
(543550522f831479f07d332a40ba343c53ae1065); file:line below is at that commit.

- cve-check (``INHERIT += "cve-check"``): ``<IMAGE_LINK_NAME>.json`` -> ``${IMAGE_NAME}.json``
  (meta/classes/cve-check.bbclass:52-54 CVE_CHECK_MANIFEST_JSON, 273-281 written and linked).
  ``{"version": "1", "package": [{"name", "layer", "version", "products": [{"product",
  "cvesInRecord": "Yes"|"No"}], "issue": [{"id", "summary", "scorev2", "scorev3", "scorev4",
  "vector", "vectorString", "status": "Patched"|"Unpatched"|"Ignored", "link", "detail"?,
  "description"?}]}]}`` (cve-check.bbclass:566-643 cve_write_data_json). Scores are the NVD
  database's text ("9.8", "0.0" when NVD has none). ``cvesInRecord: "No"``: the product is
  unknown to NVD (cve-check.bbclass:594-597), a blind spot, not a clean result.
- NVD data date: the database ``${DL_DIR}/CVE_CHECK/nvdcve_2-2.db`` whose mtime is its last
  update (meta/recipes-core/meta/cve-update-nvd2-native.bb:37, 74-77).
- SPDX 2.2 (create-spdx, the default): ``<IMAGE_LINK_NAME>.spdx.tar.zst``, a tar of every SPDX
  document the image refers to plus ``index.json`` ``{"documents": [{"filename",
  "documentNamespace", "sha1"}]}`` (meta/classes/create-spdx-2.2.bbclass:1107-1170). A binary
  package is ``SPDXRef-Package-<pkg>`` (meta/lib/oe/sbom.py:21-22) with ``name``,
  ``versionInfo`` and ``licenseDeclared`` (create-spdx-2.2.bbclass:682-685); a LICENSE that is
  no SPDX id becomes ``LicenseRef-<name>`` (``LicenseRef-Proprietary``).
- SPDX 3.0.1 (create-spdx-3.0): ``<IMAGE_LINK_NAME>.spdx.json`` (meta/lib/oe/spdx30_tasks.py:
  1254-1290), JSON-LD ``{"@context": ..., "@graph": [...]}`` (meta/lib/oe/spdx30.py:1780-1797):
  ``software_Package`` objects (``spdxId``, ``name``, ``software_packageVersion``; binary
  packages have ``software_primaryPurpose: "install"``, spdx30_tasks.py:636, while source
  downloads and the rootfs are software_Package with purpose source/patch/archive), licences as
  ``simplelicensing_LicenseExpression`` objects tied by ``Relationship`` objects (``from``,
  ``relationshipType`` hasDeclaredLicense / hasConcludedLicense, ``to``: [ids]).

Threat model (docs/verify.md, "Supply-chain facts"): these files come from a build tree that
may hold anything: huge, not UTF-8, nested deeply, duplicate ids, wrong types, a tar with
links or absurd headers. Each is a :class:`SbomError` (exit 2) naming the file; nothing is
extracted to disk, every size is bounded before it is read, and the tar reader is our own
(headers parsed with a budget: CPython's tarfile has had quadratic pax parsing).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alma import loader
from alma.errors import UserError

MAX_JSON_BYTES = 256 << 20  # one SBOM/CVE document; a 1,500-package image's is ~10 MB
MAX_TAR_BYTES = 1 << 30  # the SPDX 2.2 tarball, inflated (a budget of time: it is streamed)
# one document inside it (a package's doc lists its files: ~25 MB for 50k files); it is held
# in memory while parsed, so this bounds what a zstd bomb can cost
MAX_MEMBER_BYTES = 64 << 20
MAX_PAX_BYTES = 64 << 10  # one pax extended header (a long member name)
STATUSES = ("Patched", "Unpatched", "Ignored")
# SPDX 3 software_Package objects that are not installed packages: a recipe's sources and
# patches (spdx30_tasks.py:373-376, 415-424) and the image's rootfs archive (1089-1094)
SOURCE_PURPOSES = frozenset({"source", "patch", "archive"})
SEVERITIES = ("critical", "high", "medium", "low", "none")
NVD_DB = Path("CVE_CHECK") / "nvdcve_2-2.db"
_CVE_ID = re.compile(r"^CVE-\d{4}-\d{4,}$")
# Recipes of the boot chain on Orin (meta-tegra): a blind spot there is the worst kind.
BOOT_CHAIN = re.compile(r"(tegra|edk2|uefi|optee|bootloader|cboot|mb1|mb2|tos-|nvidia-kernel-oot|l4t|u-boot)")


class SbomError(UserError):
    def __init__(self, path: Path | str, why: str) -> None:
        super().__init__(
            f"{path}: {why}",
            hint="rebuild the image (the file is written by the image's own build), or move the file aside",
        )


def grade(scorev2: float | None, scorev3: float | None, scorev4: float | None) -> tuple[str, str | None, float]:
    """(severity, CVSS version, score) by the best version present: v4, else v3.x, else v2.

    NVD writes "0.0" for a version it has no score of (older entries carry only v2), so a
    version is present when its score is above 0. v3/v4 ranges: >= 9.0 critical, >= 7.0 high,
    >= 4.0 medium, > 0 low. v2 has no critical band; NVD's v2 ranges: 7.0-10.0 high, 4.0-6.9
    medium, 0-3.9 low. A v2 high spans v3's high and critical, so :data:`COUNTS_AS_CRITICAL`
    counts an unpatched v2-only high toward ``cve_unpatched_critical`` (a gate cannot rule
    critical out from a v2 score; docs/verify.md, "CVE severity")."""
    for version, score in (("4.0", scorev4), ("3.x", scorev3)):
        if score is not None and score > 0.0:
            if score >= 9.0:
                return "critical", version, score
            if score >= 7.0:
                return "high", version, score
            return ("medium" if score >= 4.0 else "low"), version, score
    if scorev2 is not None and scorev2 > 0.0:
        return ("high" if scorev2 >= 7.0 else "medium" if scorev2 >= 4.0 else "low"), "2.0", scorev2
    return "none", None, 0.0


@dataclass
class Issue:
    package: str
    cve: str
    status: str
    severity: str
    detail: str | None  # cve-check's status key (fixed-version, cpe-incorrect, ...)
    reason: str | None = None  # the waiver's reason: cve-check's "description"
    cvss: str | None = None  # the version graded by ("4.0", "3.x", "2.0"), None when unscored
    score: float = 0.0

    @property
    def critical(self) -> bool:
        """Counts toward cve_unpatched_critical: critical by v3/v4, or high by v2 alone."""
        return self.severity == "critical" or (self.severity == "high" and self.cvss == "2.0")

    def shown(self) -> str:
        """The issue as the facts list it: package, id, severity and the CVSS version and score."""
        score = f" (CVSS {self.cvss} {self.score:.1f})" if self.cvss else ""
        return f"{self.package} {self.cve} {self.severity}{score}"


@dataclass
class CveReport:
    path: Path
    packages: int = 0
    issues: list[Issue] = field(default_factory=list)
    blind_spots: list[str] = field(default_factory=list)  # packages NVD knows no product of

    def unpatched_critical(self) -> int:
        return sum(1 for i in self.issues if i.status == "Unpatched" and i.critical)

    def counts(self) -> dict[str, dict[str, int]]:
        out = {s: dict.fromkeys(SEVERITIES, 0) for s in STATUSES}
        for i in self.issues:
            out[i.status][i.severity] += 1
        return out


def _read_json_file(path: Path) -> Any:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise SbomError(path, f"cannot read: {exc.strerror}") from None
    if size > MAX_JSON_BYTES:
        raise SbomError(path, f"{size} bytes, over the {MAX_JSON_BYTES >> 20} MiB a document may have")
    return _parse_json(path.read_bytes(), path)


def _parse_json(data: bytes, where: Path | str) -> Any:
    try:
        return loader.loads_json(loader.decode(data, where, what="JSON document"), where)
    except loader.LoadError as exc:
        raise SbomError(where, exc.why) from None


def _want(cond: bool, path: Path | str, why: str) -> None:
    if not cond:
        raise SbomError(path, why)


def _score(value: Any, path: Path, where: str) -> float | None:
    if value is None or value == "":
        return None
    _want(isinstance(value, str | int | float) and not isinstance(value, bool), path, f"{where}: score {value!r}")
    try:
        score = float(value)
    except ValueError:
        raise SbomError(path, f"{where}: score {value!r} is not a number") from None
    _want(0.0 <= score <= 10.0, path, f"{where}: score {value!r} is outside 0-10")
    return score


def read_cve(path: Path) -> CveReport:
    """An image's (or cve-summary.json's) cve-check JSON, validated field by field."""
    data = _read_json_file(path)
    _want(
        isinstance(data, dict) and isinstance(data.get("package"), list),
        path,
        'not a cve-check JSON: no "package" list',
    )
    _want(data.get("version") == "1", path, f'cve-check JSON version {data.get("version")!r}, expected "1"')
    report = CveReport(path)
    seen_pkgs: set[str] = set()
    for n, pkg in enumerate(data["package"]):
        where = f"package[{n}]"
        _want(isinstance(pkg, dict), path, f"{where} is not an object")
        name = pkg.get("name")
        _want(isinstance(name, str) and name != "", path, f"{where}: name {name!r} is not a package name")
        _want(name not in seen_pkgs, path, f"{where}: package {name!r} appears twice")
        seen_pkgs.add(name)
        products = pkg.get("products", [])
        _want(isinstance(products, list), path, f"{name}: products is not a list")
        known = []
        for p in products:
            _want(isinstance(p, dict) and p.get("cvesInRecord") in ("Yes", "No"), path, f"{name}: product {p!r}")
            known.append(p["cvesInRecord"] == "Yes")
        if not products or not any(known):
            report.blind_spots.append(name)
        issues = pkg.get("issue", [])
        _want(isinstance(issues, list), path, f"{name}: issue is not a list")
        seen_ids: set[str] = set()
        for i in issues:
            _want(isinstance(i, dict), path, f"{name}: an issue is not an object")
            cve = i.get("id")
            _want(isinstance(cve, str) and _CVE_ID.match(cve) is not None, path, f"{name}: issue id {cve!r}")
            _want(cve not in seen_ids, path, f"{name}: {cve} listed twice")
            seen_ids.add(cve)
            status = i.get("status")
            _want(status in STATUSES, path, f"{name} {cve}: status {status!r} (want {'/'.join(STATUSES)})")
            # decode_cve_status (meta/lib/oe/cve_check.py) splits CVE_STATUS "key: reason" into
            # detail (the key, always set) and description (the reason, when one was given)
            detail, reason = i.get("detail"), i.get("description")
            _want(detail is None or isinstance(detail, str), path, f"{name} {cve}: detail is not text")
            _want(reason is None or isinstance(reason, str), path, f"{name} {cve}: description is not text")
            scores = (_score(i.get(f"scorev{v}"), path, f"{name} {cve}") for v in (2, 3, 4))
            sev, cvss, score = grade(*scores)
            reason = reason.strip() if reason else None
            report.issues.append(Issue(name, cve, status, sev, detail or None, reason or None, cvss, score))
    report.packages = len(seen_pkgs)
    return report


@dataclass
class Sbom:
    path: Path
    format: str  # "SPDX-2.2" | "SPDX-3.0.1"
    licences: dict[str, str] = field(default_factory=dict)  # package -> declared licence expression
    other: Path | None = None  # the SBOM of the other format that was not read (named in the facts)
    count: int | None = None  # installed packages, when the format tells them apart from names (SPDX 3 ids)
    # packages the document holds but no relationship from the image reaches: not this image's
    uncounted: list[str] = field(default_factory=list)

    def by_licence(self) -> dict[str, int]:
        return dict(sorted(Counter(self.licences.values()).items()))

    def proprietary(self) -> list[str]:
        """Packages whose licence is not an SPDX list licence: Proprietary, or any LicenseRef-*
        (create-spdx writes LicenseRef-<name> for a LICENSE that is no SPDX id: NVIDIA's
        firmware and L4T binaries among them), each needing a reviewer's look."""
        return sorted(p for p, lic in self.licences.items() if "proprietary" in lic.lower() or "LicenseRef-" in lic)

    def unknown(self) -> list[str]:
        return sorted(p for p, lic in self.licences.items() if lic in ("", "NOASSERTION", "NONE"))


def _licence(value: Any) -> str:
    return value if isinstance(value, str) else "NOASSERTION"


_RELATIONSHIPS = ("Relationship", "LifecycleScopedRelationship")  # spdx30.py: the second is a subclass


def _image_packages(
    roots: list[str], packages: dict[str, str], contains: dict[str, list[str]],
    made_by: dict[str, list[str]], inputs: dict[str, list[str]],
) -> set[str]:  # fmt: skip
    """The installed packages the image reaches from the SBOM's root elements (the rootfs and
    the image files, spdx30_tasks.py create_image_sbom_spdx 1251-1282): what a root
    ``contains``, and the ``hasInput`` of the build that ``hasOutput`` it (the rootfs build's
    inputs are the installed packages, collect_build_package_inputs 1030-1070; the image
    build's input is the rootfs, create_image_spdx 1232-1245). A package is not walked
    further: its recipe's build inputs (sources, build dependencies) are not in the image."""
    found: set[str] = set()
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        found.update(t for t in contains.get(node, ()) if t in packages)
        for build in made_by.get(node, ()):
            for t in inputs.get(build, ()):
                if t in packages:
                    found.add(t)
                else:
                    todo.append(t)
    return found


def read_spdx3(path: Path) -> Sbom:
    data = _read_json_file(path)
    _want(isinstance(data, dict) and isinstance(data.get("@graph"), list), path, 'not SPDX 3 JSON-LD: no "@graph" list')
    ctx = data.get("@context")
    _want(isinstance(ctx, str | list) and "3.0" in str(ctx), path, f"@context {str(ctx)[:80]!r} is not SPDX 3.0")
    packages: dict[str, str] = {}  # spdxId -> name
    exprs: dict[str, str] = {}
    rels: list[tuple[str, str, list[str]]] = []
    ids: set[str] = set()
    roots: list[str] = []
    contains: dict[str, list[str]] = {}
    made_by: dict[str, list[str]] = {}  # element -> the builds that hasOutput it
    inputs: dict[str, list[str]] = {}  # build -> its hasInput
    for n, obj in enumerate(data["@graph"]):
        _want(isinstance(obj, dict), path, f"@graph[{n}] is not an object")
        typ, oid = obj.get("type"), obj.get("spdxId", obj.get("@id"))
        _want(isinstance(typ, str), path, f"@graph[{n}]: type {typ!r}")
        if oid is not None:
            _want(isinstance(oid, str), path, f"@graph[{n}]: spdxId {oid!r}")
            _want(oid not in ids, path, f"@graph[{n}]: spdxId {oid} appears twice")
            ids.add(oid)
        if typ == "software_Package":
            name, purpose = obj.get("name"), obj.get("software_primaryPurpose")
            _want(isinstance(name, str) and isinstance(oid, str), path, f"@graph[{n}]: package without name/spdxId")
            _want(purpose is None or isinstance(purpose, str), path, f"@graph[{n}]: primary purpose {purpose!r}")
            # a recipe's source downloads and the rootfs are software_Package too: only what
            # the image installs counts (SOURCE_PURPOSES, docs/formats.md)
            if purpose not in SOURCE_PURPOSES and "software_downloadLocation" not in obj:
                packages[oid] = name
        elif typ == "software_Sbom":
            root = obj.get("rootElement", [])
            _want(isinstance(root, list) and all(isinstance(r, str) for r in root), path, f"@graph[{n}]: rootElement")
            roots += root
        elif typ == "simplelicensing_LicenseExpression":
            expr = obj.get("simplelicensing_licenseExpression")
            _want(isinstance(expr, str) and isinstance(oid, str), path, f"@graph[{n}]: licence expression {expr!r}")
            exprs[oid] = expr
        elif typ in _RELATIONSHIPS:
            kind, frm, to = obj.get("relationshipType"), obj.get("from"), obj.get("to", [])
            _want(isinstance(kind, str) and isinstance(frm, str), path, f"@graph[{n}]: relationship {kind!r}")
            _want(isinstance(to, list) and all(isinstance(t, str) for t in to), path, f"@graph[{n}]: 'to' {to!r}")
            if kind in ("hasDeclaredLicense", "hasConcludedLicense"):
                rels.append((kind, frm, to))
            elif kind == "contains":
                contains.setdefault(frm, []).extend(to)
            elif kind == "hasOutput":
                for t in to:
                    made_by.setdefault(t, []).append(frm)
            elif kind == "hasInput":
                inputs.setdefault(frm, []).extend(to)
    _want(bool(roots), path, "no software_Sbom with a rootElement: not an image SBOM (create-spdx-3.0 writes one)")
    for _k, frm, to in rels:  # a licence that points nowhere is not "no assertion": the document is broken
        missing = [t for t in (frm, *to) if t not in ids]
        _want(not missing, path, f"licence relationship from {frm} refers to missing id(s): {', '.join(missing)}")
    image = _image_packages(roots, packages, contains, made_by, inputs)
    by_id: dict[str, str] = {oid: "NOASSERTION" for oid in packages if oid in image}
    for kind in ("hasConcludedLicense", "hasDeclaredLicense"):  # declared wins: applied last
        for k, frm, to in rels:
            if k == kind and frm in by_id and to and to[0] in exprs and exprs[to[0]] != "NOASSERTION":
                by_id[frm] = exprs[to[0]]
    sbom = Sbom(path, "SPDX-3.0.1", count=len(by_id))  # two ids are two packages, even with one name
    sbom.uncounted = sorted({name for oid, name in packages.items() if oid not in image})
    origin: dict[str, str] = {}
    for oid, lic in by_id.items():
        name = packages[oid]
        _want(
            name not in sbom.licences or sbom.licences[name] == lic,
            path,
            f"package {name!r} has two licences: {sbom.licences.get(name)!r} ({origin.get(name)}) and {lic!r} ({oid})",
        )
        sbom.licences[name], origin[name] = lic, oid
    return sbom


class _Inflated:
    """The SBOM tarball's zstd stream, read in order, every frame (pzstd, which bitbake uses
    when BB_NUMBER_THREADS > 1, writes one frame per chunk: bitbake lib/bb/compress/zstd.py),
    with a budget on the total inflated: a zstd bomb costs time up to the budget, never memory."""

    def __init__(self, fh: Any, path: Path) -> None:
        import zstandard

        self.reader = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True)
        self.path, self.total, self.error = path, 0, zstandard.ZstdError

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer only at the end of the stream)."""
        chunks: list[bytes] = []
        want = n
        while want > 0:
            try:
                chunk = self.reader.read(min(want, 1 << 20))
            except self.error as exc:
                raise SbomError(self.path, f"not a zstd stream: {exc}") from None
            if not chunk:
                break
            self.total += len(chunk)
            _want(self.total <= MAX_TAR_BYTES, self.path, f"inflates to more than {MAX_TAR_BYTES >> 20} MiB; refused")
            chunks.append(chunk)
            want -= len(chunk)
        return b"".join(chunks)

    def skip(self, n: int) -> None:
        while n > 0:
            got = len(self.read(min(n, 1 << 20)))
            if not got:
                return
            n -= got


def _tar_documents(stream: _Inflated, path: Path) -> Iterator[tuple[str, bytes]]:
    """(name, body) of each regular file of an uncompressed tar (ustar/pax), in order, one at a
    time; links and devices refused, headers and bodies bounded. Nothing is written anywhere."""
    seen: set[str] = set()
    pos, long_name = 0, None
    while True:
        head = stream.read(512)
        if len(head) < 512 or head == b"\0" * 512:
            return
        try:
            size = int(head[124:136].split(b"\0")[0].strip() or b"0", 8)
        except ValueError:
            raise SbomError(path, f"tar header at {pos}: bad size field") from None
        kind = head[156:157]
        padded = (size + 511) // 512 * 512
        if kind in (b"x", b"g", b"L"):
            _want(size <= MAX_PAX_BYTES, path, f"tar extended header of {size} bytes (limit {MAX_PAX_BYTES})")
        name = long_name or head[0:100].split(b"\0")[0].decode("utf-8", "replace")
        prefix = head[345:500].split(b"\0")[0].decode("utf-8", "replace") if head[257:262] == b"ustar" else ""
        if prefix and not long_name:
            name = f"{prefix}/{name}"
        if kind in (b"0", b"\0"):
            _want(
                size <= MAX_MEMBER_BYTES, path, f"tar member {name!r}: {size} bytes, over {MAX_MEMBER_BYTES >> 20} MiB"
            )
        elif kind not in (b"x", b"g", b"L"):
            raise SbomError(path, f"tar member {name!r} is not a regular file (type {kind!r})")
        body = stream.read(size)
        _want(len(body) == size, path, f"tar member at {pos} is truncated")
        stream.skip(padded - size)
        pos += 512 + padded
        if kind == b"x":
            for rec in body.decode("utf-8", "replace").split("\n"):
                key, _, value = rec.partition(" ")[2].partition("=")
                if key == "path":
                    long_name = value
            continue
        if kind == b"L":
            long_name = body.rstrip(b"\0").decode("utf-8", "replace")
            continue
        if kind == b"g":
            continue
        long_name = None
        _want("/" not in name.strip("./") and name not in seen, path, f"tar member {name!r}: nested or twice")
        seen.add(name)
        yield name, body


IMAGE_PREFIX = "SPDXRef-Image-"  # the image's own package (meta/lib/oe/sbom.py get_image_spdxid)


@dataclass
class _Doc22:
    """What one SPDX 2.2 document of the tarball says that the facts need (the rest is dropped)."""

    namespace: str | None
    packages: dict[str, tuple[str, str]]  # SPDXID -> (name, declared licence)
    image: str | None = None  # the image package's SPDXID: this is the image's document
    contains: list[str] = field(default_factory=list)  # what the image CONTAINS: [DocumentRef-X:]SPDXRef-…
    refs: dict[str, str] = field(default_factory=dict)  # externalDocumentId -> spdxDocument (namespace)


def _spdx22_doc(doc: Any, path: Path, fname: str) -> _Doc22:
    _want(isinstance(doc, dict) and isinstance(doc.get("packages", []), list), path, f"{fname}: not SPDX 2.2")
    ns = doc.get("documentNamespace")
    out = _Doc22(ns if isinstance(ns, str) else None, {})
    for pkg in doc.get("packages", []):
        _want(isinstance(pkg, dict), path, f"{fname}: a package is not an object")
        sid, name = pkg.get("SPDXID"), pkg.get("name")
        if isinstance(sid, str) and sid.startswith(IMAGE_PREFIX):
            _want(out.image is None, path, f"{fname}: two image packages ({out.image}, {sid})")
            out.image = sid
        elif isinstance(sid, str) and sid.startswith("SPDXRef-Package-"):
            _want(isinstance(name, str), path, f"{fname}: package {sid} has no name")
            lic = pkg.get("licenseDeclared")
            _want(lic is None or isinstance(lic, str), path, f"{fname}: {name}: licenseDeclared {lic!r} is not text")
            out.packages[sid] = (name, _licence(lic))
    if out.image is None:
        return out
    refs = doc.get("externalDocumentRefs", [])
    rels = doc.get("relationships", [])
    _want(isinstance(refs, list) and isinstance(rels, list), path, f"{fname}: externalDocumentRefs/relationships")
    for ref in refs:
        _want(isinstance(ref, dict), path, f"{fname}: an externalDocumentRef is not an object")
        rid, target = ref.get("externalDocumentId"), ref.get("spdxDocument")
        _want(isinstance(rid, str) and isinstance(target, str), path, f"{fname}: externalDocumentRef {rid!r}")
        out.refs[rid] = target
    for rel in rels:
        _want(isinstance(rel, dict), path, f"{fname}: a relationship is not an object")
        if rel.get("spdxElementId") == out.image and rel.get("relationshipType") == "CONTAINS":
            to = rel.get("relatedSpdxElement")
            _want(isinstance(to, str), path, f"{fname}: CONTAINS {to!r}")
            out.contains.append(to)
    return out


def read_spdx22(path: Path) -> Sbom:
    """The tarball streamed member by member: each document is parsed as it passes (only its
    packages' names and licences, and the image document's CONTAINS, are kept), so memory is
    one document, whatever the tar holds; index.json (written last,
    create-spdx-2.2.bbclass:1159-1170) then says which documents are the image's.

    The packages that count are the ones the image package (``SPDXRef-Image-<IMAGE_NAME>``)
    CONTAINS, through its ``externalDocumentRefs`` (combine_spdx, create-spdx-2.2.bbclass:
    1060-1072): the tar also holds recipe, runtime and dependency documents, and a package
    nothing in the image contains is not in the image."""
    docs: dict[str, _Doc22] = {}
    index: Any = None
    try:
        with path.open("rb") as fh:
            for name, body in _tar_documents(_Inflated(fh, path), path):
                parsed = _parse_json(body, f"{path}:{name}")
                if name == "index.json":
                    index = parsed
                else:
                    docs[name] = _spdx22_doc(parsed, path, name)
    except OSError as exc:
        raise SbomError(path, f"cannot read: {exc.strerror}") from None
    _want(index is not None, path, "no index.json in the SBOM tarball")
    _want(isinstance(index, dict) and isinstance(index.get("documents"), list), path, "index.json: no documents list")
    listed: dict[str, str] = {}  # namespace -> filename, of the documents index.json lists
    for n, entry in enumerate(index["documents"]):
        fname = entry.get("filename") if isinstance(entry, dict) else None
        _want(isinstance(fname, str) and fname in docs, path, f"index.json documents[{n}]: {fname!r} not in tar")
        assert isinstance(fname, str)
        if docs[fname].namespace:
            listed[str(docs[fname].namespace)] = fname
    images = [f for f in listed.values() if docs[f].image]
    _want(len(images) == 1, path, f"{len(images)} image documents (a package {IMAGE_PREFIX}…), expected one")
    image = docs[images[0]]
    contained: dict[tuple[str, str], None] = {}
    for to in image.contains:
        ext, _, sid = to.rpartition(":")
        fname = listed.get(image.refs.get(ext, "")) if ext else images[0]
        _want(
            fname is not None and sid in docs[fname].packages,
            path,
            f"{images[0]}: the image CONTAINS {to}, which no document of the tarball has",
        )
        assert fname is not None
        contained[(fname, sid)] = None
    sbom = Sbom(path, "SPDX-2.2")
    origin: dict[str, str] = {}
    for fname, sid in contained:
        name, lic = docs[fname].packages[sid]
        # one package, two licences: merging would drop one of them without a word
        _want(
            name not in sbom.licences or sbom.licences[name] == lic,
            path,
            f"package {name!r} has two licences: {sbom.licences.get(name)!r} in {origin.get(name)} "
            f"and {lic!r} in {fname}",
        )
        sbom.licences[name], origin[name] = lic, fname
    sbom.uncounted = sorted(
        {name for f in listed.values() for sid, (name, _) in docs[f].packages.items() if (f, sid) not in contained}
        - set(sbom.licences)
    )
    return sbom


@dataclass
class SupplyChain:
    sbom: Sbom | None
    cve: CveReport | None
    nvd_date: str | None
    nvd_source: str

    def facts(self) -> dict[str, tuple[Any, str]]:
        """fact name -> (value, source); the names are documented in docs/formats.md."""
        out: dict[str, tuple[Any, str]] = {}
        s, c = self.sbom, self.cve
        if s is not None:
            src = f"{s.path}: {s.format}"
            fmt_src = src + (f" (this build's; also present, not read: {s.other.resolve().name})" if s.other else "")
            out["sbom_format"] = (s.format, fmt_src)
            left = f"; {len(s.uncounted)} package(s) nothing in the image contains not counted" if s.uncounted else ""
            out["sbom_package_count"] = (
                s.count if s.count is not None else len(s.licences),
                f"{src} packages the image contains{left}",
            )
            out["licences"] = (s.by_licence(), f"{src} declared licence per package")
            out["licence_proprietary"] = (s.proprietary(), f"{src}: licences naming Proprietary or LicenseRef-*")
            out["licence_unknown"] = (s.unknown(), f"{src}: NOASSERTION/NONE")
        else:
            for name in ("sbom_format", "sbom_package_count", "licences", "licence_proprietary", "licence_unknown"):
                out[name] = (None, "no SPDX SBOM in the deploy dir (create-spdx off?)")
        if c is not None:
            src = f"{c.path}: cve-check"
            counts = c.counts()
            prop = set(s.proprietary()) if s else set()
            ignored = [
                {"package": i.package, "id": i.cve, "detail": i.detail, "reason": i.reason}
                for i in c.issues
                if i.status == "Ignored"
            ]
            graded = "best CVSS version present: v4, v3.x (>= 9 critical, >= 7 high), else v2 (>= 7 high)"
            out["cve_package_count"] = (c.packages, src)
            out["cve_counts"] = (counts, f"{src}: status x severity ({graded})")
            out["cve_unpatched_critical"] = (
                c.unpatched_critical(),
                f"{src}: Unpatched, critical by CVSS v4/v3.x or high by v2 alone (v2 has no critical band)",
            )
            out["cve_unpatched_high"] = (counts["Unpatched"]["high"], src)
            out["cve_unpatched"] = (sorted(i.shown() for i in c.issues if i.status == "Unpatched"), src)
            out["cve_ignored"] = (ignored, f"{src}: every Ignored, its status key (detail) and reason (description)")
            out["cve_ignored_without_detail"] = (
                sorted(f"{d['package']} {d['id']}" for d in ignored if not d["reason"]),
                f"{src}: Ignored without a reason (cve-check's description is empty)",
            )
            out["cve_blind_spots"] = (sorted(c.blind_spots), f"{src}: cvesInRecord No (NVD knows no such product)")
            out["cve_blind_spots_critical"] = (
                sorted(p for p in c.blind_spots if p in prop or BOOT_CHAIN.search(p)),
                f"{src}: blind spots that are Proprietary (SBOM) or in the boot chain",
            )
        else:
            for name in CVE_FACTS:
                out[name] = (None, "no cve-check JSON in the deploy dir (the security feature is off)")
        out["nvd_data_date"] = (self.nvd_date, self.nvd_source)
        return out


CVE_FACTS = (
    "cve_package_count",
    "cve_counts",
    "cve_unpatched_critical",
    "cve_unpatched_high",
    "cve_unpatched",
    "cve_ignored",
    "cve_ignored_without_detail",
    "cve_blind_spots",
    "cve_blind_spots_critical",
)


def _first(*paths: Path) -> Path | None:
    return next((p for p in paths if p.is_file()), None)


_STAMP = re.compile(r"\.rootfs-(\d{14})\.")  # IMAGE_NAME = ${IMAGE_LINK_NAME}-${DATETIME} (UTC)


def _stamp_of(path: Path) -> str | None:
    m = _STAMP.search(path.resolve().name)
    return m.group(1) if m else None


def _this_build(path: Path | None, stamp: str | None) -> Path | None:
    """``path`` when it is this image's: a file whose IMAGE_NAME stamp is another's belongs to
    another build, and its facts would be false ones (SbomError, exit 2)."""
    if path is None or stamp is None:
        return path
    other = _stamp_of(path)
    _want(
        other is None or other == stamp,
        path,
        f"is {path.resolve().name}, stamped {other}, but the image's bundle is stamped {stamp}: "
        "a supply-chain file of another build",
    )
    return path


def read_supply_chain(deploy: Path, link_name: str, downloads: Path | None, stamp: str | None = None) -> SupplyChain:
    """Everything above for one image (``link_name`` = IMAGE_LINK_NAME, ``<image>-<machine>.rootfs``;
    ``stamp`` = the bundle's DATETIME: every supply-chain file must carry the same one).

    Absent files are unknown facts (null, with where they were looked for); present but bad
    files, or files of another build, are a SbomError."""
    spdx3 = _first(deploy / f"{link_name}.spdx.json")
    spdx2 = _first(deploy / f"{link_name}.spdx.tar.zst")
    other = None
    if spdx3 and spdx2 and stamp is not None and _stamp_of(spdx3) != stamp and _stamp_of(spdx2) == stamp:
        spdx3, other = None, spdx3  # a stale SPDX 3 file beside this build's 2.2 tarball
    elif spdx3 and spdx2:
        spdx2, other = None, spdx2
    spdx3, spdx2 = _this_build(spdx3, stamp), _this_build(spdx2, stamp)
    sbom = read_spdx3(spdx3) if spdx3 else (read_spdx22(spdx2) if spdx2 else None)
    if sbom is not None and other is not None:
        sbom.other = other
    tmp = deploy.parent.parent.parent  # <tmp>/deploy/images/<machine>
    # the image's own report; else the build's summary (every recipe cve-check saw, same shape:
    # cve-check.bbclass:114-135 generate_json_report, CVE_CHECK_SUMMARY_DIR = ${LOG_DIR}/cve)
    cve_path = _first(deploy / f"{link_name}.json", tmp / "log" / "cve" / "cve-summary.json")
    cve_path = _this_build(cve_path, stamp)
    cve = read_cve(cve_path) if cve_path else None
    nvd_date, nvd_source = None, "no NVD database found"
    for db in ([downloads / NVD_DB] if downloads else []) + [tmp / "sysroots" / NVD_DB]:
        if db.is_file():
            nvd_date = datetime.fromtimestamp(os.stat(db).st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            nvd_source = f"{db}: mtime (cve-update-nvd2-native's last update)"
            break
    return SupplyChain(sbom, cve, nvd_date, nvd_source)
