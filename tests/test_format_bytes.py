"""Sizes as every reader prints them: three significant figures in binary units, never in
exponent form."""

from parsearch.units import format_bytes


def test_sizes_have_three_figures_and_no_exponent():
    assert format_bytes(61.2 * 2**30) == "61.2 GiB"
    assert format_bytes(1000 * 2**20) == "1000 MiB"  # .3g alone printed 1e+03 MiB
    assert format_bytes(999.7 * 2**20) == "1000 MiB"
    assert format_bytes(512 * 2**30) == "512 GiB"
    assert format_bytes(25757796) == "24.6 MiB"
    assert format_bytes(1023) == "1023 B"
    assert all("e+" not in format_bytes(n * 2**k) for n in (1000, 1010, 1023) for k in (0, 10, 20))
