"""Cache keys: ``chunlian:v1:`` + SHA-256 of everything that determines an answer.

Hashed material: the model tag (name and version: ``LoadedModel.tag``; for a searched
answer, best or good, the search weights' tag too; for every answer the decoding rules'
version and zodiac year, ``Settings.rules_tag``: ``api.service``), the normalised 上联 / heads / keyword,
the length, the style, the decoding parameters and the seed, and the mode that served the
answer (``engine.tiers``; a fast answer's key leaves it out). The request's ``quality`` is
not hashed: it decides which keys a lookup tries (``api.service``). Greedy requests hash their
decoding as just ``greedy`` (temperature and top-k/p do not affect a greedy answer), so
equivalent requests share one entry. No user text appears in a key name.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache

from chunlian.types import CoupletRequest, DecodeParams, RequestIdentity, Served

KEY_PREFIX = "chunlian:v1:"


def _decoding(params: DecodeParams) -> dict[str, object]:
    if params.greedy:
        return {"greedy": True}
    if params.beam is not None:  # a search ignores seed and sampling parameters
        return {"n": params.n, "beam": params.beam.as_dict()}
    d = params.as_dict()
    del d["beam"]  # None here: sampled keys read as they do without beams
    return d


def cache_key(model_tag: str, req: CoupletRequest, served: Served = "fast") -> str:
    """The cache key of ``req``'s answer written by ``served`` with the model ``model_tag``."""
    return _key(model_tag, req.identity(), served)


@lru_cache(maxsize=4096)  # a miss asks twice (lookup, then store), a hot line very often
def _key(model_tag: str, identity: RequestIdentity, served: Served) -> str:
    upper, heads, keyword, length, style, params, _quality = identity
    material: dict[str, object] = {
        "model": model_tag,
        "upper": upper, "heads": heads, "keyword": keyword, "length": length,
        "style": style,
        "decoding": _decoding(params),
    }
    if served != "fast":
        material["served"] = served
    blob = json.dumps(material, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return KEY_PREFIX + hashlib.sha256(blob.encode("utf-8")).hexdigest()
