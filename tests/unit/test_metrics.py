"""``chunlian eval`` metrics on hand-made pairs with known answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from chunlian.model.hengpi import HengpiEntry, HengpiSelector
from chunlian.text import tone_class
from chunlian.training.evaluate import (
    METRIC_KEYS,
    compute_metrics,
    hengpi_agreement,
    pingze_share,
    random_real_baseline,
    repeat_pattern_ok,
)

GOLD_U, GOLD_L = "天增岁月人增寿", "春满乾坤福满门"


def test_keys_are_exactly_the_eval_keys() -> None:
    m = compute_metrics([GOLD_U], [GOLD_L], [GOLD_L])
    assert set(m) == set(METRIC_KEYS)
    assert set(METRIC_KEYS) == {
        "pairs", "bleu4", "bleu1", "length_ok", "repeat_pattern_ok", "no_same_position_copy",
        "no_shared_char", "ends_ping", "ends_ping_when_upper_ze", "pingze_opposition",
    }


def test_a_real_couplet_scores_perfectly() -> None:
    m = compute_metrics([GOLD_U], [GOLD_L], [GOLD_L])
    assert m["pairs"] == 1
    assert m["bleu4"] == pytest.approx(100.0)
    assert m["bleu1"] == pytest.approx(100.0)
    for key in METRIC_KEYS[3:]:
        assert m[key] == 1.0, key


def test_copying_the_upper_line_breaks_the_copy_rules_only() -> None:
    m = compute_metrics(["天天向上"], ["天天向上"], ["日日登高"])
    assert m["length_ok"] == 1.0
    assert m["repeat_pattern_ok"] == 1.0
    assert m["no_same_position_copy"] == 0.0
    assert m["no_shared_char"] == 0.0
    assert m["bleu4"] == pytest.approx(0.0)


def test_shared_char_at_another_position_is_not_a_same_position_copy() -> None:
    m = compute_metrics(["春来福到"], ["福满春归"], ["福满春归"])
    assert m["no_same_position_copy"] == 1.0
    assert m["no_shared_char"] == 0.0


def test_repeat_pattern() -> None:
    assert repeat_pattern_ok("山山水水", "风风雨雨")
    assert not repeat_pattern_ok("山山水水", "风雨云月")  # upper repeats, lower does not
    assert not repeat_pattern_ok("山水云月", "风风雨雨")  # lower repeats, upper does not
    assert not repeat_pattern_ok("山山水", "风风")  # lengths differ
    assert repeat_pattern_ok("春来，福到", "花开，喜临")  # punctuation counts like a character
    m = compute_metrics(["山山水水", "山山水"], ["风雨云月", "风风"], ["风风雨雨", "风风雨"])
    assert m["repeat_pattern_ok"] == 0.0
    assert m["length_ok"] == 0.5


def test_ends_ping_over_all_pairs_and_over_ze_uppers() -> None:
    # 寿 (shou4) is 仄, 春 (chun1) is 平; 门 (men2) is 平, 月 (yue4) is 仄.
    assert tone_class("寿") == "ze" and tone_class("春") == "ping"
    uppers = ["人增寿", "花迎春"]
    hyps = ["福满门", "雪映月"]
    m = compute_metrics(uppers, hyps, hyps)
    assert m["ends_ping"] == 0.5
    assert m["ends_ping_when_upper_ze"] == 1.0  # only 人增寿 counts
    m2 = compute_metrics(["花迎春"], ["雪映月"], ["雪映月"])
    assert m2["ends_ping_when_upper_ze"] == 0.0  # no pair qualifies: 0.0 by definition


def test_pingze_opposition_per_pair_then_averaged() -> None:
    # 春风: checked position 1 only. 风 (ping) vs 月 (ze): opposed; vs 花 (ping): not.
    assert pingze_share("春风", "秋月") == 1.0
    assert pingze_share("春风", "秋花") == 0.0
    m = compute_metrics(["春风", "春风"], ["秋月", "秋花"], ["秋月", "秋月"])
    assert m["pingze_opposition"] == 0.5


def test_pingze_skips_neutral_tones_and_pairs_without_checked_positions() -> None:
    assert tone_class("的") == ""
    # 增(ping)/满(ze) opposed at 1, 月/的 skipped at 3, 增/满 at 5 opposed, 寿/门 opposed.
    assert pingze_share("天增岁月人增寿", "春满乾的福满门") == 1.0
    assert pingze_share("天的", "春了") is None
    m = compute_metrics(["天的", "春风"], ["春了", "秋花"], ["春了", "秋花"])
    assert m["pingze_opposition"] == 0.0  # only the second pair counts


def test_pingze_checks_each_clause() -> None:
    # clauses 春来 / 福到门: positions 1 (来), 4 (到) and 5 (门).
    # 来(ping)-去(ze) opposed, 到(ze)-开(ping) opposed, 门(ping)-门(ping) not: 2/3.
    assert pingze_share("春来，福到门", "冬去，花开门") == pytest.approx(2 / 3)


def test_bleu1_counts_matching_characters() -> None:
    m = compute_metrics(["天增岁月"], ["春满人间"], ["春满乾坤"])
    assert m["bleu1"] == pytest.approx(50.0)  # 2 of 4 characters, no brevity penalty
    assert m["bleu4"] < m["bleu1"]


def test_empty_input_and_mismatched_lengths() -> None:
    assert compute_metrics([], [], []) == dict.fromkeys(METRIC_KEYS, 0.0)
    with pytest.raises(ValueError):
        compute_metrics(["春风"], [], ["秋月"])


# ---- baselines ---------------------------------------------------------------------------


def test_random_real_baseline_matches_length_and_avoids_the_reference() -> None:
    pool = ["春满乾坤福满门", "花开富贵", "竹报平安", "福满人间", "岁岁平安年年好"]
    uppers = ["天增岁月人增寿", "门迎百福", "四海同春"]
    refs = ["春满乾坤福满门", "花开富贵", "竹报平安"]
    for seed in range(10):
        out = random_real_baseline(uppers, refs, pool, seed)
        assert [len(x) for x in out] == [len(u) for u in uppers]
        assert all(x in pool for x in out)
        assert out[1] != refs[1] and out[2] != refs[2]
        assert out == random_real_baseline(uppers, refs, pool, seed)


def test_random_real_baseline_falls_back_to_the_reference_length_then_the_nearest() -> None:
    pool = ["春满人间", "瑞雪兆丰年", "福"]
    out = random_real_baseline(["一二三四五六"], ["瑞雪兆丰年"], pool, 0)
    assert out == ["瑞雪兆丰年"]  # no 6-character line: the reference's length (5)
    out = random_real_baseline(["一二三"], ["一二"], pool, 0)
    assert out == ["春满人间"]  # neither 3 nor 2: nearest (4 beats 1)
    with pytest.raises(ValueError):
        random_real_baseline(["一二"], ["三四"], [], 0)


def _selector(*phrases: str) -> HengpiSelector:
    tags = {
        "财源广进": ("business", "wealth"),
        "山清水秀": ("literary", "landscape"),
        "寿比南山": ("family", "longevity"),
    }
    return HengpiSelector(
        [HengpiEntry(p, frozenset({tags[p][0]}), frozenset({tags[p][1]})) for p in phrases]
    )


TRIPLES = [
    ("生意兴隆通四海", "财源茂盛达三江", "财源广进"),
    ("绿水青山千里秀", "清风明月一江春", "山水清秀"),
]


def test_hengpi_agreement_scores_the_choice_and_a_random_pick() -> None:
    sel = _selector("财源广进", "山清水秀", "寿比南山")
    out = hengpi_agreement(sel, TRIPLES, style="business")
    assert out["rows"] == 2
    assert out["char_overlap"] == 1.0  # 财源广进 and 山清水秀 both share characters
    assert out["theme_overlap"] == 1.0
    assert 0.0 <= out["random_char_overlap"] < 1.0
    assert 0.0 <= out["random_theme_overlap"] < 1.0
    assert out == hengpi_agreement(sel, TRIPLES, style="business")


def test_random_pick_equals_the_choice_when_there_is_one_phrase() -> None:
    out = hengpi_agreement(_selector("寿比南山"), TRIPLES)
    assert out["char_overlap"] == out["random_char_overlap"] == 0.5  # 山 in 山水清秀
    assert out["theme_overlap"] == out["random_theme_overlap"] == 0.5  # landscape via 山


def test_eval_without_sacrebleu_names_the_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    """A serving install has no sacrebleu: ``chunlian eval`` says which extra brings it,
    before it loads any model."""
    import importlib.util

    from chunlian.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sacrebleu" else real(name, *a))
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(f"{GOLD_U}\t{GOLD_L}\n", encoding="utf-8")
    assert main(["eval", "--data", str(pairs)]) == 2
    assert "pip install 'chunlian[eval]'" in capsys.readouterr().err
