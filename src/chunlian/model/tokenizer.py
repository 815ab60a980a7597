"""Character vocabulary with special tokens; saved inside the checkpoint.

Sequence format (one format for both directions)::

    [BOS] [STYLE] [REGISTER] u_0 ... u_{n-1} [SEP] l_0 ... l_{n-1} [EOS]

so the model (a) writes a 下联 after ``[SEP]`` given the 上联 and (b) writes a 上联 from
forced first characters after the three prefix tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from chunlian.model.styles import STYLES, TRAIN_ONLY_STYLES

PAD, UNK, BOS, SEP, EOS = "<pad>", "<unk>", "<bos>", "<sep>", "<eos>"
REGISTER_TOKENS = ("<r:modern>", "<r:classical>")
STYLE_TOKENS = tuple(f"<s:{s}>" for s in STYLES + TRAIN_ONLY_STYLES)
SPECIALS: tuple[str, ...] = (PAD, UNK, BOS, SEP, EOS, *REGISTER_TOKENS, *STYLE_TOKENS)
PREFIX_LEN = 3  # BOS, style, register
# Optional special tokens, appended after the characters so that vocabularies built
# without them keep their ids: ``<r:reversed>`` marks a modern pair trained the other way
# round (下联 as 上联; ``chunlian train --augment-reverse``). Never generated, never decoded.
REVERSED_TOKEN = "<r:reversed>"
EXTRA_SPECIALS: tuple[str, ...] = (REVERSED_TOKEN,)


class Tokenizer:
    """Maps characters to ids and back; ids below ``len(SPECIALS)`` are special tokens."""

    def __init__(self, itos: list[str]) -> None:
        if tuple(itos[: len(SPECIALS)]) != SPECIALS:
            raise ValueError("vocabulary must start with the special tokens in order")
        self.itos = list(itos)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.pad_id = self.stoi[PAD]
        self.unk_id = self.stoi[UNK]
        self.bos_id = self.stoi[BOS]
        self.sep_id = self.stoi[SEP]
        self.eos_id = self.stoi[EOS]
        self.n_special = len(SPECIALS)
        self.extra_special_ids = frozenset(self.stoi[t] for t in EXTRA_SPECIALS if t in self.stoi)

    @classmethod
    def build(cls, lines: Iterable[str], min_count: int = 2, extra: Iterable[str] = ()) -> Tokenizer:
        """Specials, then characters seen ``min_count`` times, then the ``extra`` specials
        asked for (each one of ``EXTRA_SPECIALS``)."""
        counts: Counter[str] = Counter()
        for line in lines:
            counts.update(line)
        chars = sorted(c for c, n in counts.items() if n >= min_count and c not in SPECIALS)
        extras = list(dict.fromkeys(extra))
        unknown = [t for t in extras if t not in EXTRA_SPECIALS]
        if unknown:
            raise ValueError(f"extra special tokens must be among {EXTRA_SPECIALS}, got {unknown}")
        return cls(list(SPECIALS) + chars + extras)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(ch, self.unk_id) for ch in text]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.itos[i] for i in ids if i >= self.n_special and i not in self.extra_special_ids)

    def style_id(self, style: str) -> int:
        return self.stoi[f"<s:{style}>"]

    def register_id(self, register: str) -> int:
        return self.stoi[f"<r:{register}>"]

    def has_register(self, register: str) -> bool:
        return f"<r:{register}>" in self.stoi

    def prefix(self, style: str, register: str = "modern") -> list[int]:
        return [self.bos_id, self.style_id(style), self.register_id(register)]

    def knows(self, ch: str) -> bool:
        return ch in self.stoi


def upper_role(i: int) -> int:
    """Role of 上联 character ``i`` (see ``transformer`` docstring)."""
    return 1 + i


def lower_role(j: int, max_line: int = 32) -> int:
    """Role of the token whose next prediction is 下联[j]."""
    return 1 + max_line + j


def sequence_roles(n_upper: int, n_lower: int) -> list[int]:
    """Roles for ``prefix + upper(n_upper) + [SEP] + lower(n_lower)`` (EOS never an input)."""
    return (
        [0] * PREFIX_LEN
        + [upper_role(i) for i in range(n_upper)]
        + [lower_role(j) for j in range(n_lower + 1)]
    )
