"""The one place ``auto`` becomes a device."""

from __future__ import annotations


def resolve_device(device: str) -> str:
    """``cpu`` or ``cuda`` as given; ``auto``: cuda when torch sees a GPU, else cpu."""
    if device != "auto":
        return device
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"
