"""The device protocol: what a chip provides to the layers above it.

The upper layers (frontend, dialects, passes) talk to devices only through these types and the
registry in :mod:`onnx_cinm.devices`; they never import a device package. A device describes one
chip: its name, its paradigm (``"cim"``, ``"cnm"`` or ``"host"``), its parameters (a dataclass
whose fields carry units and sources) and which cinm ops it can run (:meth:`Device.supports`).
Cost models, lowering and code generation join the protocol with the crossbar and UPMEM paths.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


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

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape with symbolic dims taken as 1 (e.g. a dynamic batch), None if rank unknown."""
        if self.shape is None:
            return None
        return tuple(d if isinstance(d, int) else 1 for d in self.shape)

    @property
    def numel(self) -> int:
        """Element count with symbolic dims taken as 1; 0 if the rank is unknown."""
        s = self.static_shape
        return 0 if s is None else math.prod(s)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor (:attr:`numel` times the element size); 0 if the dtype is unknown."""
        return 0 if self.dtype is None else self.numel * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class OpInfo:
    """A cinm node as a device sees it.

    Attributes:
        name: node name.
        op_type: cinm op type (e.g. ``"Gemm"``).
        attrs: node attributes as python values.
        inputs, outputs: :class:`TensorInfo` per (non-empty) input and output.
        flops: arithmetic operations of one inference (multiply and add count separately;
            symbolic dims taken as 1).
    """

    name: str
    op_type: str
    attrs: dict
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    flops: int = 0


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
    """

    latency_s: float
    energy_j: float
    writes: int = 0
    bytes_moved: int = 0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.latency_s + other.latency_s, self.energy_j + other.energy_j,
                    self.writes + other.writes, self.bytes_moved + other.bytes_moved)


@dataclass(frozen=True)
class Support:
    """A device's answer to "can you run this op?": ``ok`` and, either way, the reason in words.

    ``applicable`` is False when the op is simply not of a kind the device computes (a crossbar
    asked about a Relu); placement then leaves the refusal out of its explanation. ``preferred``
    is False when the device can run the op but the paper heuristic should not choose it on its
    own (a crossbar asked to program an activation every inference); a user hint still may.
    """

    ok: bool
    reason: str
    applicable: bool = True
    preferred: bool = True

    def __bool__(self) -> bool:
        return self.ok


@runtime_checkable
class Device(Protocol):
    """One device family, as the placement pass and the report see it.

    Attributes:
        name: registry name, used in ``--place PATTERN=NAME`` and in the ``device`` attribute.
        paradigm: ``"cim"`` (compute-in-memory), ``"cnm"`` (compute-near-memory) or ``"host"``.
        params: a dataclass of the device's parameters, each field documented with unit and source.
    """

    name: str
    paradigm: str
    params: object

    def supports(self, op: OpInfo) -> Support:
        """Whether this device can run ``op``, with the reason."""
        ...


@runtime_checkable
class TargetDevice(Device, Protocol):
    """A device that compiles cinm ops into kernels of its own (crossbars, DPUs).

    The paradigm pass of the device's paradigm (``cim_tiling``, ``cnm_mapping``) calls
    :meth:`lower` for every node placed on it and stores the returned plan as node attributes;
    when the optimized model is written, :meth:`emit` writes the node's kernel files.
    """

    def cost(self, op: OpInfo) -> Cost:
        """Modeled cost of one inference of ``op`` on this device (default options)."""
        ...

    def lower(self, op: OpInfo, options: dict) -> dict:
        """The plan of ``op``: attributes to set on the node, named as in
        ``onnx_cinm.dialects.cinm.PLAN_ATTRS`` (``cim_*`` / ``cnm_*``), plus ``kernel`` (the
        kernel's path relative to the ``<model>.cinm/`` folder, unique in the model).
        ``options`` are the pass options (``PassContext.options``). Raises CinmError on bad options.
        """
        ...

    def emit(self, op: OpInfo, attrs: dict, consts: dict, root) -> list:
        """Write the kernel of a lowered node under ``root`` (the ``<model>.cinm/`` folder being
        built) at ``attrs["kernel"]``; ``consts`` maps the node's constant input names to numpy
        arrays. Returns the paths written."""
        ...


@dataclass
class Registry:
    """Devices by name. Device packages register themselves; the upper layers only look up."""

    devices: dict[str, Device] = field(default_factory=dict)

    def register(self, device: Device) -> Device:
        """Add ``device``; raises ValueError if its name is taken or its paradigm unknown."""
        if device.name in self.devices:
            raise ValueError(f"device {device.name!r} is already registered")
        if device.paradigm not in ("cim", "cnm", "host"):
            raise ValueError(f"device {device.name!r}: unknown paradigm {device.paradigm!r}")
        self.devices[device.name] = device
        return device
