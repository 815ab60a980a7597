"""Cache keys: ``chunlian:v1:`` + SHA-256 of everything that determines an answer.

Hashed material: the model tag (name and version: ``LoadedModel.tag``), the normalised 上联 / heads / keyword,
the length, the style, the decoding parameters and the seed. Greedy requests hash their
decoding as just ``greedy`` (temperature and top-k/p do not affect a greedy answer), so
equivalent requests share one entry. No user text appears in a key name.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache

from chunlian.types import CoupletRequest, DecodeParams, RequestIdentity

KEY_PREFIX = "chunlian:v1:"


def _decoding(params: DecodeParams) -> dict[str, object]:
    if params.greedy:
        return {"greedy": True}
    if params.beam is not None:  # a search ignores seed and sampling parameters
        return {"n": params.n, "beam": params.beam.as_dict()}
    d = params.as_dict()
    del d["beam"]  # None here: sampled keys read as they do without beams
    return d


def cache_key(model_tag: str, req: CoupletRequest) -> str:
    """The cache key of ``req`` answered by the model ``model_tag``."""
    return _key(model_tag, req.identity())


@lru_cache(maxsize=4096)  # a miss asks twice (lookup, then store), a hot line very often
def _key(model_tag: str, identity: RequestIdentity) -> str:
    upper, heads, keyword, length, style, params = identity
    material = {
        "model": model_tag,
        "upper": upper, "heads": heads, "keyword": keyword, "length": length,
        "style": style,
        "decoding": _decoding(params),
    }
    blob = json.dumps(material, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return KEY_PREFIX + hashlib.sha256(blob.encode("utf-8")).hexdigest()
