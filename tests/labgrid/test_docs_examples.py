"""docs/labgrid's example files load with labgrid's own readers and name only classes labgrid
(with alma.labgrid imported) knows: a doc example that would not load is a broken doc."""

from __future__ import annotations

from pathlib import Path

import pytest
from labgrid.config import Config
from labgrid.factory import target_factory
from labgrid.remote import exporter as lg_exporter
from labgrid.remote.config import ResourceConfig
from support import REPO

import alma.labgrid  # noqa: F401  (registers the classes, as the env's imports: does)
from alma.labgrid import export

DOCS = REPO / "docs" / "labgrid"


def _names(items: object) -> list[str]:
    if isinstance(items, dict):
        return list(items)
    assert isinstance(items, list)
    return [next(iter(i)) for i in items]


def test_env_example_names_known_classes_and_imports_us() -> None:
    cfg = Config(str(DOCS / "station.env.yaml"))
    assert cfg.get_imports() == ["alma.labgrid"]
    (target,) = cfg.get_targets().values()
    for name in _names(target["resources"]) + _names(target["drivers"]):
        assert name in target_factory.all_classes, name
    assert Path(cfg.get_image_path("bundle")).name.endswith(".rootfs.tegraflash.tar.gz")


@pytest.mark.parametrize(
    ("file", "name", "groups"),
    [
        ("station.exporter.yaml", "station-1", {"bench-1"}),
        ("two-stations.exporter.yaml", "station-1", {"bench-1"}),
        ("two-stations.exporter.yaml", "station-2", {"bench-2"}),
    ],
)
def test_exporter_examples_render_for_each_station(file: str, name: str, groups: set[str]) -> None:
    export.register()
    data = ResourceConfig(str(DOCS / file), {"env": {}, "isolated": False, "hostname": name, "name": name}).data
    assert set(data) == groups
    for group in data.values():
        for res, params in group.items():
            if res == "location":
                continue
            cls = (params or {}).get("cls", res)
            assert cls in lg_exporter.exports or cls in target_factory.resources, cls
        assert group["AlmaRecoveryBoard"]["usb_path"]


def test_env_example_drivers_bind_to_what_the_station_exports() -> None:
    """Every driver of station.env.yaml finds its resources among those station.exporter.yaml
    exports (a place holds exactly those): an env whose power driver has no port on the
    station is a doc that fails on its first `-s flashed`."""
    export.register()
    data = ResourceConfig(str(DOCS / "station.exporter.yaml"), {"env": {}, "isolated": False, "hostname": "station-1",
                                                                "name": "station-1"}).data  # fmt: skip
    resources = [{k: v} for group in data.values() for k, v in group.items() if k != "location"]
    (target,) = Config(str(DOCS / "station.env.yaml")).get_targets().values()
    t = target_factory.make_target("doc", {"resources": resources, "drivers": target["drivers"]})
    bound = {type(d).__name__ for d in t.drivers}
    assert {"AlmaRecoveryDriver", "AlmaFlashDriver", "AlmaSSHDriver", "AlmaStrategy"} <= bound
    t.cleanup()
