"""Copy a ``chunlian data`` folder with its everyday pairs given a source of their own.

    python scripts/everyday_source.py runs/data runs/data-everyday
    chunlian train --data runs/data-everyday --mix everyday=0.35,... (docs/MODEL_CARD.md)

A training pair is everyday when its two lines hold at least two colloquial particles or
pronouns (了, 吗, 们, 这, 你, 很, 都, 把, ...) or one of a list of modern everyday words
(手机, 工资, 回家, 过年, 孩子, ...). The list is written here, not drawn from the campaign set
(``data/campaign``), which stays an evaluation set. Its pairs keep their register; only the
``source`` column changes to ``everyday``, so ``--mix`` can weight them. The validation splits
and ``stats.json`` are copied unchanged.
"""

from __future__ import annotations

import argparse
import csv
import re
import shutil
from pathlib import Path

PARTICLES = frozenset("了吗呢吧啊们这那你我他她很都也把被给让咱俺")
WORDS = re.compile("|".join([
    "手机", "电脑", "网络", "微信", "工资", "公司", "老板", "学校", "考试", "高考", "汽车", "火车", "高铁",
    "飞机", "电视", "春晚", "红包", "饺子", "孩子", "爸爸", "妈妈", "爷爷", "奶奶", "家人", "朋友", "同学",
    "老师", "上班", "加班", "放假", "回家", "过年", "快乐", "开心", "幸福", "健康", "平安", "打工", "发财",
    "赚钱", "挣钱", "小康", "致富", "农民", "城市", "房子", "买房", "旅游", "宝宝", "媳妇", "老婆", "老公",
    "儿子", "女儿",
]))


def everyday(upper: str, lower: str) -> bool:
    """Whether a pair is written in everyday language (module docstring)."""
    text = upper + lower
    return sum(ch in PARTICLES for ch in text) >= 2 or WORDS.search(text) is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", type=Path, help="a folder written by chunlian data")
    ap.add_argument("out", type=Path, help="the folder to write")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for extra in args.data.iterdir():
        if extra.name != "train.tsv" and extra.is_file():
            shutil.copy2(extra, args.out / extra.name)
    marked = 0
    with (args.data / "train.tsv").open(encoding="utf-8", newline="") as f, \
            (args.out / "train.tsv").open("w", encoding="utf-8", newline="") as g:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        assert reader.fieldnames is not None and "source" in reader.fieldnames, "train.tsv needs a source column"
        writer = csv.DictWriter(g, reader.fieldnames, delimiter="\t", quoting=csv.QUOTE_NONE, lineterminator="\n")
        writer.writeheader()
        for row in reader:
            if everyday(row["upper"], row["lower"]):
                row["source"] = "everyday"
                marked += 1
            writer.writerow(row)
    print(f"{marked} everyday pairs marked in {args.out / 'train.tsv'}")


if __name__ == "__main__":
    main()
