"""alma lint with the REAL kas schema and the REAL oelint-adv, on small checkouts and on this repository."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import REPO, require_tool
from support_lint import FLAWED_RECIPE

from alma.lint import kasfiles, oelint
from alma.lint.findings import Finding

SHA = "0880963fea4d91a034e4a6e007d23f98658ab986"


def _add_flawed_recipe(root: Path) -> Path:
    d = root / "layers" / "meta-alma" / "recipes-alma" / "alma-tool"
    d.mkdir(parents=True)
    path = d / "alma-tool_1.0.bb"
    path.write_text(FLAWED_RECIPE)
    return path


def test_clean_checkout_passes(checkout, alma_cli):
    code, out, err = alma_cli("lint")
    assert code == 0, out + err
    assert out.strip().startswith("alma lint: clean (7 kas files, 1 layers, 2 layer files)")


def test_oelint_finding_is_reported_as_path_line_message_and_fails(checkout, alma_cli):
    _add_flawed_recipe(checkout)
    code, out, err = alma_cli("lint")
    assert code == 1
    assert out.splitlines() == [
        "layers/meta-alma/recipes-alma/alma-tool/alma-tool_1.0.bb:10: warning: '${bindir}' should be used "
        "instead of '/usr/bin' (oelint.vars.pathhardcode.bindir) [oelint]"
    ]
    assert "alma lint: 1 finding(s)" in err


def test_json_output(checkout, alma_cli):
    path = _add_flawed_recipe(checkout)
    code, out, _ = alma_cli("lint", "--json")
    assert code == 1
    data = json.loads(out)
    [f] = data["findings"]
    assert f["path"] == str(path) and f["line"] == 10 and f["check"] == "oelint"
    assert data["checked"] == {"kas_files": 7, "layers": 1, "layer_files": 3}


def test_typo_in_kas_key_is_a_schema_finding_with_its_line(checkout, alma_cli):
    f = checkout / "kas" / "features" / "release.yml"
    f.write_text(f.read_text() + "targt: alma-image\n")
    code, out, _ = alma_cli("lint")
    assert code == 1
    assert (
        "kas/features/release.yml:6: kas schema: at (top level): Additional properties are not allowed "
        "('targt' was unexpected) [kas-schema]"
    ) in out


def test_branch_without_lock_entry_is_a_pin_finding(checkout, alma_cli):
    base = checkout / "kas" / "alma.yml"
    base.write_text(base.read_text().replace(f"    commit: {SHA}", '    branch: "2.8"'))
    code, out, _ = alma_cli("lint")
    assert code == 1
    assert (
        "kas/alma.yml:9: repo bitbake: branch '2.8' and no entry in alma.lock.yml; "
        "pin it with commit: <40-hex> or run: kas lock alma.yml [kas-pin]"
    ) in out


def test_branch_with_lock_entry_is_fine(checkout, alma_cli):
    base = checkout / "kas" / "alma.yml"
    base.write_text(base.read_text().replace(f"    commit: {SHA}", '    branch: "2.8"'))
    (checkout / "kas" / "alma.lock.yml").write_text(
        f"header:\n  version: 14\noverrides:\n  repos:\n    bitbake:\n      commit: {SHA}\n"
    )
    code, out, err = alma_cli("lint")
    assert code == 0, out + err


def test_symbolic_commit_that_kas_schema_accepts_is_still_a_finding(checkout, alma_cli):
    base = checkout / "kas" / "alma.yml"
    base.write_text(base.read_text().replace(f"commit: {SHA}", "commit: main"))
    code, out, _ = alma_cli("lint")
    assert code == 1
    assert "kas/alma.yml:11: repo bitbake: commit 'main' is not a full 40-hex commit id" in out
    # the real kas schema accepts it: only our pin check speaks
    assert "[kas-schema]" not in out


def test_short_sha_in_lock_file(checkout):
    lock = checkout / "kas" / "alma.lock.yml"
    lock.write_text("header:\n  version: 14\noverrides:\n  repos:\n    bitbake:\n      commit: 0880963\n")
    findings = kasfiles.check_pins(kasfiles.kas_files(checkout / "kas"))
    assert findings == [
        Finding(lock, 6, "lock entry bitbake: commit '0880963' is not a full 40-hex commit id", "kas-pin")
    ]


def test_header_version_beyond_this_kas(checkout, alma_cli):
    f = checkout / "kas" / "machines" / "jetson-agx-orin-devkit.yml"
    f.write_text(f.read_text().replace("version: 14", "version: 24"))
    code, out, _ = alma_cli("lint")
    assert code == 1
    assert (
        "kas/machines/jetson-agx-orin-devkit.yml:2: kas schema: at header/version: 24 is greater than the maximum"
        in out
    )


def test_every_problem_is_listed_not_just_the_first(checkout, alma_cli):
    _add_flawed_recipe(checkout)
    base = checkout / "kas" / "alma.yml"
    base.write_text(base.read_text().replace(f"commit: {SHA}", "commit: main") + "bogus: 1\n")
    code, out, _ = alma_cli("lint")
    assert code == 1
    assert "[kas-schema]" in out and "[oelint]" in out
    # a schema-invalid file is still checked for pins
    assert "[kas-pin]" in out


def test_no_kas_dir_cannot_lint(checkout, alma_cli):
    shutil.rmtree(checkout / "kas")
    code, _, err = alma_cli("lint")
    assert code == 2
    assert "no kas/ directory" in err and "try:" in err


def test_no_layer_cannot_lint(checkout, alma_cli):
    shutil.rmtree(checkout / "layers")
    code, _, err = alma_cli("lint")
    assert code == 2
    assert "no layer (layers/*/conf/layer.conf)" in err


def test_oelint_missing_cannot_lint(checkout, alma_cli, monkeypatch):
    monkeypatch.setenv("ALMA_TOOL_OELINT_ADV", "/nonexistent/oelint-adv")
    code, _, err = alma_cli("lint")
    assert code == 2
    assert "oelint-adv" in err


def test_parse_output_keeps_severity_and_rule():
    lines = [
        "/x/a.bb:3:error:oelint.var.mandatoryvar.SRC_URI:Variable 'SRC_URI' should be set [branch:false]",
        "noise that is not a finding",
        "/x/b.bbclass:12:info:oelint.vars.valuequoted:Value should be quoted",
    ]
    assert oelint.parse_output(lines) == [
        Finding(
            Path("/x/a.bb"), 3, "error: Variable 'SRC_URI' should be set (oelint.var.mandatoryvar.SRC_URI)", "oelint"
        ),
        Finding(Path("/x/b.bbclass"), 12, "info: Value should be quoted (oelint.vars.valuequoted)", "oelint"),
    ]


def test_fabric_checker_is_called_when_present(checkout, monkeypatch):
    import sys
    import types

    from alma.lint.run import lint

    seen: list[Path] = []
    mod = types.ModuleType("alma.lint.fabric")

    def check_layer(layer_dir: Path) -> list[Finding]:
        seen.append(layer_dir)
        return [Finding(layer_dir / "x.network", 1, "bridge on a fabric port", "fabric")]

    mod.check_layer = check_layer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "alma.lint.fabric", mod)
    report = lint(checkout, oelint=False)
    assert seen == [checkout / "layers" / "meta-alma"]
    assert [f.check for f in report.findings] == ["fabric"]


@pytest.mark.slow
def test_the_repository_itself_is_clean():
    """CI runs `alma lint` on this checkout: it must have zero findings."""
    require_tool("git")
    if not (REPO / "kas" / "alma.yml").exists():
        pytest.fail("kas/alma.yml is missing from the repository")
    from alma.lint.run import lint

    report = lint(REPO)
    assert [f.format(REPO) for f in report.findings] == []
    assert report.checked["kas_files"] >= 5 and report.checked["layer_files"] >= 5
