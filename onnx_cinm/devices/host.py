"""The host CPU: runs every op that no memory-centric device takes (through onnxruntime)."""
from __future__ import annotations

from dataclasses import dataclass

from ..options import option
from . import register
from .base import Cost, Device, OpInfo, Support


def _roofline(value):
    """A :class:`~onnx_cinm.hostmodel.HostRoofline` as it is, or its text form checked:
    ``nominal``, ``measure`` (probed when first needed, not now) or ``GFLOPS,GBPS[,WATTS]``.
    Raises CinmError otherwise."""
    from .. import hostmodel  # imports onnx: only when a roofline is given

    if isinstance(value, hostmodel.HostRoofline):
        return value
    if not isinstance(value, str):
        raise ValueError("expected 'nominal', 'measure' or GFLOPS,GBPS[,WATTS]")
    if value.strip().lower() != hostmodel.MEASURE:
        hostmodel.parse(value)
    return value


@dataclass(frozen=True)
class HostOptions:
    """The host's options (keys ``host_<field>``)."""

    roofline: str | None = option(
        None, help="host figures for cost placement: 'nominal' (50 GFLOP/s, 10 GB/s, 30 W: "
        "fixed, so placement is reproducible), 'measure' (probe this machine once, median of "
        "repeated runs, cached) or GFLOPS,GBPS[,WATTS] (default: $ONNX_CINM_HOST_ROOFLINE, "
        "else nominal)", parse=_roofline, metavar="GFLOPS,GBPS[,W]|nominal|measure")


@dataclass(frozen=True)
class HostParams:
    """The host's figures come from a roofline (:mod:`onnx_cinm.hostmodel`): nominal (50 GFLOP/s,
    10 GB/s, 30 W) unless the ``host_roofline`` option or ``ONNX_CINM_HOST_ROOFLINE`` gives
    others or asks for ``measure`` (probed once per machine and cached)."""


#: Ops whose output aliases their input in onnxruntime (its CPU kernels for these declare the
#: output may share the input's buffer, so they only rewrite the shape): no data moves.
ALIASING_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
#: Ops that read only their input's metadata (shape): they write their small output, nothing else.
METADATA_OPS = frozenset({"Shape", "Size"})

#: Ops that read only the rows of their first input (a table) that their indices select: as
#: many bytes of it as they write, at most the whole table.
LOOKUP_OPS = frozenset({"Gather", "GatherElements", "GatherND"})


def data_bytes(op: OpInfo) -> int:
    """Bytes ``op`` moves through memory on the host: 0 for :data:`ALIASING_OPS` and for a
    ``Constant`` (onnxruntime folds it into an initializer when the session loads), the
    output bytes for :data:`METADATA_OPS` (a Shape of a [23, 1024] float tensor writes 2
    int64s: 16 bytes; an output shape inference left unknown counts one int64 per input dim
    for a Shape, one for a Size), for :data:`LOOKUP_OPS` the rows read (the output's bytes, at
    most the table's) besides the indices and the output (an embedding of 30,522 x 384
    float32 looked up for 32 tokens reads 49 kB, not the 47 MB table: it was priced as 4.7 ms
    of a 7.2 ms BERT), else every input and output (read and written once)."""
    if op.op_type in ALIASING_OPS or op.op_type == "Constant":
        return 0
    if op.op_type in METADATA_OPS:
        out = op.outputs[0] if op.outputs else None
        if out is not None and out.shape is not None and out.dtype is not None:
            return out.nbytes
        # output not inferred: a Size writes one int64, a Shape at most one per input dim
        rank = len(op.inputs[0].shape) if op.inputs and op.inputs[0].shape is not None else 1
        return 8 * (rank if op.op_type == "Shape" else 1)
    if op.op_type in LOOKUP_OPS and op.inputs and op.outputs:
        out = sum(t.nbytes for t in op.outputs)
        return min(op.inputs[0].nbytes, out) + sum(t.nbytes for t in op.inputs[1:]) + out
    return sum(t.nbytes for t in op.inputs + op.outputs)


class HostDevice(Device):
    """The host CPU (paradigm ``host``); supports every op."""

    name = "host"
    colour = "#7f7f7f"  # in the report's pictures
    paradigm = "host"
    option_prefix = "host"
    Options = HostOptions

    def __init__(self, params: HostParams = HostParams()):
        self.params = params

    def supports(self, op: OpInfo) -> Support:
        return Support(True, "the host runs every op")

    def cost(self, op: OpInfo, options: dict) -> Cost:
        """Roofline cost of ``op`` on the host: ``max(flops / FLOP/s, bytes / (bytes/s))``
        seconds, times the host power for joules (see :mod:`onnx_cinm.hostmodel`;
        ``options["host_roofline"]`` selects the figures). Bytes are what the op moves
        (:func:`data_bytes`): all inputs and outputs, except for ops that only read or change
        a tensor's metadata."""
        roof = (_HOSTMODEL or _hostmodel()).get((options or {}).get("host_roofline"))
        nbytes = data_bytes(op)
        # the figures depend on the roofline, the FLOPs and the bytes alone: ops of one size
        # share their (frozen) Cost (placement prices every node of a model, most sizes recur)
        key = (id(roof), op.flops, nbytes)
        hit = _COSTS.get(key)
        if hit is not None and hit[0] is roof:
            return hit[1]
        cost = Cost(latency_s=roof.latency_s(op.flops, nbytes),
                    energy_j=roof.energy_j(op.flops, nbytes), writes=0, bytes_moved=0)
        if len(_COSTS) >= 4096:
            _COSTS.clear()
        _COSTS[key] = (roof, cost)  # the roofline held: its id is not reused while cached
        return cost


#: :meth:`HostDevice.cost` by ``(id(roofline), FLOPs, bytes)``: ``(roofline, Cost)``.
_COSTS: dict = {}
#: :mod:`onnx_cinm.hostmodel` once :meth:`HostDevice.cost` first asked for it (it imports onnx,
#: so not at start-up; a function-level import costs an import-system call per op priced,
#: 741 of them placing light DenseNet121).
_HOSTMODEL = None


def _hostmodel():
    global _HOSTMODEL
    from .. import hostmodel

    _HOSTMODEL = hostmodel
    return hostmodel


register(HostDevice())
