"""Save and load model weights with their config and vocabulary (safetensors).

Everything needed to rebuild the model travels inside the file's metadata: the
``ModelConfig``, the vocabulary, the model name and version. fp16 on disk; loaded as fp32.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from chunlian.errors import ModelError
from chunlian.model.tokenizer import Tokenizer
from chunlian.model.transformer import CoupletTransformer, ModelConfig

MODEL_NAME = "chunlian-couplet"
DEFAULT_WEIGHTS = Path(__file__).resolve().parent.parent / "weights" / "chunlian-couplet.safetensors"
# Weights trained with reversed pairs (``chunlian train --augment-reverse``): weaker greedy,
# stronger under a wide beam with channel reranking (``engine.channel``) - the offline
# quality preset (``offline.QUALITY``; docs/MODEL_CARD.md)
QUALITY_WEIGHTS = DEFAULT_WEIGHTS.with_name("chunlian-couplet-rev.safetensors")


@dataclass
class LoadedModel:
    model: CoupletTransformer
    tokenizer: Tokenizer
    name: str
    version: str  # short content hash of the weights file unless set at export

    @property
    def tag(self) -> str:
        """``name@version``: part of every cache key and every response's ``model``."""
        return f"{self.name}@{self.version}"


def save_weights(
    path: Path, model: CoupletTransformer, tok: Tokenizer, version: str, extra: dict[str, str] | None = None
) -> None:
    from safetensors.torch import save_file

    tensors = {
        k: v.detach().to(torch.float16).contiguous().cpu()
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }
    meta = {
        "name": MODEL_NAME,
        "version": version,
        "config": json.dumps(model.cfg.to_dict()),
        "vocab": json.dumps(tok.itos, ensure_ascii=False),
        **(extra or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta)


def load_weights(path: Path | None = None, device: str = "cpu") -> LoadedModel:
    """Load a shipped or exported model; raises ``ModelError`` with the reason.

    Inference runs in float32. On a CPU the tied LM head runs on oneDNN (``model.onednn``:
    the same logits, faster on AMD hosts; ``model.lm_head = None`` puts PyTorch's kernel
    back)."""
    from safetensors import safe_open

    path = path or DEFAULT_WEIGHTS
    if not path.is_file():
        raise ModelError(f"model weights not found at {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            state = {k: f.get_tensor(k).float() for k in f.keys()}  # noqa: SIM118
        cfg = ModelConfig(**json.loads(meta["config"]))
        tok = Tokenizer(json.loads(meta["vocab"]))
    except (KeyError, ValueError, OSError) as e:
        raise ModelError(f"cannot read model weights at {path}: {e}") from e
    model = CoupletTransformer(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelError(f"weights at {path} do not fit the model: missing={missing} unexpected={unexpected}")
    model.eval().to(device)
    if device == "cpu":
        from chunlian.model.onednn import onednn_supported, use_onednn_head

        if onednn_supported():
            use_onednn_head(model)
    version = meta.get("version") or hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return LoadedModel(model, tok, meta.get("name", MODEL_NAME), version)
