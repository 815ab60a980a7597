"""The curated 横批 list and the selector that ranks it."""

from __future__ import annotations

from collections import Counter
from functools import cache
from importlib import resources

import pytest

from chunlian.data.blocklist import Blocklist, default_blocklist
from chunlian.model.hengpi import (
    SEMANTIC_WEIGHT,
    THEMES,
    TOP_K,
    HengpiEntry,
    HengpiSelector,
    parse_entries,
    themes_of,
)
from chunlian.model.styles import STYLES
from chunlian.text import is_han

GOLD = ("天增岁月人增寿", "春满乾坤福满门")
WEALTH = ("金银满库家家富", "宝贵盈仓户户财")


def _resource_lines() -> list[str]:
    text = resources.files("chunlian").joinpath("resources", "hengpi.tsv").read_text("utf-8")
    return text.splitlines()


@cache
def _selector() -> HengpiSelector:
    return HengpiSelector.from_resources()


def _entry(phrase: str) -> HengpiEntry:
    return next(e for e in _selector().entries if e.phrase == phrase)


# ---- the resource ----------------------------------------------------------------------


def test_resource_states_its_source() -> None:
    first = _resource_lines()[0]
    assert first.startswith("#")
    assert "compiled by the chunlian project from common traditional 横批 phrases" in first
    assert "public-domain idioms" in first


def test_resource_rows_are_distinct_four_han_character_phrases() -> None:
    rows = [ln.split("\t") for ln in _resource_lines() if ln and not ln.startswith("#")]
    assert rows[0] == ["phrase", "styles", "themes"]
    body = rows[1:]
    assert all(len(r) == 3 for r in body)
    phrases = [r[0] for r in body]
    assert len(phrases) >= 220
    assert len(set(phrases)) == len(phrases), [p for p, n in Counter(phrases).items() if n > 1]
    for p in phrases:
        assert len(p) == 4 and all(is_han(c) for c in p), p


def test_every_style_has_at_least_forty_phrases_and_tags_are_known() -> None:
    entries = parse_entries(_resource_lines())
    per_style = Counter(s for e in entries for s in e.styles)
    assert set(per_style) == set(STYLES)
    assert min(per_style.values()) >= 40, per_style
    assert all(e.themes and e.themes <= set(THEMES) for e in entries)


def test_no_shipped_phrase_is_blocklisted() -> None:
    blocklist = default_blocklist()
    entries = parse_entries(_resource_lines())
    assert [e.phrase for e in entries if blocklist.find(e.phrase)] == []
    assert len(_selector().phrases) == len(entries)  # nothing was filtered at load


@pytest.mark.parametrize(
    "line",
    ["家和万事兴\tfamily\tfamily", "春满\ttraditional\tspring", "新春大吉\tmodern\tspring",
     "新春大吉\ttraditional\tweather", "新春大吉\ttraditional"],
)
def test_parse_rejects_bad_rows(line: str) -> None:
    with pytest.raises(ValueError):
        parse_entries([line])


def test_blocklisted_and_duplicate_phrases_are_dropped() -> None:
    entries = [
        HengpiEntry("旭日东升", frozenset({"traditional"}), frozenset({"spring"})),
        HengpiEntry("万象更新", frozenset({"traditional"}), frozenset({"spring"})),
        HengpiEntry("万象更新", frozenset({"family"}), frozenset({"spring"})),
    ]
    sel = HengpiSelector(entries, blocklist=Blocklist({"东升"}))
    assert sel.phrases == ("万象更新",)


# ---- ranking and choice ------------------------------------------------------------------


def test_rank_covers_every_phrase_best_first() -> None:
    ranked = _selector().rank(*GOLD, "traditional")
    assert sorted(p for p, _ in ranked) == sorted(_selector().phrases)
    scores = [s for _, s in ranked]
    assert scores == sorted(scores, reverse=True)


def test_choose_without_seed_is_the_top_phrase_every_time() -> None:
    sel = _selector()
    top = sel.rank(*GOLD, "family")[0][0]
    assert {sel.choose(*GOLD, "family") for _ in range(3)} == {top}
    assert HengpiSelector.from_resources().choose(*GOLD, "family") == top  # a fresh selector


