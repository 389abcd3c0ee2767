"""A zone is its path AND its type, checked every poll; a zone whose type cannot be read at
discovery blocks like an unreadable critical zone. Both attacks come from a real board: the
kernel gives a vanished zone's id (its path) to the next zone registered, of any type, and a
sensor behind a firmware call may fail its first reads."""

from __future__ import annotations

import shutil

from almaboard.thermal import Reader, discover
from support_guard import ORIN_TRIPS, Clock, FakeBoard, _put, make_guard, orin_zones, polls


def _replace_zone_dir(board: FakeBoard, key: str, kind: str, temp_c: float) -> None:
    """The zone unregisters (as on sysfs, its attributes fail first) and a sensor of ``kind``
    registers at the same thermal_zoneN."""
    d = board._zones[key]
    _put(d / "temp", "")  # a kept descriptor on a removed kernfs attribute fails to read
    shutil.rmtree(d)
    d.mkdir()
    _put(d / "type", kind + "\n")
    for i, (tkind, ttemp) in enumerate(ORIN_TRIPS):
        _put(d / f"trip_point_{i}_type", tkind + "\n")
        _put(d / f"trip_point_{i}_temp", f"{int(round(ttemp * 1000))}\n")
    board.set_temp(key, temp_c)


def test_a_cool_zone_of_another_type_at_a_hot_zones_path_never_stands_in_for_it(board: FakeBoard) -> None:
    orin_zones(board, 50.0)
    clock = Clock()
    g = make_guard(board, clock, holdoff_s=5.0)
    board.set_temp("soc0-thermal", 95.0)
    assert "shed" in polls(g, clock, 3)
    _replace_zone_dir(board, "soc0-thermal", "cv9-thermal", 40.0)
    assert polls(g, clock, 40) == []  # 8 hold-offs: never resumed on a stranger's reading
    assert g.status.shedding
    assert "soc0-thermal" in g.status.unreadable
    assert "cv9-thermal" in g.status.zones  # the newcomer is guarded under its own name
    assert "cv9-thermal" in g.reader.read(clock.t)  # and read
    # soc0 comes back (same path, its own type): it is itself again, read as soc0; the
    # newcomer has vanished now, and a vanished zone blocks the resume like any other.
    _replace_zone_dir(board, "soc0-thermal", "soc0-thermal", 45.0)
    assert polls(g, clock, 15) == []
    assert g.status.zones.get("soc0-thermal") == 45.0 and g.status.unreadable == ["cv9-thermal"]


def test_the_reader_checks_the_type_at_every_read(board: FakeBoard) -> None:
    board.add_zone("soc0-thermal", 50.0)
    zones = discover(board.p("/sys/class/thermal"))
    assert [(z.name, z.kind) for z in zones] == [("soc0-thermal", "soc0-thermal")]
    r = Reader(zones)
    try:
        assert r.read(1.0)["soc0-thermal"].celsius == 50.0
        _put(board._zones["soc0-thermal"] / "type", "cv9-thermal\n")  # in place: same inode
        got = r.read(2.0)["soc0-thermal"]
        assert got.celsius is None and "replaced" in got.problem and "cv9-thermal" in got.problem
    finally:
        r.close()


def test_tj_with_an_unreadable_type_at_discovery_blocks_like_an_unreadable_critical_zone(board: FakeBoard) -> None:
    orin_zones(board, 50.0)
    tj_type = board._zones["tj-thermal"] / "type"
    tj_type.unlink()  # the type read fails at discovery (a sensor behind a firmware call)
    clock = Clock()
    g = make_guard(board, clock, holdoff_s=5.0)
    assert "thermal_zone8" in g.status.zones or "thermal_zone8" in {z.name for z in g.zones}
    acts = polls(g, clock, 40)
    assert acts[:1] == ["shed"] and g.status.shedding  # fail closed: it may be tj
    assert "critical" in g.status.reason and "thermal_zone8" in g.status.reason
    _put(tj_type, "tj-thermal\n")  # the type reads now: the zone gets its identity
    acts = polls(g, clock, 15)
    assert "resume" in acts
    assert "tj-thermal" in {z.name for z in g.zones} and "thermal_zone8" not in {z.name for z in g.zones}
    # and the critical rule applies to it by name from now on
    board.set_temp("tj-thermal", 95.0)
    assert "shed" in polls(g, clock, 3)


def test_a_hot_zone_of_another_type_at_a_known_path_sheds_at_once(board: FakeBoard) -> None:
    orin_zones(board, 50.0)
    clock = Clock()
    g = make_guard(board, clock, holdoff_s=5.0)
    assert polls(g, clock, 3) == []
    _replace_zone_dir(board, "soc0-thermal", "cv9-thermal", 95.0)
    assert polls(g, clock, 2) == ["shed"]  # guarded from its first poll, not the 30 s rediscovery
    assert "cv9-thermal" in g.status.reason
