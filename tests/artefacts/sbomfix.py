"""SPDX and cve-check files in the shapes oe-core scarthgap writes at the pinned commit
(kas/alma.lock.yml: openembedded-core 543550522f831479f07d332a40ba343c53ae1065).

Provenance (file:line at that commit):
- cve-check image JSON ``${IMAGE_NAME}.json`` + link ``${IMAGE_LINK_NAME}.json``:
  meta/classes/cve-check.bbclass:52-54 (CVE_CHECK_MANIFEST_JSON), 273-281 (json.dump, indent=2,
  update_symlinks); one package entry: cve-check.bbclass:592-605 (products with cvesInRecord
  "Yes"/"No", name, layer, version = EXTENDPE+PV), issues 622-642 (id, summary, scorev2,
  scorev3, scorev4, vector, vectorString, status, link, detail/description when set).
  Scores are the NVD database's TEXT columns (get_cve_info, cve-check.bbclass:437-444).
- NVD database ``${DL_DIR}/CVE_CHECK/nvdcve_2-2.db``: cve-update-nvd2-native.bb:37; its mtime
  is the last update (74-77).
- SPDX 2.2 ``${IMAGE_NAME}.spdx.tar.zst`` + ``index.json``: meta/classes/create-spdx-2.2.bbclass:
  1107-1170 (members ``<doc.name>.spdx.json``, index {"documents": [{filename,
  documentNamespace, sha1}]}, sorted by filename); package docs 668-685 (name = pkg,
  SPDXID ``SPDXRef-Package-<pkg>`` meta/lib/oe/sbom.py:21-22, versionInfo = PV,
  licenseDeclared); recipe docs 564-587 (``SPDXRef-Recipe-<pn>``).
- SPDX 3.0.1 ``${IMAGE_NAME}.spdx.json``: meta/lib/oe/spdx30_tasks.py:1254-1290; the JSON-LD
  envelope meta/lib/oe/spdx30.py:1780-1797 (``@context`` = CONTEXT_URLS[0], ``@graph``);
  ``spdxId`` is the id alias (spdx30.py:2195), ``software_Package`` (5174, name,
  software_packageVersion 5210), ``simplelicensing_LicenseExpression`` (3811),
  ``Relationship`` from/relationshipType/to (3062-3151); licences linked by
  hasDeclaredLicense / hasConcludedLicense (meta/lib/oe/sbom30.py:1064-1090); binary packages
  are the ones with primary purpose "install" (spdx30_tasks.py:636), sources and the rootfs
  are software_Package too (see spdx3_graph).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

SPDX3_CONTEXT = "https://spdx.org/rdf/3.0.1/spdx-context.jsonld"
NS = "http://spdx.org/spdxdocs"


def issue(
    cve: str,
    status: str,
    v3: str = "0.0",
    v4: str = "0.0",
    detail: str | None = None,
    reason: str | None = None,
    v2: str = "0.0",
) -> dict[str, Any]:
    """One issue as cve_write_data_json writes it: ``detail`` is CVE_STATUS's key (always set for
    Patched/Ignored by decode_cve_status, meta/lib/oe/cve_check.py), ``description`` the reason
    after "key: " when the waiver gave one."""
    out: dict[str, Any] = {
        "id": cve,
        "summary": f"summary of {cve}",
        "scorev2": v2,
        "scorev3": v3,
        "scorev4": v4,
        "vector": "NETWORK",
        "vectorString": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H",
        "status": status,
        "link": f"https://nvd.nist.gov/vuln/detail/{cve}",
    }
    if detail:
        out["detail"] = detail
    if reason:
        out["description"] = reason
    return out


def package(name: str, version: str, issues: list[dict[str, Any]], known: bool = True, layer: str = "meta") -> dict:
    return {
        "name": name,
        "layer": layer,
        "version": version,
        "products": [{"product": name, "cvesInRecord": "Yes" if known else "No"}],
        "issue": issues,
    }


def default_cve() -> dict[str, Any]:
    return {
        "version": "1",
        "package": [
            package(
                "openssl",
                "3.2.4",
                [
                    issue("CVE-2024-0001", "Patched", v3="9.8", detail="fixed-version"),
                    issue("CVE-2024-0002", "Unpatched", v3="7.0"),
                    issue(
                        "CVE-2024-0003",
                        "Ignored",
                        v3="9.1",
                        detail="not-applicable-config",
                        reason="built without the affected engine",
                    ),  # fmt: skip
                    issue("CVE-2024-0004", "Ignored", v3="5.0", detail="not-applicable-config"),  # no reason: a finding
                ],
            ),
            package("busybox", "1.36.1", [issue("CVE-2023-0005", "Unpatched", v3="6.9", v4="8.9")]),
            package("tegra-binaries", "36.5.0", [], known=False, layer="meta-tegra"),
            package("alma-guard", "0.1.0", [], known=False, layer="meta-alma"),
        ],
    }


STAMP = "20261130120000"  # alma_deployfix's bundle stamp: these files are of the same build


def write_cve(deploy: Path, link: str, data: Any | None = None, raw: bytes | None = None, stamp: str = STAMP) -> Path:
    real = deploy / f"{link}-{stamp}.json"
    real.write_bytes(raw if raw is not None else json.dumps(data or default_cve(), indent=2).encode())
    (deploy / f"{link}.json").unlink(missing_ok=True)
    os.symlink(real.name, deploy / f"{link}.json")
    return real


LICENCES = {
    "openssl": "Apache-2.0",
    "busybox": "GPL-2.0-only AND bzip2-1.0.4",
    "tegra-binaries": "LicenseRef-Proprietary",
    "alma-guard": "MIT",
    "mystery": "NOASSERTION",
}


def spdx3_graph(licences: dict[str, str], contained: set[str] | None = None) -> dict[str, Any]:
    """The image SBOM as create_sbom expands it (sbom30.py:1035-1094): beside each binary package
    (spdx30_tasks.py:622-627, primary purpose "install" forced at 636, hasConcludedLicense
    704-708) the recipe's source downloads are software_Package too (415-424: name = the file,
    purpose source/patch 373-376, a downloadLocation, hasConcludedLicense 557-563), and so is
    the rootfs (1089-1094: purpose archive, no licence). Enums are written compact
    (spdx30.py:1736-1737: "install")."""
    graph: list[dict[str, Any]] = []

    def licensed(pkg: dict[str, Any], n: int, lic: str) -> None:
        lid = f"{NS}/lic-{n}"
        graph.append(pkg)
        graph.append(
            {"type": "simplelicensing_LicenseExpression", "spdxId": lid, "simplelicensing_licenseExpression": lic}
        )
        graph.append(
            {
                "type": "Relationship",
                "spdxId": f"{NS}/rel-{n}",
                "from": pkg["spdxId"],
                "relationshipType": "hasConcludedLicense",
                "to": [lid],
            }  # fmt: skip
        )

    for n, (name, lic) in enumerate(sorted(licences.items())):
        licensed({"type": "software_Package", "spdxId": f"{NS}/package/{name}", "name": name,
                  "software_packageVersion": "1.0", "software_primaryPurpose": "install"}, n, lic)  # fmt: skip
    licensed({"type": "software_Package", "spdxId": f"{NS}/source/1", "name": "busybox-1.36.1.tar.bz2",
              "software_primaryPurpose": "source",
              "software_downloadLocation": "https://busybox.net/downloads/busybox-1.36.1.tar.bz2"},
             len(licences), "GPL-2.0-only")  # fmt: skip
    rootfs, build = f"{NS}/rootfs/alma-image", f"{NS}/build/rootfs"
    graph.append({"type": "software_Package", "spdxId": rootfs, "name": "alma-image",
                  "software_primaryPurpose": "archive"})  # fmt: skip
    # the image's packages: the rootfs build's inputs (collect_build_package_inputs, spdx30_tasks.py
    # 1030-1070), the build that hasOutput the rootfs (1097-1105); the SBOM's root is the rootfs
    # (create_image_sbom_spdx 1262-1282; sbom30.py create_sbom 1035-1046)
    installed = [f"{NS}/package/{n}" for n in sorted(licences) if contained is None or n in contained]
    graph += [
        {"type": "build_Build", "spdxId": build, "build_buildType": "https://openembedded.org/rootfs"},
        {"type": "LifecycleScopedRelationship", "spdxId": f"{NS}/rel-out", "from": build,
         "relationshipType": "hasOutput", "scope": "build", "to": [rootfs]},
        {"type": "LifecycleScopedRelationship", "spdxId": f"{NS}/rel-in", "from": build,
         "relationshipType": "hasInput", "scope": "build", "to": installed},
        {"type": "software_Sbom", "spdxId": f"{NS}/sbom", "name": "alma-image",
         "software_sbomType": ["build"], "rootElement": [rootfs]},
    ]  # fmt: skip
    return {"@context": SPDX3_CONTEXT, "@graph": graph}


def write_spdx3(
    deploy: Path, link: str, licences: dict[str, str] | None = None, raw: bytes | None = None, stamp: str = STAMP
) -> Path:
    real = deploy / f"{link}-{stamp}.spdx.json"
    real.write_bytes(raw if raw is not None else json.dumps(spdx3_graph(licences or LICENCES)).encode())
    os.symlink(real.name, deploy / f"{link}.spdx.json")
    return real


IMAGE_NAME = f"alma-image-jetson-orin-nano-devkit.rootfs-{STAMP}"


def spdx22_tar(
    licences: dict[str, str],
    extra: list[tarfile.TarInfo] | None = None,
    more: dict[str, dict[str, Any]] | None = None,
    contained: set[str] | None = None,
) -> bytes:
    """One package document per licence entry (as create-spdx writes one per package), plus
    ``more``: document name -> {package: licenseDeclared} for documents with several, and the
    image's own document (combine_spdx, create-spdx-2.2.bbclass:1013-1072): the package
    ``SPDXRef-Image-<IMAGE_NAME>``, an externalDocumentRef per package document and a
    CONTAINS from the image to each package of ``contained`` (default: every package)."""
    buf = io.BytesIO()
    index: dict[str, Any] = {"documents": []}
    docs = {name: {name: lic} for name, lic in licences.items()} | (more or {})
    image_sid = "SPDXRef-Image-" + IMAGE_NAME.replace("_", "-")
    image_doc: dict[str, Any] = {
        "spdxVersion": "SPDX-2.2",
        "name": IMAGE_NAME,
        "documentNamespace": f"{NS}/{IMAGE_NAME}-uuid",
        "packages": [{"SPDXID": image_sid, "name": "alma-image", "versionInfo": "1.0"}],
        "externalDocumentRefs": [],
        "relationships": [],
    }
    members: dict[str, dict[str, Any]] = {}
    for name, pkgs in sorted(docs.items()):
        doc = {
            "spdxVersion": "SPDX-2.2",
            "name": name,
            "documentNamespace": f"{NS}/{name}-uuid",
            "packages": [{"SPDXID": f"SPDXRef-Package-{pkg}", "name": pkg, "versionInfo": "1.0",
                          "licenseDeclared": lic, "licenseConcluded": "NOASSERTION"}
                         for pkg, lic in pkgs.items()],
        }  # fmt: skip
        members[name] = doc
        ref = f"DocumentRef-{name}"
        image_doc["externalDocumentRefs"].append(
            {"externalDocumentId": ref, "spdxDocument": doc["documentNamespace"],
             "checksum": {"algorithm": "SHA1", "checksumValue": "0" * 40}}
        )  # fmt: skip
        for pkg in pkgs:
            if contained is None or pkg in contained:
                image_doc["relationships"].append(
                    {"spdxElementId": image_sid, "relationshipType": "CONTAINS",
                     "relatedSpdxElement": f"{ref}:SPDXRef-Package-{pkg}"}
                )  # fmt: skip
    members[IMAGE_NAME] = image_doc
    with tarfile.open(fileobj=buf, mode="w|") as tar:
        for name, doc in members.items():
            body = json.dumps(doc, sort_keys=True).encode()
            info = tarfile.TarInfo(f"{name}.spdx.json")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
            index["documents"].append(
                {
                    "filename": info.name,
                    "documentNamespace": doc["documentNamespace"],
                    "sha1": hashlib.sha1(body).hexdigest(),
                }  # fmt: skip
            )
        for info in extra or []:
            tar.addfile(info)
        index["documents"].sort(key=lambda x: x["filename"])
        body = json.dumps(index, sort_keys=True).encode()
        info = tarfile.TarInfo("index.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def write_spdx22(
    deploy: Path, link: str, tar_bytes: bytes | None = None, raw: bytes | None = None, stamp: str = STAMP
) -> Path:
    import zstandard

    real = deploy / f"{link}-{stamp}.spdx.tar.zst"
    data = raw if raw is not None else zstandard.ZstdCompressor().compress(tar_bytes or spdx22_tar(LICENCES))
    real.write_bytes(data)
    os.symlink(real.name, deploy / f"{link}.spdx.tar.zst")
    return real


def write_nvd_db(downloads: Path, mtime: float) -> Path:
    db = downloads / "CVE_CHECK" / "nvdcve_2-2.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    db.write_bytes(b"SQLite format 3\0")
    os.utime(db, (mtime, mtime))
    return db
