"""batch_to_ids against an independent, byte-level restatement of allennlp's ELMoCharacterMapper.

The spec below is written from allennlp's rule, not from elmo_fast's helpers: a token becomes
[258, its UTF-8 bytes (errors ignored) cut to 48, 259, 260 ...] (50 ids), the literal tokens
"<S>" / "</S>" become [258, 256|257, 259, 260 ...], every id is shifted by +1, and token slots
past a sentence's end are all 0.
"""

from __future__ import annotations

import pytest
import torch
from char_ids_spec import WORD_LEN, spec_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elmo_fast.bilm.char_ids import batch_to_ids


def check(batch: list[list[str]]) -> torch.Tensor:
    out = batch_to_ids(batch)
    longest = max((len(s) for s in batch), default=0)
    assert isinstance(out, torch.Tensor)
    assert out.dtype == torch.long
    assert tuple(out.shape) == (len(batch), longest, WORD_LEN)
    assert out.tolist() == spec_batch(batch)
    return out


# ---- golden values, worked out by hand from the rule ---------------------------------------


def _pad(prefix: list[int]) -> list[int]:
    return prefix + [261] * (WORD_LEN - len(prefix))


GOLDEN = {
    "a": _pad([259, 98, 260]),  # 'a' = 97
    "<S>": _pad([259, 257, 260]),
    "</S>": _pad([259, 258, 260]),
    "<s>": _pad([259, 61, 116, 63, 260]),  # lowercase is not special: '<' 60, 's' 115, '>' 62
    "é": _pad([259, 196, 170, 260]),  # U+00E9 = C3 A9
    "": _pad([259, 260]),
    "Hi": _pad([259, 73, 106, 260]),
}


@pytest.mark.parametrize("token", list(GOLDEN))
def test_golden_token(token):
    out = batch_to_ids([[token]])
    assert out.shape == (1, 1, WORD_LEN)
    assert out[0, 0].tolist() == GOLDEN[token]


def test_golden_sentence_with_padding_slot():
    out = batch_to_ids([["a", "Hi"], ["<S>"]])
    assert out.tolist() == [[GOLDEN["a"], GOLDEN["Hi"]], [GOLDEN["<S>"], [0] * WORD_LEN]]


# ---- the spec on chosen inputs ---------------------------------------------------------------


def test_ascii_words():
    check([["The", "quick", "brown", "fox", "."], ["jumps", "over"], ["the", "lazy", "dog", "!", "?", "123"]])


def test_long_token_cut_at_48_bytes():
    out = check([["x" * 200]])[0, 0].tolist()
    assert out[0] == 259
    assert out[1:49] == [ord("x") + 1] * 48
    assert out[49] == 260  # end-of-word mark takes the last slot: no padding left


@pytest.mark.parametrize("n_bytes", [46, 47, 48, 49, 50, 51])
def test_lengths_around_the_cut(n_bytes):
    out = check([["q" * n_bytes]])[0, 0].tolist()
    kept = min(n_bytes, 48)
    assert out[kept + 1] == 260
    assert out[kept + 2 :] == [261] * (WORD_LEN - kept - 2)


@pytest.mark.parametrize(
    "token",
    [
        "a" + "é" * 30,  # 61 bytes: byte 48 is the first byte of an 'é'
        "ab" + "中" * 20,  # 62 bytes: the cut falls after 1 of 3 bytes of a CJK char
        "a" + "😀" * 20,  # 81 bytes: the cut falls inside a 4-byte emoji
    ],
)
def test_multibyte_cut_keeps_raw_bytes(token):
    out = check([[token]])[0, 0].tolist()
    raw = token.encode("utf-8")[:48]
    assert out[1:49] == [b + 1 for b in raw]
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")  # the cut really splits a character; nothing is re-encoded
    assert out[49] == 260


def test_even_multibyte_cut():
    # 'é' * 30 is 60 bytes; 48 bytes is exactly 24 whole 'é'.
    out = check([["é" * 30]])[0, 0].tolist()
    assert out[1:49] == [0xC3 + 1, 0xA9 + 1] * 24


def test_non_latin_scripts():
    check(
        [
            ["我们", "喜欢", "自然语言处理"],
            ["مرحبا", "بالعالم"],
            ["नमस्ते", "दुनिया"],
            ["Привет", "мир", "ёЁ"],
            ["Ελληνικά", "עברית", "한국어", "日本語テキスト"],
        ]
    )


def test_emoji_with_zero_width_joiners():
    family = "👨\u200d👩\u200d👧"
    out = check([[family, "🏳️‍🌈", "👍🏽"]])
    assert out[0, 0, 1:19].tolist() == [b + 1 for b in family.encode("utf-8")]
    assert len(family.encode("utf-8")) == 18


def test_sentence_marks_inside_a_sentence():
    out = check([["<S>", "hello", "</S>", "<S>", "</S>"], ["<s>", "</s>", "<S", "S>", " <S>"]])
    assert out[0, 0].tolist() == GOLDEN["<S>"]
    assert out[0, 2].tolist() == GOLDEN["</S>"]
    assert out[1, 0].tolist() == GOLDEN["<s>"]
    # only the exact literals are special
    assert out[1, 4].tolist() != GOLDEN["<S>"]


def test_lone_surrogates_are_dropped():
    out = check([["\ud800", "a\udfffb", "\udc00\ud800"]])[0].tolist()
    assert out[0] == GOLDEN[""]
    assert out[1] == _pad([259, 98, 99, 260])
    assert out[2] == GOLDEN[""]


def test_empty_batch():
    out = check([])
    assert tuple(out.shape) == (0, 0, WORD_LEN)


def test_all_sentences_empty():
    out = check([[], []])
    assert tuple(out.shape) == (2, 0, WORD_LEN)


def test_empty_sentence_among_others_and_ragged():
    out = check([["a", "b", "c"], [], ["d"], ["e", "f", "g", "h", "i"], ["j", "k"]])
    assert tuple(out.shape) == (5, 5, WORD_LEN)
    assert (out[1] == 0).all()
    assert (out[2, 1:] == 0).all()
    assert (out[0, 3:] == 0).all()
    assert (out[3] != 0).all()


def test_tuples_are_accepted():
    assert batch_to_ids((("a", "Hi"),)).tolist() == [[GOLDEN["a"], GOLDEN["Hi"]]]


def test_string_batch_raises_type_error():
    with pytest.raises(TypeError):
        batch_to_ids("a string")


def test_list_of_strings_raises_type_error():
    with pytest.raises(TypeError):
        batch_to_ids(["a", "string"])


# ---- property: anything Unicode matches the spec ---------------------------------------------

_tokens = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=60),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=4),
    st.text(alphabet=st.sampled_from(["é", "中", "😀", "\u200d", "a", "<", "S", "/", ">"]), min_size=40, max_size=70),
    st.sampled_from(["<S>", "</S>", "<s>", ""]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(_tokens, max_size=8), max_size=6))
@pytest.mark.slow
def test_property_matches_spec(batch):
    check(batch)
