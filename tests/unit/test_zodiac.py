"""The zodiac rule: generated lines name no year's animal but the campaign year's and the
year before it; the user's 上联 may name any."""

from __future__ import annotations

import datetime as dt
from functools import cache
from pathlib import Path

import pytest

from chunlian.config import load_settings
from chunlian.data.blocklist import default_blocklist
from chunlian.engine.request import SeqSpec
from chunlian.engine.runner import ModelRunner
from chunlian.errors import ConfigError
from chunlian.model.checkpoint import LoadedModel, load_weights
from chunlian.model.zodiac import (
    ANIMALS,
    animal,
    answering_animals,
    campaign_year,
    composed_terms,
    off_year_terms,
    stem_branch,
    with_zodiac,
)
from chunlian.rules import DECODING_RULES_VERSION
from tests.unit.runner_util import run_all

# lines of the validation splits whose greedy 下联 names another year without the rule
# (紫燕飞来寻玉兔 -> 红梅绽放醉金鸡, 玉兔迎春前景美 -> 金龙送岁小康宁, 龙年百卉齐争艳 ->
# 蛇岁三春共享荣, 喜见羊年成骏业 -> 欣闻猴岁展宏图, a visitor's 羊年吉祥喜洋洋 -> 猴日顺意福满满),
# and one whose 下联 names none
UPPERS = ["紫燕飞来寻玉兔", "玉兔迎春前景美", "龙年百卉齐争艳", "喜见羊年成骏业", "羊年吉祥喜洋洋",
          "龙门在望仙门近"]


@cache
def shipped() -> LoadedModel:
    return load_weights(None, "cpu")


def test_animals_of_years_and_the_campaign_year() -> None:
    assert [animal(y) for y in (2020, 2024, 2026, 2027, 2031)] == ["鼠", "龙", "马", "羊", "猪"]
    assert [stem_branch(y) for y in (1984, 2016, 2026, 2027, 2043)] == ["甲子", "丙申", "丙午", "丁未", "癸亥"]
    assert campaign_year(dt.date(2026, 12, 1)) == 2027  # December: the coming one
    assert campaign_year(dt.date(2027, 1, 20)) == 2027  # before it (6 February 2027)
    assert campaign_year(dt.date(2027, 7, 1)) == 2028


def test_off_year_terms_spare_the_year_and_the_one_it_follows() -> None:
    terms = off_year_terms(2027)
    assert {"猴年", "金猴", "蛇岁", "犬年", "狗岁", "金龙", "辰年", "申年"} <= terms
    assert not {"羊年", "羊岁", "金羊", "马年", "金马", "未年", "午年"} & terms  # 2027 Goat, 2026 Horse
    assert "马岁" in terms  # the year before may leave (马年), never be greeted as the year
    assert "子年" not in terms  # 学子年年
    # an 上联's 羊年 answered by another animal (猴日顺意, 迎虎之岁) or 丁未 by another year's name
    assert {"猴日", "马日", "猴月", "虎之岁", "犬之年", "丙申", "甲申", "辛亥"} <= terms
    assert not {"羊日", "羊月", "丁未", "丙午", "甲子"} & terms  # this year's; the previous name; 60 years
    # ten animals and the Dog's alias, three patterns each; the branches of nine (not 子); 马岁;
    # eleven animals and the alias, four pairings each; 60 stem-branch names less three
    assert len(terms) == 3 * 11 + 9 + 1 + 4 * 12 + 57
    assert with_zodiac(default_blocklist(), None) is default_blocklist()


def _lowers(blocklist_year: int | None) -> list[str]:
    runner = ModelRunner(shipped(), 8, blocklist=with_zodiac(default_blocklist(), blocklist_year))
    out = run_all(runner, [SeqSpec(seq_id=i, style="traditional", upper=u, upper_len=len(u))
                          for i, u in enumerate(UPPERS)])
    return [out[i].lower for i in range(len(UPPERS))]


def test_generated_lines_name_no_other_year() -> None:
    free, ruled = _lowers(None), _lowers(2027)
    terms = off_year_terms(2027)
    # without the rule the model names other years (the reason for it) ...
    assert sum(any(t in lo for t in terms) for lo in free) >= 3, free
    # ... with it none does, and lines that named none are left as they were
    assert not [lo for lo in ruled if any(t in lo for t in terms)], ruled
    for f, r in zip(free, ruled, strict=True):
        if not any(t in f for t in terms):
            assert f == r


