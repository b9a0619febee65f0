"""Graph types every layer shares: what the compiler knows of one tensor and one cinm node, and
what running one op costs.

This module is the bottom of the layer stack (see ``docs/architecture.md``): it imports nothing
of onnx_cinm, and the dialect, the devices, the passes and the runtime all describe tensors and
ops with these two types. Walkers that build them from a model are in :mod:`onnx_cinm.analysis`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


@functools.cache
def dtype_name(dtype) -> str:
    """``np.dtype(dtype).name`` (``"float32"``, ``"int8"``) of a numpy dtype or scalar type,
    memoized: the devices' ``supports`` ask it for every operand of every op placement
    queries, and numpy builds the name afresh on each call. Raises TypeError as ``np.dtype``."""
    return np.dtype(dtype).name


@functools.cache
def _itemsize(dtype) -> int:
    return np.dtype(dtype).itemsize


class _computed_once:
    """A property of a frozen dataclass computed on first access and kept in the instance's
    ``__dict__`` (later reads never reach this descriptor). ``functools.cached_property``
    takes a lock on every first access (Python 3.11), which cost more than the values."""

    def __init__(self, fn):
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass(frozen=True)
class TensorInfo:
    """What placement knows about one tensor.

    Attributes:
        name: tensor name in the graph.
        dtype: numpy dtype of the elements, or None if unknown.
        shape: dims as ints (known) or strings (symbolic); None if the rank is unknown.
        const: True if the value is known at compile time (an initializer), e.g. weights.
    """

    name: str
    dtype: np.dtype | None
    shape: tuple | None
    const: bool = False

    # computed once per info (the fields are frozen): placement, the cost models and the
    # report ask for them tens of thousands of times on one model

    @_computed_once
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape with symbolic dims taken as 1 (e.g. a dynamic batch), None if rank unknown."""
        if self.shape is None:
            return None
        return tuple(d if isinstance(d, int) else 1 for d in self.shape)

    @_computed_once
    def numel(self) -> int:
        """Element count with symbolic dims taken as 1; 0 if the rank is unknown."""
        s = self.static_shape
        return 0 if s is None else math.prod(s)

    @_computed_once
    def nbytes(self) -> int:
        """Bytes of the tensor (:attr:`numel` times the element size); 0 if the dtype is unknown."""
        return 0 if self.dtype is None else self.numel * _itemsize(self.dtype)


@dataclass(frozen=True)
class OpInfo:
    """A cinm node as a device sees it.

    Attributes:
        name: node name.
        op_type: cinm op type (e.g. ``"Gemm"``).
        attrs: node attributes as python values.
        inputs, outputs: :class:`TensorInfo` per (non-empty) input and output.
        flops: arithmetic operations of one inference (multiply and add count separately;
            symbolic dims taken as 1); a Loop's or Scan's include its body's (run on the host
            as part of the node; :func:`onnx_cinm.analysis.body_flops`).
    """

    name: str
    op_type: str
    attrs: dict
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    flops: int = 0


class CostPart(NamedTuple):
    """One term of a :class:`Cost` broken down by what spends it (e.g. a crossbar's ``array``,
    ``adc_dac`` and ``periphery``): seconds and joules of one inference, and the chip area
    (mm^2) the op occupies for that term. The parts of a cost add up to its latency and energy.

    ``folded``: the term of the part whose figures hold this one's energy and area (the device
    publishes only their sum: e.g. ``"array"`` for a chip whose TOPS/W includes its ADCs), so
    its ``energy_j`` and ``area_mm2`` are 0 meaning "counted there", not "free"; its latency
    is still its own. ``""`` (false): published apart."""

    term: str
    latency_s: float
    energy_j: float
    area_mm2: float = 0.0
    folded: str = ""


@dataclass(frozen=True)
class Cost:
    """What running one op costs on a device, for one inference.

    Attributes:
        latency_s: modeled wall time, seconds (device work only; host<->device transfers are
            added by placement per edge).
        energy_j: modeled energy, joules.
        writes: device programming operations; for a crossbar, whole-tile writes (one tile is
            ``rows x cols`` cells programmed at once, as OCC counts them). 0 for devices that
            are not programmed.
        bytes_moved: bytes crossing the device boundary (inputs in, results out, weights in).
        parts: the latency, energy and area by component (:class:`CostPart`; summed they give
            ``latency_s`` and ``energy_j``), when the device models them; ``()`` otherwise.
            Not compared, and a sum of costs has none.
    """

    latency_s: float
    energy_j: float
    writes: int = 0
    bytes_moved: int = 0
    parts: tuple = field(default=(), compare=False)

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.latency_s + other.latency_s, self.energy_j + other.energy_j,
                    self.writes + other.writes, self.bytes_moved + other.bytes_moved)
