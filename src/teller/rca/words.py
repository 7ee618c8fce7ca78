"""The explanation decoder's words: a closed vocabulary of plain words plus four slots.

Why slots: the decoder may only ever say what the pointed node's facts say. Operator names, rank
numbers and durations never enter the vocabulary; a reference sentence has them replaced by
``<op>``, ``<rank>``, ``<observed>`` and ``<normal>`` before training, and a generated sentence has
its slots filled from the pointed node (`fill`). Identifier-like words (``o_proj``,
``scaled_dot_product_attention``, ``aten::mm``) are left out of the vocabulary too, so no operator
can be named in passing. A reference that names no operator gets an evidence clause
(`EVIDENCE`) when its step has a pointed node, so every explanation states what it rests on.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from teller.errors import TraceError

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
OP, RANK, OBSERVED, NORMAL = "<op>", "<rank>", "<observed>", "<normal>"
SLOTS = (OP, RANK, OBSERVED, NORMAL)
#: Appended to a reference that names no operator, when its step has a pointed node.
EVIDENCE = "It shows in <op> on rank <rank> : <observed> against <normal> normally ."
#: Longest sentence, in words, with its end mark (longer references are cut).
MAX_WORDS = 48

_PIECE = re.compile(r"<\w+>|'s\b|[A-Za-z][\w:.\-]*[A-Za-z\d]|[A-Za-z]|\d+(?:\.\d+)?|[^\w\s]")
_RANK_MENTION = re.compile(r"\b(rank|GPU)\s+(\d+)\b", re.IGNORECASE)
_NO_SPACE_BEFORE = frozenset({".", ",", ";", ":", ")", "'s", "%", "/"})
_NO_SPACE_AFTER = frozenset({"(", "/"})


def pieces(text: str) -> list[str]:
    """Words, numbers, slots and punctuation marks of a sentence, in order."""
    return _PIECE.findall(text)


def slotted(text: str, operator: str | None, rank: int | None) -> list[str]:
    """A reference sentence as vocabulary pieces: the guilty operator (its full name, or its last
    ``::`` part as a word) becomes ``<op>``, every ``rank N``/``GPU N`` number ``<rank>``."""
    if operator:
        text = text.replace(operator, f" {OP} ")
        short = operator.rsplit("::", 1)[-1]
        if short and short != operator and len(short) > 3:
            text = re.sub(rf"(?<![\w:]){re.escape(short)}(?![\w:])", f" {OP} ", text)
    text = _RANK_MENTION.sub(lambda m: f"{m.group(1)} {RANK}", text)
    return pieces(text)


def target_words(text: str, operator: str | None, rank: int | None, has_node: bool) -> list[str]:
    """What the decoder is trained to write for one anomalous step."""
    words = slotted(text, operator, rank)
    if has_node and OP not in words:
        words += pieces(EVIDENCE)
    return words[: MAX_WORDS - 1]


def _plain(word: str) -> bool:
    """A word the decoder may say: slots, and words that are not identifiers or numbers."""
    if word in SLOTS:
        return True
    return not ("_" in word or "::" in word or re.search(r"\d", word))


@dataclass
class WordVocab:
    """Decoder vocabulary: the specials, the slots, then plain words by frequency."""

    words: list[str]

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], min_count: int = 1) -> WordVocab:
        counts = Counter(w for sentence in sentences for w in sentence if _plain(w))
        ranked = sorted(
            (w for w, n in counts.items() if n >= min_count and w not in SLOTS),
            key=lambda w: (-counts[w], w),
        )
        return cls([*SPECIALS, *SLOTS, *ranked])

    def __post_init__(self) -> None:
        self.index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, words: Sequence[str]) -> list[int]:
        """<bos> words <eos>; words outside the vocabulary become <unk> (never generated)."""
        unk = self.index[UNK]
        body = [self.index.get(w, unk) for w in words[: MAX_WORDS - 1]]
        return [self.index[BOS], *body, self.index[EOS]]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Words up to the end mark, without the specials."""
        out = []
        for i in ids:
            word = self.words[int(i)]
            if word == EOS:
                break
            if word not in SPECIALS:
                out.append(word)
        return out

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"format": "teller.words/1", "words": self.words}, indent=0))

    @classmethod
    def load(cls, path: Path) -> WordVocab:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise TraceError(path, "missing: the model's explanation vocabulary") from None
        except json.JSONDecodeError as error:
            raise TraceError(path, f"not valid JSON ({error.msg})") from None
        words = data.get("words") if isinstance(data, dict) else None
        if data.get("format") != "teller.words/1" or not isinstance(words, list):
            raise TraceError(path, "not an explanation vocabulary (format teller.words/1)")
        if tuple(words[: len(SPECIALS) + len(SLOTS)]) != SPECIALS + SLOTS:
            raise TraceError(path, "explanation vocabulary lacks its specials and slots")
        return cls([str(w) for w in words])


def fill(words: Sequence[str], slots: dict[str, str]) -> str:
    """A sentence from decoder words with the slots replaced by the pointed node's facts."""
    text = ""
    previous = ""
    for word in words:
        shown = slots.get(word, word)
        if text and word not in _NO_SPACE_BEFORE and previous not in _NO_SPACE_AFTER:
            text += " "
        text += shown
        previous = word
    return text
