import os
import re

from hypothesis import given, strategies as st

from dsconvert.keys import decode_key, disambiguate, encode_key, escape_path, unescape_path

# webdataset.tariterators.base_plus_ext: the reader's split of a member name
WDS_SPLIT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")

name_chars = st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",))
surrogate_bytes = st.binary(min_size=1, max_size=4).map(lambda b: os.fsdecode(b).replace("/", "_").replace("\x00", "_"))
component = st.one_of(st.text(name_chars, min_size=1, max_size=12), surrogate_bytes).filter(
    lambda s: s not in (".", "..")
)
stems = st.lists(component, min_size=1, max_size=4).map("/".join)


@given(stems)
def test_round_trip(stem):
    assert decode_key(encode_key(stem)) == stem


@given(stems, stems)
def test_injective(a, b):
    if a != b:
        assert encode_key(a) != encode_key(b)


@given(stems, st.sampled_from(["jpg", "json", "cls", "seg.png"]))
def test_webdataset_splits_at_our_field(stem, field):
    key = encode_key(stem)
    m = WDS_SPLIT.match(f"{key}.{field}")
    assert m and m.group(1) == key and m.group(2) == field


def test_dotted_names_stay_one_key():
    key = encode_key("shots/shot.v2.0001")
    assert key == "shots/shot%2Ev2%2E0001"
    assert WDS_SPLIT.match(key + ".json").groups() == (key, "json")


def test_keys_are_strict_json_safe():
    key = encode_key(os.fsdecode(b"caf\xe9/na\xffme with space"))
    key.encode("utf-8")  # no lone surrogates
    assert key == "caf%E9/na%FFme with space"


@given(stems, st.sampled_from(["jpg", "png", "JPEG"]))
def test_disambiguated_keys_never_collide_with_plain_ones(stem, ext):
    d = disambiguate(encode_key(stem), ext)
    assert decode_key(d) == f"{stem}.{ext}"
    assert "~" not in encode_key(stem) and d.count("~") == 1
    assert WDS_SPLIT.match(d + ".jpg").group(1) == d


@given(stems)
def test_escape_path_round_trip(path):
    text = escape_path(path)
    text.encode("utf-8")
    assert unescape_path(text) == path


def test_escape_fast_path_changes_nothing():
    """_escape returns a text with nothing to escape as it is, found by one regex search: the
    same result as its loop for every character class it treats (the loop is the reference)."""
    import random

    from dsconvert import keys

    def loop(text, extra):
        out = []
        for ch in text:
            code = ord(ch)
            if ch in keys._ALWAYS or ch in extra or code < 0x20 or code == 0x7F:
                out.append(f"%{code:02X}")
            elif 0xDC80 <= code <= 0xDCFF:
                out.append(f"%{code - 0xDC00:02X}")
            else:
                out.append(ch)
        return "".join(out)

    alphabet = ["a", "Z", "0", ".", "%", "~", "\\", "/", " ", "-", "\x00", "\x1f", "\x20", "\x7f", "\x80", "\u00e9",
                "\udc7f", "\udc80", "\udcff", "\ud800", "\U0001f600"]
    rng = random.Random(0)
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 8))) for _ in range(5000)] + alphabet
    for extra in (frozenset(), frozenset(".")):
        for text in texts:
            assert keys._escape(text, extra) == loop(text, extra), (text, extra)
