"""The character vocabulary: special tokens first, lossless round trip, unknowns to <unk>."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chunlian.model.tokenizer import (
    BOS,
    EOS,
    PAD,
    PREFIX_LEN,
    SEP,
    SPECIALS,
    UNK,
    Tokenizer,
    sequence_roles,
)

LINES = ["天增岁月人增寿", "春满乾坤福满门", "春来，福到"]


def test_specials_come_first_in_a_fixed_order() -> None:
    tok = Tokenizer.build(LINES, min_count=1)
    assert tuple(tok.itos[: len(SPECIALS)]) == SPECIALS
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.sep_id, tok.eos_id) == (0, 1, 2, 3, 4)
    assert [tok.itos[i] for i in (0, 1, 2, 3, 4)] == [PAD, UNK, BOS, SEP, EOS]
    assert tok.n_special == len(SPECIALS)
    for style in ("traditional", "business", "family", "literary", "general"):
        assert tok.style_id(style) < tok.n_special
    assert tok.prefix("family", "classical") == [
        tok.bos_id, tok.style_id("family"), tok.register_id("classical")
    ]
    assert len(tok.prefix("family")) == PREFIX_LEN


def test_characters_follow_sorted_and_unique() -> None:
    tok = Tokenizer.build(LINES, min_count=1)
    chars = tok.itos[tok.n_special :]
    assert chars == sorted(set("".join(LINES)))
    assert len(tok) == len(SPECIALS) + len(chars)


def test_min_count_drops_rare_characters() -> None:
    tok = Tokenizer.build(LINES, min_count=2)
    # 增, 满 appear twice in one line; 春 appears in two lines; 岁 only once.
    assert tok.knows("增") and tok.knows("满") and tok.knows("春")
    assert not tok.knows("岁")


def test_round_trip_of_known_text() -> None:
    tok = Tokenizer.build(LINES, min_count=1)
    for line in LINES:
        ids = tok.encode(line)
        assert all(i >= tok.n_special for i in ids)
        assert tok.decode(ids) == line


def test_unknown_characters_become_unk_and_decode_drops_specials() -> None:
    tok = Tokenizer.build(LINES, min_count=1)
    ids = tok.encode("春X风")
    assert ids[1] == tok.unk_id
    assert ids[0] == tok.stoi["春"]
    assert tok.decode([tok.bos_id, *tok.encode("春满"), tok.sep_id, tok.eos_id]) == "春满"


def test_extra_special_tokens_come_after_the_characters_and_are_never_decoded() -> None:
    plain = Tokenizer.build(LINES, min_count=1)
    tok = Tokenizer.build(LINES, min_count=1, extra=["<r:reversed>"])
    assert tok.itos[:-1] == plain.itos and tok.itos[-1] == "<r:reversed>"
    assert tok.register_id("reversed") == len(tok) - 1 and tok.extra_special_ids == {len(tok) - 1}
    assert tok.decode([tok.register_id("reversed"), *tok.encode("春满")]) == "春满"
    assert Tokenizer(list(tok.itos)).extra_special_ids == tok.extra_special_ids
    with pytest.raises(ValueError, match="extra special"):
        Tokenizer.build(LINES, extra=["<r:other>"])


def test_vocabulary_without_specials_first_is_refused() -> None:
    with pytest.raises(ValueError):
        Tokenizer(["春", *SPECIALS])


def test_rebuilt_from_itos_is_identical() -> None:
    tok = Tokenizer.build(LINES, min_count=1)
    again = Tokenizer(list(tok.itos))
    assert again.stoi == tok.stoi
    assert again.encode(LINES[0]) == tok.encode(LINES[0])


def test_sequence_roles_cover_prefix_upper_and_lower() -> None:
    roles = sequence_roles(3, 3)
    assert len(roles) == PREFIX_LEN + 3 + 3 + 1  # EOS is never an input
    assert roles[:PREFIX_LEN] == [0] * PREFIX_LEN
    assert len(set(roles[PREFIX_LEN:])) == 7  # every non-prefix token has its own role


ALPHABET = "".join(sorted(set("".join(LINES))))


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=40))
def test_round_trip_property(text: str) -> None:
    tok = Tokenizer.build(LINES, min_count=1)
    assert tok.decode(tok.encode(text)) == text