def test_an_upper_naming_the_year_gets_no_other_animal() -> None:
    assert answering_animals("羊年吉祥喜洋洋", 2027) == frozenset("鼠牛虎兔龙蛇马猴鸡狗猪犬")
    assert answering_animals("龙门在望仙门近", 2027) == frozenset()  # no 羊: free
    assert answering_animals("羊年吉祥喜洋洋", None) == frozenset()  # no rule
    assert "犬" not in answering_animals("狗年旺旺", 2030)  # the Dog's year: its alias is its own
    assert "猴" in answering_animals("犬年大吉", 2030)  # ... and names the year as 狗 does
    ruled = dict(zip(UPPERS, _lowers(2027), strict=True))
    # greedy without this ban: 猴日顺意福满满, and with the words alone banned, 猴棒发展看步步
    lower = ruled["羊年吉祥喜洋洋"]
    assert not set(lower) & set(ANIMALS.replace("羊", "")), lower


def test_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHUNLIAN_ZODIAC_YEAR", raising=False)
    assert load_settings().resolved_zodiac_year(dt.date(2026, 12, 1)) == 2027  # 0: auto
    monkeypatch.setenv("CHUNLIAN_ZODIAC_YEAR", "2028")
    s = load_settings()
    assert s.resolved_zodiac_year() == 2028 and s.rules_tag == f"rules={DECODING_RULES_VERSION};zodiac=2028"
    assert "猴年" not in s.generation_blocklist().terms  # 2028: Monkey
    assert "羊年" not in s.generation_blocklist().terms  # the year it follows
    monkeypatch.setenv("CHUNLIAN_ZODIAC_YEAR", "-1")
    s = load_settings()
    assert s.resolved_zodiac_year() is None and s.rules_tag == f"rules={DECODING_RULES_VERSION}"
    assert s.generation_blocklist() is default_blocklist()
    monkeypatch.setenv("CHUNLIAN_ZODIAC_YEAR", "1500")
    with pytest.raises(ConfigError, match="CHUNLIAN_ZODIAC_YEAR"):
        load_settings()


def test_eval_prints_every_key_and_applies_the_zodiac_rule_only_when_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from chunlian.cli import main as cli_main

    data = tmp_path / "pairs.tsv"
    data.write_text("upper\tlower\n紫燕迎春，绚丽风光凝百瑞\t金猴献岁，和谐社会启千祥\n"
                    "幸入福院龙年乐\t喜临华堂蛇岁新\n", encoding="utf-8")
    reports = []
    for extra in ([], ["--zodiac-year", "2027"]):
        assert cli_main(["eval", "--data", str(data), "--json", *extra]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    keys = {"pairs", "bleu4", "bleu1", "length_ok", "repeat_pattern_ok", "no_same_position_copy",
            "no_shared_char", "ends_ping", "ends_ping_when_upper_ze", "pingze_opposition", "seconds"}
    off, on = reports
    assert keys <= set(off) and keys <= set(on) and off["pairs"] == on["pairs"] == 2
    assert "zodiac_year" not in off and on["zodiac_year"] == 2027
    # these golds name other years, which the rule forbids: the ruled run matches them less
    assert on["bleu1"] < off["bleu1"]


def test_one_blocklist_object_per_year() -> None:
    # the constrainer's indexes are built per object (80 ms here): engines, benchmarks and
    # workers that ask again get the same one
    assert with_zodiac(default_blocklist(), 2027) is with_zodiac(default_blocklist(), 2027)
    assert with_zodiac(default_blocklist(), 2027) is not with_zodiac(default_blocklist(), 2028)


def test_a_composed_couplet_names_the_year_by_its_own_animal_only() -> None:
    terms = composed_terms(2027)
    assert {"马岁", "马年", "午年", "金马", "马迎春", "玉兔", "大圣", "猴日", "犬迎春"} <= terms
    assert not any("羊" in t for t in terms)
    assert with_zodiac(default_blocklist(), 2027).zodiac_year == 2027
