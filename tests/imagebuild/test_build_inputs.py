"""Bad input to alma build: clear errors, exit 2, nothing run and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from support_build import mark_checked_out, read_record

MACHINE = "jetson-orin-nano-devkit"


@pytest.fixture(autouse=True)
def _ready(project: Path, fakes: Path, probes) -> None:  # type: ignore[no-untyped-def]
    mark_checked_out(project)


def _nothing_ran(project: Path, record: Path) -> None:
    assert read_record(record) == []
    assert not list(project.glob("build/*/alma-build*"))


def test_unknown_machine_lists_the_valid_ones(project, fakes, alma):
    code, _, err = alma("build", "--machine", "jetson-nano")
    assert code == 2
    assert "unknown machine 'jetson-nano'; valid machines: jetson-agx-orin-devkit, " in err
    assert "jetson-orin-nano-devkit-nvme" in err and "try: alma build --machine" in err
    _nothing_ran(project, fakes)


def test_a_machine_or_feature_name_is_never_a_path(project, fakes, alma):
    """`--machine ../features/release` named a kas file outside kas/machines/ and was built."""
    code, _, err = alma("build", "--dry-run", "--machine", "../features/release")
    assert code == 2 and "unknown machine '../features/release'" in err
    code, _, err = alma("build", "--dry-run", "--feature", "../machines/jetson-agx-orin-devkit")
    assert code == 2 and "unknown feature '../machines/jetson-agx-orin-devkit'" in err
    _nothing_ran(project, fakes)


def test_unknown_image_lists_the_valid_ones(project, fakes, alma):
    code, _, err = alma("build", "--image", "core-image-sato")
    assert code == 2
    assert "unknown image 'core-image-sato'; valid images: alma-image" in err
    _nothing_ran(project, fakes)


def test_unknown_feature(project, fakes, alma):
    code, _, err = alma("build", "--feature", "turbo")
    assert code == 2
    assert "unknown feature 'turbo'; valid features: development, release, shared-sstate" in err


def test_typo_in_a_kas_key_is_reported_with_file_line_and_kas_schema_message(project, fakes, alma):
    f = project / "kas" / "machines" / f"{MACHINE}.yml"
    f.write_text(f.read_text() + "local_conf_heade:\n  x: |\n    FOO = '1'\n")
    code, _, err = alma("build")
    assert code == 2
    assert f"kas/machines/{MACHINE}.yml:6: kas schema: at (top level): Additional properties are not allowed" in err
    assert "'local_conf_heade' was unexpected" in err
    _nothing_ran(project, fakes)


def test_typo_nested_in_a_repo_points_at_its_line(project, fakes, alma):
    base = project / "kas" / "alma.yml"
    base.write_text(base.read_text().replace("    commit: 5435", "    comit: 5435"))
    code, _, err = alma("build")
    assert code == 2
    assert "kas/alma.yml:16: kas schema: at repos/openembedded-core: Additional properties are not allowed" in err
    assert "'comit' was unexpected" in err


def test_branch_instead_of_commit_is_refused(project, fakes, alma):
    base = project / "kas" / "alma.yml"
    text = base.read_text()
    base.write_text(text.replace("    commit: 0880963fea4d91a034e4a6e007d23f98658ab986", '    branch: "2.8"'))
    code, _, err = alma("build")
    assert code == 2
    assert "not pinned to a full 40-hex commit: bitbake (branch: 2.8)" in err
    assert "alma lock" in err
    _nothing_ran(project, fakes)


def test_symbolic_commit_is_refused(project, fakes, alma):
    base = project / "kas" / "alma.yml"
    base.write_text(base.read_text().replace("commit: 0880963fea4d91a034e4a6e007d23f98658ab986", "commit: main"))
    code, _, err = alma("build")
    assert code == 2
    assert "bitbake (commit: main)" in err


def test_lock_file_pins_a_branch(project, fakes, alma):
    base = project / "kas" / "alma.yml"
    base.write_text(
        base.read_text().replace("    commit: 0880963fea4d91a034e4a6e007d23f98658ab986", '    branch: "2.8"')
    )
    (project / "kas" / "alma.lock.yml").write_text(
        "header:\n  version: 14\noverrides:\n  repos:\n    bitbake:\n"
        "      commit: 0880963fea4d91a034e4a6e007d23f98658ab986\n"
    )
    code, _, err = alma("build")
    assert code == 0, err


def test_header_version_newer_than_kas_is_refused_by_kas_check(project, fakes, alma):
    f = project / "kas" / "features" / "release.yml"
    f.write_text(f.read_text().replace("version: 14", "version: 99"))
    code, _, err = alma("build", "--feature", "release")
    assert code == 2
    assert "kas/features/release.yml:2: kas schema: at header/version: 99 is greater than the maximum of 23" in err


def test_invalid_yaml(project, fakes, alma):
    (project / "kas" / "machines" / f"{MACHINE}.yml").write_text("header: [\n")
    code, _, err = alma("build")
    assert code == 2
    assert "not valid YAML" in err


def test_not_a_checkout(tmp_path, monkeypatch, alma):
    monkeypatch.setenv("ALMA_ROOT", str(tmp_path))
    code, _, err = alma("build")
    assert code == 2
    assert "kas base file is missing" in err and "ALMA_ROOT" in err
