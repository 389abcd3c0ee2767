"""Claim semantics: size tolerance, version prefixes, unknown vs false."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alma.errors import ConfigError
from alma.gates.claims import HOLDS, STALE, UNBACKED, UNITS, format_size, judge, normalize, parse_size


@given(
    whole=st.integers(min_value=1, max_value=999),
    frac=st.integers(min_value=0, max_value=99),
    decimals=st.integers(min_value=0, max_value=2),
    unit=st.sampled_from(["kB", "MB", "GB", "KiB", "MiB", "GiB", "G"]),
    offset=st.integers(min_value=-10, max_value=10),
)
def test_size_holds_within_half_a_unit_of_the_last_digit(
    whole: int, frac: int, decimals: int, unit: str, offset: int
) -> None:
    text = f"{whole}.{frac:02d}"[: len(str(whole)) + (decimals + 1 if decimals else 0)] + f" {unit}"
    size = parse_size(text)
    assert size is not None and size.decimals == decimals
    half = Decimal(5) * Decimal(10) ** (-decimals - 1) * UNITS[unit]
    # offset in tenths of the half-step: |offset| <= 10 is inside, both edges included
    fact = size.bytes + half * offset / 10
    if fact != int(fact):
        return  # facts are whole bytes
    assert judge("bundle_bytes", size, int(fact)) == HOLDS
    outside = int(size.bytes + half) + 1 if offset >= 0 else int(size.bytes - half) - 1
    assert judge("bundle_bytes", size, outside) == STALE


def test_size_edges_exactly() -> None:
    s = normalize("bundle_bytes", "1.6 GB")
    assert [judge("bundle_bytes", s, n) for n in (1_550_000_000, 1_650_000_000, 1_549_999_999, 1_650_000_001)] == [
        HOLDS,
        HOLDS,
        STALE,
        STALE,
    ]
    assert str(s) == "1.6 GB" and "1.55-1.65 GB" in s.describe()


def test_format_size_keeps_the_authors_unit() -> None:
    assert format_size(1_612_000_000, parse_size("1.6 GB")) == "1.6 GB"
    assert format_size(1_712_000_000, parse_size("1.55 GiB")) == "1.59 GiB"
    assert format_size(41_287_168) == "41 MB"
    assert format_size(213_432, parse_size("1.6 GB")) == "213 kB"  # "0.0 GB" would hide it


def test_unknown_is_not_false() -> None:
    assert judge("image_buildable", None, None) == HOLDS
    assert judge("image_buildable", False, None) == UNBACKED
    assert judge("image_buildable", None, True) == STALE
    assert normalize("image_buildable", "unknown") is None
    assert normalize("flashed", "no") is False


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("nonsense", 1),
        ("image_buildable", "maybe"),
        ("status", "Shipped"),
        ("package_count", "many"),
        ("bundle_sha256", "xyz"),
        ("bundle_bytes", "big"),
    ],
)
def test_invalid_claims(name: str, value: object) -> None:
    with pytest.raises(ConfigError):
        normalize(name, value)


def test_help_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    from alma.cli.main import main

    for argv in (["verify", "--help"], ["gates", "check", "--help"], ["gates", "render", "--help"]):
        main(argv)
        out = capsys.readouterr().out
        assert "Exit codes:" in out, argv
