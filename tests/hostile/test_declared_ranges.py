"""What a declared range says is what is accepted: a number in another script's digits
(Arabic-Indic, full-width, Devanagari...) is not a number for any lab parameter, bench-style
range or size (Python's ``int``/``float`` would read it), and a mix's ``long_share`` takes its
whole declared range (chunked-prefill and pd-split declared 0..1 while the mix refused 0)."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.errors import ConfigError
from workbench.labs import LABS, get_lab
from workbench.labs.kit.params import LONG_SHARE, specs
from workbench.labs.kit.serving import mix
from workbench.ranges import Floats, Ints, Num, Opt
from workbench.units import parse_size

# every decimal digit that is not ASCII, by script (zero of each block)
ZEROS = sorted({chr(c - unicodedata.digit(chr(c))) for c in range(0x80, 0x20000)
                if unicodedata.category(chr(c)) == "Nd"})
NUMERIC = [(n, k) for n in LABS for k, s in specs(get_lab(n).params_type).items()
           if isinstance(s.spec if isinstance(s, Opt) else s, (Num, Ints, Floats))]


def in_script(text: str, zero: str) -> str:
    """``text`` with each ASCII digit written in the script whose zero is ``zero``."""
    return "".join(chr(ord(zero) + int(c)) if c.isascii() and c.isdigit() else c for c in text)


def example(spec) -> str:
    spec = spec.spec if isinstance(spec, Opt) else spec
    lo = spec.lo
    return str(int(lo)) if float(lo).is_integer() else repr(lo)


def test_there_are_many_scripts_to_try():
    assert len(ZEROS) > 50 and "\u0660" in ZEROS and "\uff10" in ZEROS


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(NUMERIC), zero=st.sampled_from(ZEROS), data=st.data())
def test_a_lab_parameter_in_another_scripts_digits_is_refused(which, zero, data):
    name, key = which
    lab = get_lab(name)
    text = example(specs(lab.params_type)[key])
    assert getattr(lab.parse_params({key: text}), key) is not None  # ASCII: accepted
    mixed = data.draw(st.sampled_from([in_script(text, zero),
                                       in_script(text, zero)[:1] + text[1:]]))
    if mixed == text:
        return
    with pytest.raises(ConfigError) as err:
        lab.parse_params({key: mixed})
    assert "\n" not in str(err.value) and f"parameter {key}=" in str(err.value)


@given(n=st.integers(0, 10**6), zero=st.sampled_from(ZEROS), unit=st.sampled_from(["", "MiB"]))
def test_a_size_in_another_scripts_digits_is_refused(n, zero, unit):
    assert parse_size(f"{n}{unit}") >= 0
    with pytest.raises(ConfigError, match="not a size"):
        parse_size(in_script(f"{n}", zero) + unit)


@pytest.mark.parametrize("share", [LONG_SHARE.lo, 0.5, LONG_SHARE.hi])
def test_the_mix_takes_its_whole_declared_range(share):
    reqs = mix(2.0, 200, share, 0)
    assert len(reqs) == 200


@pytest.mark.parametrize("share", [0.0, 1.0, LONG_SHARE.lo / 2, float("nan")])
def test_outside_the_declared_range_both_refuse_alike(share):
    lab = get_lab("chunked-prefill")
    with pytest.raises(ConfigError, match="long_share="):
        lab.params(long_share=share)
    with pytest.raises(ConfigError, match="long_share="):
        mix(2.0, 10, share, 0)
    with pytest.raises(ConfigError, match="long_shares="):
        get_lab("pd-split").params(long_shares=(0.1, share))