def test_seeded_choice_is_reproducible_and_among_the_top_five() -> None:
    sel = _selector()
    top = [p for p, _ in sel.rank(*GOLD, "traditional")[:TOP_K]]
    picks = [sel.choose(*GOLD, "traditional", seed=s) for s in range(40)]
    assert set(picks) <= set(top)
    assert len(set(picks)) > 1  # seeds do spread over the top five
    assert picks == [sel.choose(*GOLD, "traditional", seed=s) for s in range(40)]


def test_style_changes_the_ranking_and_the_top_phrase_carries_the_style() -> None:
    sel = _selector()
    tops = {}
    for style in STYLES:
        ranked = sel.rank(*GOLD, style)
        tops[style] = [p for p, _ in ranked[:10]]
        assert style in _entry(ranked[0][0]).styles, (style, ranked[0])
    assert len({tuple(t) for t in tops.values()}) == len(STYLES)


@pytest.mark.parametrize("style", STYLES)
def test_a_wealth_couplet_gets_a_wealth_phrase(style: str) -> None:
    top5 = [p for p, _ in _selector().rank(*WEALTH, style)[:5]]
    assert any("wealth" in _entry(p).themes for p in top5), top5
    if style == "business":
        assert "wealth" in _entry(top5[0]).themes


def test_obvious_themes_win() -> None:
    sel = _selector()
    wedding = sel.choose("鸳鸯比翼结连理", "鸾凤和谐成良缘", "family")
    assert "wedding" in _entry(wedding).themes
    study = sel.choose("书山有路勤为径", "学海无涯苦作舟", "literary")
    assert "study" in _entry(study).themes


def test_a_phrase_copied_from_the_couplet_is_not_chosen() -> None:
    # 春满乾坤 is four characters of the 下联 itself; a 横批 sums a couplet up instead.
    top5 = [p for p, _ in _selector().rank(*GOLD, "traditional")[:5]]
    assert "春满乾坤" not in top5


def test_unknown_style_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown style"):
        _selector().rank(*GOLD, "general")


def test_character_vectors_add_cosine_similarity() -> None:
    # non-Han entries (letters, punctuation) come first, as in a model vocabulary
    vec = {"A": [0.0, 1.0], "，": [0.0, 1.0], "甲": [1.0, 0.0], "乙": [1.0, 0.0],
           "山": [1.0, 0.0], "秀": [1.0, 0.0], "财": [0.0, 1.0]}
    plain = HengpiSelector.from_resources()
    with_vec = HengpiSelector.from_resources(char_vectors=vec)
    upper, lower = "甲甲", "乙乙"
    base = dict(zip(plain.phrases, plain.scores(upper, lower, "literary"), strict=True))
    new = dict(zip(with_vec.phrases, with_vec.scores(upper, lower, "literary"), strict=True))
    assert new["山清水秀"] == pytest.approx(base["山清水秀"] + SEMANTIC_WEIGHT)  # cosine 1
    assert new["财源广进"] == pytest.approx(base["财源广进"])  # orthogonal: cosine 0
    assert new["新春大吉"] == pytest.approx(base["新春大吉"])  # no vector: no signal


def test_from_loaded_uses_the_model_embeddings() -> None:
    import torch

    from chunlian.model.checkpoint import LoadedModel
    from chunlian.model.tokenizer import Tokenizer
    from chunlian.model.transformer import CoupletTransformer, ModelConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tok = Tokenizer.build(["".join(_selector().phrases) + "".join(GOLD)], min_count=1)
    loaded = LoadedModel(CoupletTransformer(ModelConfig(len(tok), 1, 2, 16, 32)), tok, "t", "0")
    sel = HengpiSelector.from_loaded(loaded)
    assert sel.phrases == _selector().phrases
    assert sel.scores(*GOLD, "family") != _selector().scores(*GOLD, "family")


def test_theme_lexicon() -> None:
    assert themes_of("财富") == {"wealth"}
    assert "longevity" in themes_of("松鹤")
    assert themes_of("之乎") == frozenset()
