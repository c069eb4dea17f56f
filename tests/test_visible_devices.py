"""The CUDA_VISIBLE_DEVICES parser: CUDA's rules case by case, any text in, a value
out (property), and agreement with PyTorch's model of the driver (differential)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envdoctor.errors import ParseError
from envdoctor.visible_devices import GPU_UUID, INDEX, MIG_UUID, VisibleDevices, parse, resolve


@pytest.mark.parametrize(
    "value, visible, ignored",
    [
        ("0", (0,), ()),
        ("0,1", (0, 1), ()),
        ("3,1", (3, 1), ()),
        (" 1 , 0 ", (1, 0), ()),  # blanks around entries are fine
        ("", (), ()),
        ("-1", (), ()),
        ("0,-1,1", (0,), ("1",)),  # a negative entry ends the list
        ("0,,1", (0,), ("1",)),  # so does an empty one
        ("0,1,", (0, 1), ()),  # a trailing comma costs nothing
        ("0,abc,2", (0,), ("2",)),
        ('"0,1"', (), ('1"',)),  # quotes kept by an env file: nothing is visible
        ("1gpu2,2ampere", (1, 2), ()),  # strtoul: trailing text ignored
        ("+2", (2,), ()),
        ("0,GPU-abc", (0,), ()),  # kinds do not mix
        ("GPU-abc,GPU-def", ("GPU-abc", "GPU-def"), ()),
        ("GPU-abc,1,GPU-def", ("GPU-abc",), ("GPU-def",)),
        ("GPU-abc, GPU-def", ("GPU-abc",), ()),  # no blanks inside a UUID list
        ("MIG-abc,MIG-def", ("MIG-abc", "MIG-def"), ()),
        ("MIG-abc,GPU-def", ("MIG-abc",), ()),
    ],
)
def test_cuda_rules(value, visible, ignored):
    p = parse(value)
    assert p.visible == visible
    assert p.ignored == ignored
    assert p.duplicate is None


@pytest.mark.parametrize("value, dup", [("0,0", 0), ("1,2,1", 1), ("GPU-a,GPU-a", "GPU-a"), (" 2,2 ", 2)])
def test_a_repeated_device_hides_everything(value, dup):
    p = parse(value)
    assert p.duplicate == dup and p.visible == () and p.hides_all


def test_modes_and_details():
    assert parse("0,1").mode == INDEX
    assert parse("GPU-1").mode == GPU_UUID
    assert parse("MIG-1").mode == MIG_UUID
    p = parse("1gpu2,3")
    assert p.lenient == (("1gpu2", 1),)
    p = parse("0,x,1")
    assert p.bad_token == "x" and p.stop == 1 and p.stop_reason == "not a GPU index"
    assert parse("0,GPU-1").stop_reason.startswith("a UUID in a list of indices")
    assert parse("0,-2").stop_reason == "negative index"
    assert parse("'0'").quoted and not parse("0").quoted
    assert parse("-1").hides_all and not parse("0").hides_all


@pytest.mark.parametrize("bad", [None, 3, b"0,1", ["0"]])
def test_non_text_is_a_parse_error(bad):
    with pytest.raises(ParseError):
        parse(bad)


UUIDS = ["GPU-aaaa1111", "GPU-aaaa2222", "GPU-bbbb0000"]


@pytest.mark.parametrize(
    "value, count, ordinals, missing, hidden",
    [
        ("0,1", 4, (0, 1), None, ()),
        ("0,5,1", 4, (0,), 5, (1,)),  # an index beyond the GPUs ends the list
        ("4", 4, (), 4, ()),
        ("3,2", 4, (3, 2), None, ()),
    ],
)
def test_resolve_indices(value, count, ordinals, missing, hidden):
    r = resolve(parse(value), count)
    assert (r.ordinals, r.missing, r.hidden) == (ordinals, missing, hidden)


def test_resolve_uuids():
    assert resolve(parse("GPU-bbbb"), 3, UUIDS).ordinals == (2,)
    assert resolve(parse("GPU-aaaa1,GPU-bbbb"), 3, UUIDS).ordinals == (0, 2)
    r = resolve(parse("GPU-aaaa"), 3, UUIDS)
    assert r.ordinals == () and r.ambiguous == "GPU-aaaa"
    r = resolve(parse("GPU-bbbb,GPU-cccc,GPU-aaaa1"), 3, UUIDS)
    assert r.ordinals == (2,) and r.missing == "GPU-cccc" and r.hidden == ("GPU-aaaa1",)
    r = resolve(parse("GPU-bbbb,GPU-bbbb0"), 3, UUIDS)
    assert r.ordinals == () and r.duplicate == 2
    assert resolve(parse("MIG-x2"), 0, [], ["MIG-x1", "MIG-x2"]).ordinals == (1,)
    assert resolve(parse("MIG-GPU-aaaa1111/1/0"), 3, UUIDS).unverifiable == ("MIG-GPU-aaaa1111/1/0",)


# -- properties ----------------------------------------------------------------------------

PIECES = ["0", "1", "2", "7", "-1", "", " 3 ", "1gpu2", "GPU-ab", "GPU-a", "MIG-x", "MIG-xy", "junk", "+4", "-0",
          '"0', "0'", " ", "\t5"]
ascii_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)
values = st.one_of(
    st.lists(st.one_of(st.sampled_from(PIECES), ascii_text), max_size=6).map(",".join),
    ascii_text,
)


@given(st.text(max_size=40))
@settings(max_examples=400, deadline=None)
def test_any_text_gives_a_consistent_value(text):
    p = parse(text)
    assert isinstance(p, VisibleDevices)
    assert ",".join(p.tokens) == text
    assert len(p.visible) == len(set(p.visible)), "CUDA never shows a device twice"
    if p.duplicate is not None:
        assert p.visible == () and p.stop is None
    if p.stop is not None:
        assert len(p.visible) <= p.stop < len(p.tokens)
    if p.mode == INDEX:
        assert all(isinstance(v, int) and v >= 0 for v in p.visible)
    else:
        assert all(isinstance(v, str) and v.startswith(text[:4]) for v in p.visible)
    r = resolve(p, 4, UUIDS, ["MIG-x1", "MIG-x2"])
    assert len(r.ordinals) <= len(p.visible)


@given(st.one_of(st.integers(), st.binary(), st.none(), st.lists(st.text())))
def test_anything_not_text_is_a_parse_error(value):
    with pytest.raises(ParseError):
        parse(value)


@pytest.mark.real
@given(values)
@settings(max_examples=500, deadline=None)
def test_agrees_with_pytorch(value):
    """torch.cuda._parse_visible_devices is PyTorch's model of the driver (tested against it)."""
    torch_cuda = pytest.importorskip("torch.cuda", reason="torch is not installed")
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = value
    try:
        expected = torch_cuda._parse_visible_devices()
    except ValueError:
        return  # torch's own parser crashes on a bare sign ("+", "-"); CUDA treats it as invalid, as we do
    finally:
        if old is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old
    p = parse(value)
    assert list(p.visible) == list(expected)
    if p.mode == GPU_UUID:
        ours = resolve(p, len(UUIDS), UUIDS)
        assert list(ours.ordinals) == torch_cuda._transform_uuid_to_ordinals(list(p.visible), UUIDS)
