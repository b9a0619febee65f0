"""The runtime side of an UPMEM node: its generated kernel run in the emulator.

:class:`UpmemKernel` runs the node's kernel (``host.c``/``dpu.c`` built by the emulator,
:mod:`onnx_cinm.sim.upmem_emu`) on the node's input arrays. The kernel folder is untrusted input,
so the C that is compiled is never the folder's as it stands: the kernel is generated again from
the model's plan (the node's ``cnm_*`` attributes and constant inputs) into the build cache
(``<cache>/gen/<content hash>``), the folder's files must equal the generated ones byte for byte
(else a one-line CinmError: edited or stale), and the generated copy is what gets built and run. A
kernel is specialised to the shapes it was generated for (symbolic dims were taken as 1); when the
inputs have other shapes (a dynamic batch), the node is emitted again for those shapes into the
build cache (``<cache>/respec/<hash>``) and that kernel runs; both the emission and the build are
cached by content.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ...errors import CinmError
from ...sim.upmem_emu import cache_dir, read_manifest, run_kernel


#: What an emulated kernel's ``bytes_moved`` counts, for the profile: not the cost model's
#: figure that ``report`` shows (constants resident in MRAM, a broadcast once per DPU).
BYTES_NOTE = ("the transfers its generated host program made in this run: constant operands "
              "pushed again each run, scatters padded, a broadcast counted once; report's "
              "bytes_moved is the cost model's (constants resident, a broadcast once per DPU)")


def _load_metrics(attrs: dict) -> dict | None:
    """The one-time load the plan charges before the first inference (``cnm_load_s`` seconds,
    ``cnm_load_j`` joules: the DPU program and the weights kept in MRAM), in the shape of a
    crossbar kernel's ``load_metrics``; None if the plan has none."""
    if attrs.get("cnm_load_s") is None:
        return None
    return {"tile_writes": 0, "latency_s": float(attrs["cnm_load_s"]),
            "energy_j": float(attrs.get("cnm_load_j") or 0.0)}


