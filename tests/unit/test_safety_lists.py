"""The safety list in its three places: training filter, generation bans, user input.

Two fixed lists keep it from drifting. MUST_WRITE: festive phrases and everyday words that no
place may ban. MUST_BLOCK: vulgar and insulting terms, in simplified and traditional forms,
that no place may let through: a pair holding one is not trained on, a user cannot submit
one, and the decoder cannot complete one (its bans, and a forced attempt with a model that
wants nothing else).
"""

from __future__ import annotations

from functools import cache

import pytest
import torch

from chunlian.data.blocklist import (
    Blocklist,
    default_blocklist,
    input_blocklist,
    read_audited,
    training_blocklist,
)
from chunlian.data.corpus import drop_reason
from chunlian.engine.request import expand
from chunlian.engine.runner import ModelRunner
from chunlian.errors import InvalidInput
from chunlian.model.checkpoint import LoadedModel
from chunlian.model.decoding import LineState
from chunlian.model.tokenizer import Tokenizer
from chunlian.model.transformer import CoupletTransformer, ModelConfig
from chunlian.model.zodiac import with_zodiac
from chunlian.script import simplified, traditional
from chunlian.types import CoupletRequest, DecodeParams
from chunlian.validation import ComposeIn, CoupletIn, validate_heads, validate_keyword
from tests.unit.runner_util import run_all

MUST_WRITE = ["鹏程万里", "旭日东升", "事业圆满", "中国梦", "万里江山", "开天辟地", "真善美", "手机", "老板", "圆满", "东升", "万里", "中国", "奥运", "圣火", "开天", "独立", "问道", "开发", "管理", "祖宗", "短信", "盘古", "万岁", "抗战", "十八大", "性情", "吹箫", "黄菊", "劲舞", "午夜", "成人", "联通", "导航", "香港", "大中华", "渡口", "论坛", "政府", "重生", "升天", "圣母", "政治", "台湾", "汪洋", "华岳", "经文", "紫阳", "民国", "女人", "天游", "灌水", "和弦", "水浒", "虎头", "正法", "周旋", "寻仙", "下流", "战场", "地震", "干部", "青楼", "作秀", "总理", "信仰", "中朝", "公司", "四川", "西游", "救灾", "移动", "花蕊", "点金", "秦晋", "主席", "买卖", "高潮", "起义", "写真", "纪元", "天骄", "亚洲", "领导", "真相", "孤儿", "监督", "建筑", "老兵", "穷人", "电话", "佛教", "妈祖", "书记", "普贤", "地藏", "文殊", "客户", "维护", "广告", "航空", "超市", "挑战", "黑马", "爹娘", "主权", "新浪", "鲁迅", "哥哥", "妹妹", "妈妈", "爷爷", "爸爸", "姐姐", "父亲", "电影", "现金", "赚钱", "挣钱", "通知", "警察", "公安", "国税", "地税", "法院", "人民币", "天安门", "孙中山", "都江堰", "汶川", "救援", "非典", "抗震", "灾区", "遇难", "默哀", "股票", "销售", "商务", "咨询", "淘宝", "网易", "腾讯", "水乳交融", "人欢马叫春浓", "山阴道上", "桃李长春", "健康生活", "恭贺新春", "五福临门", "万事如意", "国泰民安", "龙腾虎跃", "马到成功", "三羊开泰", "普洱", "洱海", "法轮常转", "连战连胜", "江青山绿", "热血洗国耻", "忠奸情", "老板发了年终奖", "手机拜年发红包", "瞳孔", "卵石", "磷火", "王伟", "王勇", "刘伟", "张杰", "李建国", "杨帆", "王秀英", "刘杰"]

MUST_BLOCK_SIMPLIFIED = ["操你妈", "肏你妈", "草泥马", "傻逼", "傻屄", "婊子", "贱人", "王八蛋", "狗日的", "他妈的", "杂种", "狗娘养的", "鸡巴", "屌", "屄", "肏", "牛逼", "装逼", "骚货", "贱货", "妓女", "嫖娼", "强奸", "轮奸", "口交", "做爱", "性交", "淫荡", "卖淫", "你妈逼", "去你妈的", "操你祖宗", "龟孙子", "混蛋", "人渣", "脑残", "支那", "黑鬼", "淫", "妓", "屌你妈", "滚你妈"]
# the same, written in traditional characters (as zhconv writes them, Taiwan usage)
MUST_BLOCK_TRADITIONAL = ["操你媽", "肏你媽", "草泥馬", "賤人", "狗娘養的", "雞巴", "騷貨", "賤貨", "強姦", "輪姦", "做愛", "淫蕩", "賣淫", "你媽逼", "去你媽的", "龜孫子", "腦殘", "雜種", "他媽的", "屌你媽", "滾你媽"]
MUST_BLOCK = MUST_BLOCK_SIMPLIFIED + MUST_BLOCK_TRADITIONAL
PLACES = {"training": training_blocklist, "generation": default_blocklist, "input": input_blocklist}


def test_the_lists_are_what_the_issue_asks_for() -> None:
    assert len(set(MUST_WRITE)) == len(MUST_WRITE) >= 100
    assert all(simplified(t) != t for t in MUST_BLOCK_TRADITIONAL)
    assert {simplified(t) for t in MUST_BLOCK_TRADITIONAL} <= set(MUST_BLOCK_SIMPLIFIED)


