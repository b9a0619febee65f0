"""The paradigm and device passes: they write each device's plan onto its nodes, in two levels.

- Paradigm level: ``cim_tiling`` (crossbar tiles, loop order, residency) and ``cnm_mapping``
  (in :mod:`.cnm_mapping`: workgroup, distribution, memory, merge) store, for every cinm node
  whose ``device`` belongs to the paradigm, the paradigm's part of the device's plan,
  :meth:`Device.lower_paradigm` (``--stop-after paradigm`` writes the model here);
- Device level: ``device_lowering`` stores every device's whole plan, :meth:`Device.lower`:
  the paradigm attributes again plus the device's modeled cost, run mode and ``kernel`` path
  (``--stop-after device``).

All work the same way: ask each device (through the registry, never by import) for the plans
of all its nodes at once and store each plan as node attributes (the device's declared
``plan_attrs`` and ``kernel``). The plan is attributes, never one ONNX node per tile or per
DPU. The device decides the schedule with its paradigm's code (:mod:`onnx_cinm.paradigms`);
the passes only walk the graph and record statistics.
"""
from __future__ import annotations

import re
from collections import Counter

import onnx
from onnx import helper

from .. import devices
from ..analysis import op_info
from ..dialects import cinm
from ..errors import CinmError
from . import PassContext, register_pass

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def kernel_stem(node_name: str, index: int) -> str:
    """A file-system-safe, unique stem for the kernel of the ``index``-th node (``0007_conv1``)."""
    clean = _UNSAFE.sub("_", node_name).strip("._")[:60]
    return f"{index:04d}_{clean}" if clean else f"{index:04d}"


def _set(node: onnx.NodeProto, attrs: dict, dev) -> None:
    for k in attrs:
        if k not in dev.plan_attrs and k not in cinm.PLACEMENT_ATTRS:
            raise CinmError(f"device '{dev.name}' wrote plan attribute '{k}', which it does not "
                            "declare in its plan_attrs")
    keep = [a for a in node.attribute[:] if a.name not in attrs]
    del node.attribute[:]
    node.attribute.extend(keep)
    for k, v in attrs.items():
        _add_attribute(node, k, v)


_A = onnx.AttributeProto


def _add_attribute(node: onnx.NodeProto, name: str, value) -> None:
    """Append the attribute ``helper.make_attribute(name, value)`` to ``node``, built in place
    for the plain ``int``, ``float``, ``str`` and list-of-``int`` values plans are made of (the
    same proto; ``make_attribute``'s type dispatch took most of a lowering pass's time: 5,500
    attributes on DenseNet121 over the three passes), and for lists of ``float`` (a crossbar
    kernel's cost parts) or of ``str`` (UPMEM's ``cnm_inputs``), through ``make_attribute``
    otherwise."""
    kind = type(value)
    if kind is int:
        node.attribute.add(name=name, type=_A.INT, i=value)
    elif kind is float:
        node.attribute.add(name=name, type=_A.FLOAT, f=value)
    elif kind is str:
        node.attribute.add(name=name, type=_A.STRING, s=value.encode())
    elif kind is list and value and all(type(x) is int for x in value):
        node.attribute.add(name=name, type=_A.INTS, ints=value)
    elif kind is list and value and all(type(x) is float for x in value):
        node.attribute.add(name=name, type=_A.FLOATS, floats=value)
    elif kind is list and value and all(type(x) is str for x in value):
        node.attribute.add(name=name, type=_A.STRINGS, strings=[x.encode() for x in value])
    else:
        node.attribute.append(helper.make_attribute(name, value))


def lower_paradigm(model: onnx.ModelProto, ctx: PassContext, paradigm: str) -> tuple:
    """Write the paradigm-level plan of every cinm node placed on a device of ``paradigm`` (in
    place): :meth:`Device.lower_paradigm`. Returns and raises as :func:`lower_devices`."""
    return _lower(model, ctx, paradigm)


def lower_devices(model: onnx.ModelProto, ctx: PassContext) -> tuple:
    """Lower every cinm node placed on a device (in place).

    Each device's :meth:`Device.lower` gets all its nodes at once, in graph order, as
    ``[(OpInfo, options)]`` (``ctx.options`` plus ``"kernel_stem"``, a unique, file-safe stem
    for the node's kernel; resources such as crossbars are shared by the whole model). Returns
    ``(model, stats)`` with ``stats = {"nodes": Counter by device, "plans": [(node name, op
    type, device, plan attrs)]}``. Kernel stems start with ``ctx.scope`` (a body's path).

    Raises:
        CinmError: a node is placed on a device that does not support it (a ``device``
            attribute the placement pass did not write), a device returns an attribute it
            does not declare, or rejects the options.
    """
    return _lower(model, ctx, None)


def _lower(model: onnx.ModelProto, ctx: PassContext, paradigm: str | None) -> tuple:
    """Paradigm-level plans of the devices of ``paradigm``, or (None) the whole plans of every
    device but the host's."""
    infos = None
    stats = {"nodes": Counter(), "plans": []}
    by_device: dict[str, list] = {}
    for index, node in enumerate(model.graph.node):
        if node.domain != cinm.DOMAIN:
            continue
        dev_name = cinm.device_of(node)
        if dev_name is None:
            continue
        dev = devices.get_device(dev_name)
        if dev.paradigm != paradigm and (paradigm is not None or dev.paradigm == "host"):
            continue
        if infos is None:
            infos = ctx.tensor_infos(model)
        opts = dict(ctx.options,
                    kernel_stem=ctx.scope + kernel_stem(node.name or node.op_type, index))
        info = op_info(node, infos)
        # a device attribute placement did not write (--skip-pass placement): check it
        ok = dev.supports_under(info, ctx.options) if "placement" not in ctx.stats else True
        if not ok:
            raise CinmError(f"node '{node.name or node.op_type}' ({node.op_type}) is placed on "
                            f"{dev_name}, which cannot run it: {ok.reason} (let the placement "
                            "pass choose, or fix its 'device' attribute)")
        by_device.setdefault(dev_name, []).append((node, info, opts))
    for dev_name, items in by_device.items():
        dev = devices.get_device(dev_name)
        lower = dev.lower if paradigm is None else dev.lower_paradigm
        plans = lower([(op, opts) for _, op, opts in items])
        if len(plans) != len(items):
            raise CinmError(f"device '{dev_name}' returned {len(plans)} plans for {len(items)} nodes")
        for (node, _, _), plan in zip(items, plans):
            _set(node, plan, dev)
            stats["nodes"][dev_name] += 1
            stats["plans"].append((node.name, node.op_type, dev_name, plan))
    return model, stats


@register_pass("cim_tiling", keeps_shapes=True)
def cim_tiling(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Tile crossbar matrix products and schedule their tile writes (cim paradigm level).

    Options read (besides the device's own): ``cim_loop_order`` (``weight_stationary`` or
    ``naive``), ``cim_crossbars`` (P), ``cim_rows``/``cim_cols``, ``cim_preset``.
    """
    model, stats = lower_paradigm(model, ctx, "cim")
    ctx.stats["cim_tiling"] = stats
    return model


@register_pass("device_lowering", keeps_shapes=True)
def device_lowering(model: onnx.ModelProto, ctx: PassContext) -> onnx.ModelProto:
    """Write each device's whole plan: cost, run mode and kernel path (device level).

    Every node placed on a device gets :meth:`Device.lower`'s attributes (the paradigm's again,
    plus the device's); ``optimize`` then emits the kernels named by ``kernel``.
    """
    model, stats = lower_devices(model, ctx)
    ctx.stats["device_lowering"] = stats
    return model