class UpmemKernel:
    """Run one UPMEM node's generated kernel in the emulator.

    Args:
        op: the node as an :class:`~onnx_cinm.graph.OpInfo`.
        attrs: the node's attributes (``kernel``, ``cnm_*``).
        root: the ``<model>.cinm/`` folder.
        consts: the node's constant inputs by tensor name.
        emit: the device's code generator, ``emit(op, attrs, consts, root) -> [paths]``
            (:meth:`UpmemDevice.emit <onnx_cinm.devices.upmem.UpmemDevice.emit>`).

    Calling it with the node's inputs (numpy arrays in node order, None for an absent optional
    input) returns ``(outputs, metrics)``: ``metrics`` has ``latency_s`` (the cnm_mapping cost
    model's ``cnm_latency_s`` when the node has it, else the emulator's kernel time),
    ``energy_j`` (``cnm_energy_j`` or None), ``bytes_moved`` (host<->DPU bytes of this run,
    :data:`BYTES_NOTE`) and ``bytes_note``,
    ``emu_kernel_s`` and ``emu_kernel_cycles`` (the emulator's own model), ``dma_bytes``.

    Raises:
        CinmError: a file of the kernel folder differs from the generated code, or is missing.
    """

    def __init__(self, op, attrs: dict, root, consts: dict | None, emit):
        self.op = op
        self.attrs = dict(attrs)
        self.root = Path(root)
        self.rel = self._s(attrs["kernel"])
        self.consts = consts or {}
        self.emit = emit
        self.kdir = self._regenerate()
        self.manifest = read_manifest(self.kdir)
        #: the one-time load (DPU program, resident weights) the plan charges, or None
        self.load_metrics = _load_metrics(self.attrs)

    def _regenerate(self) -> Path:
        """Generate the kernel from the plan into the build cache, check the folder's files
        equal it, and return the generated directory (content-addressed)."""
        gen_root = cache_dir() / "gen"
        gen_root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".gen-", dir=gen_root))
        try:
            paths = self.emit(self.op, self.attrs, self.consts, tmp)
            gdir = tmp / self.rel
            h = hashlib.sha256()
            for p in sorted(Path(p) for p in paths):
                rel = p.relative_to(gdir).as_posix()
                data = p.read_bytes()
                theirs = self.root / self.rel / rel
                try:
                    same = theirs.read_bytes() == data
                except OSError:
                    same = False
                if not same:
                    raise CinmError(
                        f"kernel file '{theirs}' of node '{self.op.name}' is not the code "
                        "onnx-cinm generates from the model's plan (edited, or written by "
                        "another version); emulate mode compiles only generated code: re-run "
                        "onnx-cinm optimize")
                h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
            final = gen_root / h.hexdigest()[:32]
            if not final.is_dir():
                try:
                    os.rename(gdir, final)
                except OSError:
                    if not final.is_dir():  # not a lost race with another process
                        raise
            return final
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _s(v):
        return v.decode() if isinstance(v, bytes) else v

    def _kernel_dir(self, arrays: list) -> Path:
        """The kernel directory for these input shapes (the emitted one, or a re-emission)."""
        specs = self.manifest.get("inputs", [])
        if all(s.get("const") or tuple(s["shape"]) == a.shape for s, a in zip(specs, arrays)):
            return self.kdir
        ins = list(self.op.inputs)
        for i, a in enumerate(arrays):
            ins[i] = dataclasses.replace(ins[i], shape=tuple(a.shape))
        op = dataclasses.replace(self.op, inputs=tuple(ins))
        key = hashlib.sha256(json.dumps([str(self.kdir.resolve()), [list(a.shape) for a in arrays],
                                         self.manifest.get("kind")]).encode()).hexdigest()[:24]
        root = cache_dir() / "respec" / key
        attrs = dict(self.attrs, kernel="k")
        attrs.pop("cnm_lanes", None)  # made for the planned rows: the emitter chooses again
        if not (root / "k" / "kernel.json").is_file():
            try:
                self.emit(op, attrs, self.consts, root)
            except ValueError:
                # the plan's DPU grid was made for the planned shapes (a dim shape inference
                # could not size was taken as 1): lay these shapes out on the emitter's default
                attrs.pop("cnm_grid", None)
                try:
                    self.emit(op, attrs, self.consts, root)
                except ValueError as e:
                    raise CinmError(
                        f"node '{self.op.name}': no DPU kernel for input shapes "
                        f"{[list(a.shape) for a in arrays]} (planned for "
                        f"{[list(s['shape']) for s in specs]}): {e}; optimize with --dim for "
                        "these sizes, or run with upmem_mode=model") from None
        return root / "k"

    def __call__(self, inputs: list) -> tuple[list, dict]:
        arrays = [np.asarray(x) for x in inputs if x is not None]
        kdir = self._kernel_dir(arrays)
        specs = read_manifest(kdir).get("inputs", [])
        runtime = [a for s, a in zip(specs, arrays) if not s.get("const")]
        outs, c = run_kernel(kdir, runtime)
        lat = self.attrs.get("cnm_latency_s")
        metrics = {
            "latency_s": float(lat) if lat is not None else c.get("kernel_s"),
            "energy_j": self.attrs.get("cnm_energy_j"),
            "bytes_moved": c.get("h2d_bytes", 0) + c.get("d2h_bytes", 0) + c.get("broadcast_bytes", 0),
            "bytes_note": BYTES_NOTE,
            "basis": "plan",  # latency and energy: the plan's, at the planned sizes
            "emu_kernel_s": c.get("kernel_s"),
            "emu_kernel_cycles": c.get("kernel_cycles"),
            "dma_bytes": c.get("totals", {}).get("dma_read_bytes", 0)
            + c.get("totals", {}).get("dma_write_bytes", 0),
            "wall_s": c.get("wall_s"),
        }
        return outs, metrics
