"""Pure helpers every service's HTTP layer shares."""

from __future__ import annotations

import pytest

from runtime.http import client_address


@pytest.mark.parametrize(
    ("forwarded_for", "peer", "hops", "expected"),
    [
        (
            "10.0.0.1, 203.0.113.7",
            ("10.1.1.1", 40000),
            1,
            "203.0.113.7",
        ),  # the proxy's entry, not the forged one
        ("10.0.0.1, 203.0.113.7, 10.2.0.5", ("10.1.1.1", 40000), 2, "203.0.113.7"),  # two proxies appended
        (
            "203.0.113.7",
            ("10.1.1.1", 40000),
            2,
            "10.1.1.1",
        ),  # fewer entries than proxies: not through them all
        (
            "203.0.113.7",
            ("10.1.1.1", 40000),
            0,
            "10.1.1.1",
        ),  # no trusted proxy: the header is the client's own
        (None, ("10.1.1.1", 40000), 1, "10.1.1.1"),
        ("10.0.0.1, ", ("10.1.1.1", 40000), 1, "10.1.1.1"),  # an empty last entry names no one
        (None, None, 1, None),
    ],
)
def test_a_client_is_the_address_the_nearest_trusted_proxy_saw(
    forwarded_for: str | None, peer: object, hops: int, expected: str | None
) -> None:
    assert client_address(forwarded_for, peer, hops) == expected
