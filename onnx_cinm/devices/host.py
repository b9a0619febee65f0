"""The host CPU: runs every op that no memory-centric device takes (through onnxruntime)."""
from __future__ import annotations

from dataclasses import dataclass

from . import register
from .base import OpInfo, Support


@dataclass(frozen=True)
class HostParams:
    """The host has no modeled parameters yet; a measured roofline arrives with cost placement."""


@dataclass
class HostDevice:
    """The host CPU (paradigm ``host``); supports every op."""

    name: str = "host"
    paradigm: str = "host"
    params: HostParams = HostParams()

    def supports(self, op: OpInfo) -> Support:
        return Support(True, "the host runs every op")


register(HostDevice())
