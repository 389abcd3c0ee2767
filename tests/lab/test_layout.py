"""tools/board-layout.toml (what `alma lab` assembles a virtual board from) says exactly what
layers/meta-alma's recipes install: every file with its mode, link, unit and its preset, user
and Python tree. A recipe change without the layout (or the reverse) fails here."""

from __future__ import annotations

import re
from pathlib import Path

from alma.lab import layout

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "layers/meta-alma/recipes-alma"
# bitbake's values for the image (usrmerge distro, conf/distro/alma.conf)
VARS = {
    "${sysconfdir}": "/etc",
    "${systemd_system_unitdir}": "/usr/lib/systemd/system",
    "${systemd_unitdir}": "/usr/lib/systemd",
    "${libexecdir}": "/usr/libexec",
    "${datadir}": "/usr/share",
    "${bindir}": "/usr/bin",
    "${ALMA_ADMIN_USER}": "alma",
}
_INSTALL = re.compile(
    r"install\s+(?:-D\s+)?-m\s+(\d+)\s+(?:-o \S+ -g \S+\s+)?(\$\{S\}|\$\{WORKDIR\})/(\S+)\s*\\?\s*\$\{D\}(\S+)"
)
_LINK = re.compile(r"ln -sf (/\S+) \$\{D\}(\S+)")
# Files written from the build's settings: `install -m MODE ${VAR} ${D}DEST`, `printf ... > ${D}DEST`
_FROM_VAR = re.compile(r"install\s+-m\s+(\d+)\s+\$\{(\w+)\}\s+\$\{D\}(\S+)")
_PRINTF = re.compile(r"printf\s[^>]*>\s*\$\{D\}(\S+)")
# Files a recipe writes from build-time values, not from the tree (the lab writes its own):
# the admin's keys, the OTA certificate and client config.
GENERATED = {"authorized_keys"}
DISTRO = "layers/meta-alma/conf/distro/alma.conf"


def expand(text: str) -> str:
    for k, v in VARS.items():
        text = text.replace(k, v)
    return text


def var(text: str, name: str) -> str | None:
    m = re.search(rf'^{re.escape(name)}\s*\??=\s*"([^"]*)"', text, re.MULTILINE)
    return m.group(1) if m else None


def from_recipes() -> dict[str, set[tuple[object, ...]]]:
    kinds = ("file", "link", "unit", "user", "python", "mask", "generated")
    got: dict[str, set[tuple[object, ...]]] = {k: set() for k in kinds}
    masked = (var((REPO / DISTRO).read_text(), "ALMA_MASKED_SERVICES") or "").split()
    for bb in sorted(RECIPES.glob("*/*.bb")):
        recipe = bb.parent.name
        text = bb.read_text()
        s = var(text, "S") or ""
        tree = "tools/" + s.split("/", 1)[1] if s.startswith("${WORKDIR}/") else None
        body = text.replace("\\\n", " ")
        for mode, base, rel, dest in _INSTALL.findall(body):
            if rel in GENERATED:
                continue
            src = f"{tree}/{rel}" if base == "${S}" else f"layers/meta-alma/recipes-alma/{recipe}/files/{rel}"
            dest = expand(dest)
            if dest.endswith("/"):
                dest += rel.rsplit("/", 1)[-1]
            got["file"].add((recipe, src, dest, int(mode, 8)))
        for mode, source, dest in _FROM_VAR.findall(body):
            got["generated"].add((recipe, expand(dest), int(mode, 8), source))
        for dest in _PRINTF.findall(body):
            got["generated"].add((recipe, expand(dest), 0o644, "printf"))  # the shell's umask 022
        for target, dest in _LINK.findall(body):
            if "$unit" in dest:  # the loop over the distro's ALMA_MASKED_SERVICES
                got["mask"].update((recipe, u) for u in masked)
            else:
                got["link"].add((recipe, expand(dest), target))
        services = var(text, "SYSTEMD_SERVICE:${PN}")
        enabled = (var(text, "SYSTEMD_AUTO_ENABLE:${PN}") or "enable") == "enable"
        for unit in (services or "").split():
            got["unit"].add((recipe, unit, enabled))
        param = var(text, "USERADD_PARAM:${PN}") or var(text, "USERADD_PARAM:${PN}-admin")
        if param:
            words = expand(param).split()
            opt = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
            groups = tuple(opt["--groups"].split(",")) if "--groups" in opt else ()
            got["user"].add((recipe, words[-1], "--system" in words, opt["--home-dir"], opt["--shell"], groups))
        if "python_setuptools_build_meta" in text and tree:
            got["python"].add((recipe, tree))
    return got


def from_layout() -> dict[str, set[tuple[object, ...]]]:
    lay = layout.load()
    return {
        "file": {(f.recipe, f.src, f.dest, f.mode) for f in lay.files},
        "link": {(k.recipe, k.dest, k.target) for k in lay.links},
        "unit": {(u.recipe, u.name, u.enabled) for u in lay.units},
        "user": {(u.recipe, u.name, u.system, u.home, u.shell, u.groups) for u in lay.users},
        "python": {(p.recipe, p.tree) for p in lay.python},
        "mask": {(m.recipe, m.unit) for m in lay.masks},
        "generated": {(g.recipe, g.dest, g.mode, g.source) for g in lay.generated},
    }


def test_the_layout_is_what_the_recipes_install() -> None:
    want, have = from_recipes(), from_layout()
    for kind in want:
        assert have[kind] == want[kind], (
            f"{kind}: only in the recipes {sorted(want[kind] - have[kind])}; "  # type: ignore[type-var]
            f"only in tools/board-layout.toml {sorted(have[kind] - want[kind])}"  # type: ignore[type-var]
        )


def test_every_layout_source_exists_and_the_parse_sees_every_recipe() -> None:
    lay = layout.load()
    for f in lay.files:
        assert (REPO / f.src).is_file(), f.src
    assert {f.recipe for f in lay.files} | {p.recipe for p in lay.python} >= {
        bb.parent.name for bb in RECIPES.glob("*/*.bb") if "do_install" in bb.read_text()
    } - {"alma-ota"}  # alma-ota installs only generated files (ota.json, the certificate)