def test_every_upstream_term_has_a_category_and_a_decision() -> None:
    entries = read_audited()
    upstream = {ln.strip() for ln in _upstream().splitlines() if ln.strip()}
    assert upstream <= {e.term for e in entries}
    assert all((e.category == "ordinary") != e.keep for e in entries)


def _upstream() -> str:
    from importlib import resources

    return resources.files("chunlian").joinpath("resources", "blocklist.upstream.txt").read_text("utf-8")


@pytest.mark.parametrize("place", sorted(PLACES))
def test_no_must_write_phrase_is_banned(place: str) -> None:
    bl = PLACES[place]()
    assert [w for w in MUST_WRITE if bl.find(w) or bl.find(traditional(w))] == []


def test_must_write_phrases_train_and_are_accepted_as_input() -> None:
    for w in MUST_WRITE:
        assert drop_reason(w, "天" * len(w), training_blocklist()) is None, w
        assert CoupletIn(upper=w).to_request().upper == w
        if len(w) <= 4:
            assert validate_keyword(w, 7) == w
        if len(w) == 2 and w[0] != w[1]:
            assert validate_heads(w) == w


def test_no_must_write_phrase_is_cut_short_by_the_decoder() -> None:
    bans = with_zodiac(default_blocklist(), 2027)  # the service's list, zodiac terms included
    for w in MUST_WRITE:
        for k in range(1, len(w)):
            assert w[k] not in bans.banned_next(w[:k]), w
        state = LineState(style="traditional", upper=w[:-1], upper_len=len(w) + 1, phase="upper")
        _, banned, _, _ = state.next_rule(bans)
        assert w[-1] not in banned or w[-1] in w[:-1], w  # a composed line repeats no character


@pytest.mark.parametrize("place", sorted(PLACES))
def test_every_must_block_term_is_banned(place: str) -> None:
    bl = PLACES[place]()
    assert [t for t in MUST_BLOCK if not bl.find(t)] == []


def test_no_must_block_term_can_be_trained_on() -> None:
    for t in MUST_BLOCK:
        upper, lower = "春" + t + "来", "花" + "开" * len(t) + "到"
        assert drop_reason(upper, lower, training_blocklist()) == "blocklisted", t
        assert drop_reason(lower, upper, training_blocklist()) == "blocklisted", t


@pytest.mark.parametrize("term", MUST_BLOCK)
def test_no_must_block_term_can_be_submitted(term: str) -> None:
    with pytest.raises(InvalidInput) as e:
        CoupletIn(upper="新春" + term + "福满门").to_request()
    assert e.value.field == "upper"
    if len(term) <= 4:
        with pytest.raises(InvalidInput) as e:
            ComposeIn(keyword=term, length=7).to_request()
        assert e.value.field == "keyword" and "vulgar or insulting" in str(e.value)
    if len(term) <= 2 and len(set(term)) == len(term):
        with pytest.raises(InvalidInput) as e:
            ComposeIn(heads=term).to_request()
        assert e.value.field == "heads"


def test_no_must_block_term_can_be_completed_by_the_decoder() -> None:
    bans = with_zodiac(default_blocklist(), 2027)
    for t in MUST_BLOCK_SIMPLIFIED:
        if len(t) == 1:
            assert t in bans.single_chars
            continue
        for phase, upper, lower in (("upper", t[:-1], ""), ("lower", "天地春秋山水风月花鸟", t[:-1])):
            state = LineState(style="traditional", upper=upper, upper_len=10, phase=phase, lower=lower)
            _, banned, _, _ = state.next_rule(bans)
            assert t[-1] in banned, (t, phase)


def test_traditional_output_of_a_banned_term_is_banned_too() -> None:
    # a line is generated in simplified characters and converted: its traditional form is listed
    for t in MUST_BLOCK_SIMPLIFIED:
        assert default_blocklist().find(traditional(t)), t


# ---- a forced attempt: a model that wants only the term's next character ----------------

_FILL = "天地春秋山水风月花鸟人家年岁福寿东西南光明清中金银红开来迎庭门城堂歌声华香"


@cache
def _eager_runner(target: str) -> ModelRunner:
    """A tiny model whose output strongly prefers ``target`` at every step."""
    torch.manual_seed(7)
    tok = Tokenizer.build([_FILL + "".join(MUST_BLOCK_SIMPLIFIED)], min_count=1)
    model = CoupletTransformer(ModelConfig(len(tok), 2, 2, 32, 64))
    plain, want = model.head, tok.stoi[target]

    def eager_head(h: torch.Tensor) -> torch.Tensor:
        logits = plain(h)
        logits[..., want] += 50.0
        return logits

    model.head = eager_head  # type: ignore[method-assign]
    return ModelRunner(LoadedModel(model, tok, "t", "0"), capacity=4, blocklist=default_blocklist())


@pytest.mark.parametrize("term", [t for t in MUST_BLOCK_SIMPLIFIED if len(t) == 2 and not input_blocklist().find(t[0])])
def test_a_model_that_wants_the_term_still_cannot_write_it(term: str) -> None:
    runner = _eager_runner(term[1])
    req = CoupletRequest(style="traditional", keyword=term[0], length=7, params=DecodeParams(n=1))
    unbanned = ModelRunner(runner.loaded, capacity=4, blocklist=Blocklist(set()))
    assert term in next(iter(run_all(unbanned, expand(req, 0)).values())).upper  # the attempt is real
    out = run_all(runner, expand(req, 0))
    lines = [o.upper + o.lower for o in out.values()]
    assert lines and all(term not in line for line in lines), lines
