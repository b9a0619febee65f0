"""The runtime side of a crossbar node: its ``.xbar`` file run by the simulator.

The execution provider calls a :class:`CrossbarKernel` with the node's input arrays; the kernel
lays the streamed operand out as ``X[G, rows, K]`` (:mod:`onnx_cinm.paradigms.cim.layout`),
runs one inference of the command file in :class:`~onnx_cinm.sim.crossbar.CrossbarSimulator`
(which never sees the ONNX node) and lays the result back out. When the programmed operand is a
constant, one simulator
lives as long as the kernel, so tiles programmed at load stay resident across runs, as on the
chip; when it is an activation, every run programs it afresh, and a run whose activation has
another shape than the one the file was planned for runs a program planned again at that shape
(:meth:`CrossbarKernel.program_for`).
"""
from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import numpy as np

from ...paradigms.cim import layout
from ...sim import blas
from ...sim.crossbar import CrossbarSimulator, XbarError, load_file, parse


#: The most programs planned again that one kernel keeps (:meth:`CrossbarKernel.program_for`;
#: planning one took about 3 ms for a 12-head attention product of MiniLM on this project's
#: machine): a length that follows the data may take hundreds of sizes.
_PROGRAMS_MAX = 256
#: The most input shapes whose fresh run a kernel over an activation remembers (``_fresh``).
_FRESH_MAX = 1024


#: Why a crossbar's ADC conversions saturate (the runtime shows it next to the count,
#: ``clipped_note`` in a kernel's metrics): the sim's effect 6 (sim/crossbar/mode.py)
CLIPPED_NOTE = ("with the full-scale rule only device effects push a column past it; with the "
                "run option cim_adc_calibration=data, inputs beyond the first inference's "
                "currents do")


class CrossbarKernel:
    """Run one cinm Gemm/Gemv node through its ``.xbar`` kernel.

    Args:
        op: the node as an :class:`~onnx_cinm.graph.OpInfo` (input names and shapes).
        attrs: the node's ``cim_*`` plan attributes.
        path: the ``.xbar`` file (``.npy`` sidecars, if it names any, beside it).
        consts: constant inputs by name: the programmed weights and bias when the file names
            them as the model's tensors (``model:<name>``, the form ``emit`` writes), and a bias
            the file does not add.
        mode: a :class:`~onnx_cinm.sim.crossbar.mode.CrossbarMode` to run instead of the
            file's header (None: the file's).
        shared: a dict kept by the caller for all its kernels (None: none): the simulator's
            arrays of a constant (float32, or float64 for an integer kernel), kept there by
            the constant array, its dtype and view, so kernels over the same weights (the
            steps of an unrolled recurrence, ``cim_tile_kernel``) hold one copy of them, and
            the simulator's checks of an integer kernel's weights run once per array.
        base: the memristor device's :class:`~onnx_cinm.devices.memristor.presets.CrossbarParams`
            (None: the default preset), from which the node's recorded plan options select
            the chip when a programmed activation is planned again at a run's shape.

    A Gemm with ``y_perm`` (its result is ``Transpose(A @ B (+ C), y_perm)``) is written in that
    layout: the simulator's output buffer is laid out (``[G, rows, N]`` or ``[G, N, rows]``,
    :meth:`CrossbarSimulator.run`'s ``transposed``) so that the permuted result is a
    C-contiguous array when one of the two makes it so -- a Conv's ``[1, *O, M]`` product read
    as NCHW ``[1, M, *O]`` is ``Y^T = W^T X^T`` -- and permuted by one numpy copy otherwise
    (e.g. a batch above 1). The same choice, without ``y_perm``, writes a programmed ``A``'s
    result (``Y^T``) in place.

    Calling it with the node's inputs (numpy arrays, in node order) returns ``(outputs, metrics)``:
    ``outputs`` a list with the float32 result (int32 for an integer kernel, ``dtype int32``), ``metrics`` the simulator's counters of this
    inference (tile writes, MVMs, ADC conversions, latency in seconds, energy in joules) plus
    ``bytes_moved`` (inputs in once per column tile, partial sums out once per row tile, cells
    written, at 4 bytes each: the plan's count at this run's rows), and ``replanned`` (``(the
    planned [G, K, N], this run's [G, K, N])`` of the programmed operand) when the run used a
    program planned again (:meth:`program_for`). Thread safe: calls are serialized (one chip).

    A programmed operand that is an activation may have another shape at every run (a sequence
    length, a batch): a run at the planned shape runs the file; at another, the program
    :meth:`program_for` plans for that shape, from the same preset and plan options the
    node records, as ``optimize`` would have written it at that size. Its tiles are laid over
    the crossbars the plan may use as the planner lays any product's (more tiles than
    crossbars: written in rounds), so every size runs; its counters (tile and cell writes,
    MVMs, latency, energy) are the re-planned program's. A constant programmed operand keeps
    its file: its shape cannot change.

    Raises:
        XbarError: the file is missing or malformed, or an input does not fit it.
    """

    def __init__(self, op, attrs: dict, path, consts: dict, mode=None,
                 shared: dict | None = None, base=None) -> None:
        self.op = op
        self.operand = attrs["cim_operand"]
        self.attrs = attrs
        self.base = base
        self.run_mode = mode
        self.prog = load_file(path)
        if mode is not None:  # a run's own data path (run options) instead of the file's
            self.prog = replace(self.prog, mode=mode)
        names = [t.name for t in op.inputs]
        self.names = names
        self.bias_name = names[2] if len(names) > 2 else None
        perm = attrs.get("y_perm")
        self.y_perm = None if perm is None else tuple(int(p) for p in perm)
        self.bias_in_file = any(r.kind == "bias" for r in self.prog.regions.values())
        prog_name = names[0] if self.operand == "A" else names[1]
        owner = attrs.get("cim_tile_kernel")
        self.integer = self.prog.header.get("dtype") == "int32"  # exact integer kernel
        self._bias_src = None  # (region name, the model's bias array, dtype): _model_constants
        constants = self._model_constants(prog_name, consts, shared)
        self.programmed_const = prog_name in consts or Path(path).with_suffix(".W.npy").exists()
        self._sim = (CrossbarSimulator(self.prog, constants, resident=True, checked=shared)
                     if self.programmed_const else None)
        # the constants of a program written at every run (its bias), and its programs by the
        # shape of the programmed operand: the file's at the planned one, program_for's else
        self._fresh_consts = {} if self._sim else constants
        self._consts_at: dict = {}  # W shape -> the constants of a program planned again
        if self._sim is None and "W" not in self.prog.regions:
            raise XbarError(f"{self.prog.path}: declares no weight region W for the operand "
                            "programmed at every run")
        self._programs = {} if self._sim else {tuple(self.prog.regions["W"].dims): self.prog}
        self._checked = shared  # the integer checks already run, for _affine's probe
        cells = self.prog.header["int_cells"] if self.integer else self.prog.mode
        self.prog_mode_cells = cells.cells_per_weight if cells else 1
        # on the tiles of an earlier kernel over the same weights: that kernel's load programs
        # them (this simulator's copy of them stands for the same crossbars)
        self.load_metrics = self._sim.load_counters.as_dict() if self._sim and not owner else None
        self._lock = threading.Lock()
        self._views: dict = {}
        self._patch_plans: dict = {}  # input shape -> _patch_plan
        self._residual_convs: dict = {}  # (input shape, activation) -> _residual_conv
        self._int_plans: dict = {}  # input shapes -> _int_plan
        # (W, X shapes, transposed) -> what _run_fresh computes; ("int", A, B shapes) -> the
        # fresh simulator and counters of _int_product's runs of an activation-programmed node
        self._fresh: dict = {}
        self._probed = None  # _affine's probe: its form, False (none) or None (not run)
        self._int_conv_bias = None  # an integer program's bias in the convolution's layout

    def _model_constants(self, prog_name: str, consts: dict, shared: dict | None) -> dict:
        """The arrays of the file's regions that name a tensor of the model (``model:<name>``,
        ``docs/xbar-format.md``): the weight ``W[G, K, N]`` from the programmed operand (``B``
        as it is, ``A`` transposed; :func:`~onnx_cinm.paradigms.cim.layout.weights`), a bias
        as ``[G, 1, N]``. The region must name the node's own constant input in its role
        (XbarError otherwise: the folder is untrusted input). An array already in ``shared``
        for the same constant array, dtype, role and view is taken from there."""
        want = {"weight": prog_name, "bias": self.bias_name}
        out = {}
        for r in self.prog.regions.values():
            if r.tensor is None or (r.kind == "weight" and r.tensor == prog_name
                                    and prog_name not in consts):
                continue  # a sidecar, or a programmed activation (given at every run)
            if r.tensor != want.get(r.kind) or r.tensor not in consts:
                role = "programmed operand" if r.kind == "weight" else "bias"
                raise XbarError(f"{self.prog.path}:{r.line}: {r.name} names tensor "
                                f"{r.tensor!r}, not the node's constant {role} "
                                f"{want.get(r.kind)!r}")
            v = layout.op_view(self.op, self.operand)
            src = consts[r.tensor]
            # integer kernels exactly (an int32 bias does not fit float32's mantissa)
            dt = np.float64 if self.integer else np.float32
            if r.kind == "bias":  # laid out again for a product planned again at another N
                self._bias_src = (r.name, src, dt)
            key = ("crossbar", r.kind, id(src), np.dtype(dt).str, v)  # v: frozen, all shapes
            got = shared.get(key) if shared is not None else None
            if got is None or got[0] is not src:
                arr = np.asarray(src, dtype=dt)
                if r.kind == "weight":
                    A, B = (arr, None) if self.operand == "A" else (None, arr)
                    arr = layout.weights(v, A, B)
                else:
                    arr = layout.bias_array(v, arr)
                got = (src, arr)  # the source held: its id is not reused while the entry lives
                if shared is not None:
                    shared[key] = got
            out[r.name] = got[1]
        return out

    def __call__(self, inputs: list) -> tuple[list, dict]:
        if self.integer:
            got = self._int_product(inputs)
            if got is not None:
                return got
        dt = np.float64 if self.integer else np.float32  # integers: exact in float64
        A = np.asarray(inputs[0], dtype=dt)
        B = np.asarray(inputs[1], dtype=dt)
        got = self._views.get((A.shape, B.shape))
        if got is None:  # one view and output layout per input shapes, not one per run
            got = self._views[(A.shape, B.shape)] = self._layout(A.shape, B.shape)
        v, transposed, shape, axes = got
        X = layout.stream_rows(v, A, B)
        with self._lock:
            if self._sim is None:
                W = layout.weights(v, A, B)
                prog = self.program_for(W.shape, A.shape, B.shape)
                outs, c = self._run_fresh(W, X, transposed, prog)
                if prog is not self.prog:
                    c["replanned"] = self._replanned(W.shape)
            else:
                outs, c = self._sim.run({"X": X}, transposed=transposed)
                c = c.as_dict()
        Y = outs["Y"].reshape(shape).transpose(axes)  # unstreamed, y_perm applied if no bias
        if self.bias_name and not self.bias_in_file:
            Y = Y + np.asarray(inputs[2], dtype=Y.dtype)
            if self.y_perm is not None:
                Y = Y.transpose(self.y_perm)
        return [np.ascontiguousarray(Y, dtype=np.int32 if self.integer else np.float32)], \
            self._metrics(c, X, outs["Y"])

    def program_for(self, w_shape: tuple, a_shape: tuple, b_shape: tuple):
        """The program (:class:`~onnx_cinm.sim.crossbar.XbarProgram`) that writes a programmed
        activation of shape ``w_shape`` (``[G, K, N]``, :func:`~onnx_cinm.paradigms.cim.layout.
        weights`) given node inputs of shapes ``a_shape`` and ``b_shape``: the file's at the
        planned shape; at another, the plan of that product under the node's recorded plan
        options (:func:`onnx_cinm.devices.memristor.plan_recorded`: preset, array size,
        crossbar count, loop order, shared crossbars) rendered as ``optimize`` writes a kernel
        (:mod:`.codegen`; its compiled data path, or an integer kernel's cell mapping for an
        operand programmed at run time) and parsed, in the run's data path when run options
        gave one. Planned once per shape (at most :data:`_PROGRAMS_MAX` planned again are
        kept, the oldest dropped first). Call under the lock.

        Raises:
            XbarError: the node's plan attributes are missing or the planner refuses the sizes.
        """
        w_shape = tuple(w_shape)
        prog = self._programs.get(w_shape)
        if prog is not None:
            return prog
        from . import _mode, int_cells, plan_recorded
        from .codegen import fill, model_source, render_parts
        from .presets import DEFAULT

        try:
            v = layout.view(self.op.op_type, self.operand, a_shape, b_shape)
            p, params = plan_recorded(v, self.attrs, DEFAULT if self.base is None else self.base)
        except (KeyError, ValueError) as e:
            raise XbarError(f"node '{self.op.name}': cannot plan its programmed activation at "
                            f"{list(w_shape)} (planned at {list(self._planned_dims())}): "
                            f"{e}") from None
        mode = {"int_cells": int_cells(None, params)} if self.integer else _mode(self.attrs, params)
        bias = self.prog.regions.get("C")
        text = fill(render_parts(p, params, bias is not None, **mode), Path(self.prog.path).stem,
                    model_source(self.names[0] if self.operand == "A" else self.names[1]),
                    None if bias is None else model_source(bias.tensor) if bias.tensor else bias.file)
        prog = parse(text, f"{self.prog.path} (planned again at {list(w_shape)})")
        if bias is not None and self._bias_src is not None:  # a broadcast bias at this N
            name, src, dt = self._bias_src
            self._consts_at[w_shape] = {**self._fresh_consts,
                                        name: layout.bias_array(v, np.asarray(src, dtype=dt))}
        if self.run_mode is not None:
            prog = replace(prog, mode=self.run_mode)
        if len(self._programs) > _PROGRAMS_MAX:  # sizes that follow the data: the oldest goes
            old = next(s for s, p in self._programs.items() if p is not self.prog)
            del self._programs[old]
            self._consts_at.pop(old, None)
        self._programs[w_shape] = prog
        return prog

    def _planned_dims(self) -> tuple:
        return tuple(self.prog.regions["W"].dims)

    def _replanned(self, w_shape: tuple) -> tuple:
        """The ``replanned`` metric: ``(planned [G, K, N], this run's)`` as tuples."""
        return self._planned_dims(), tuple(int(d) for d in w_shape)

    def _run_fresh(self, W, X, transposed: bool, prog=None) -> tuple[dict, dict]:
        """One inference of a program whose operand ``W`` is an activation, written at every
        run: a fresh simulator of ``prog`` (None: the file's; :meth:`program_for`) loads it
        and runs ``X`` (``(outputs, load and run counters)``).
        A fresh simulator starts from the same state every run, so once one has run inputs of
        these shapes through a data path that is one product per group plus a bias
        (:meth:`CrossbarSimulator.affine`), later runs compute those products and that bias
        addition directly (the same calls on the same operands, :meth:`CrossbarSimulator.run`
        ``"Ideal"``) and take its counters: building and walking the program cost 0.3 ms per
        run of a 57-crossbar attention product of a 4-token head, the product 10 us."""
        key = (W.shape, X.shape, transposed)
        known = self._fresh.get(key)
        if known is not None and W.dtype == np.float32 and X.dtype == np.float32:
            counts, (w, b, out), bias = known
            G, M, N = W.shape[0], X.shape[1], W.shape[2]
            Y = np.empty((G, N, M), np.float32).transpose(0, 2, 1) if transposed else \
                np.empty((G, M, N), np.float32)
            kern = blas.current()
            with np.errstate(invalid="ignore", over="ignore"):
                for g in range(G):
                    kern.matmul(X[g][:, :W.shape[1]], W[g], Y[g])
                if bias is not None:
                    Y += bias
            return {out: Y}, dict(counts)
        prog = self.prog if prog is None else prog
        sim = CrossbarSimulator(prog, {**self._consts_at.get(tuple(W.shape), self._fresh_consts),
                                       "W": W})
        outs, c = sim.run({"X": X}, transposed=transposed)
        c = _add(sim.load_counters.as_dict(), c.as_dict())
        form = sim.affine()
        if form is not None and not self.integer and prog.header["order"] != "serpentine" \
                and form[1] == "W" and len(outs) == 1:
            _, w, b, out = form
            self._remember(key, (dict(c), (w, b, out), None if b is None else sim.const[b]))
        return outs, c

    def _remember(self, key, value) -> None:
        """Keep ``value`` in :attr:`_fresh` under ``key``, dropping the oldest entry beyond
        :data:`_FRESH_MAX` (input shapes that follow the data: an integer entry holds a
        simulator)."""
        if len(self._fresh) >= _FRESH_MAX:
            del self._fresh[next(iter(self._fresh))]
        self._fresh[key] = value

    def _int_product(self, inputs: list):
        """An integer kernel whose data path is a plain product (:meth:`_affine`), computed by
        the session's integer product kernel (:meth:`onnx_cinm.sim.blas.MatrixKernels.int_matmul`:
        the same integers, wrapped to int32, as the simulator's float64 products) while the
        simulator counts the inference without its data path: the kernel's own simulator for
        weights programmed for the session, else a fresh one over a zero-stride stand-in of
        the operand programmed at this run (its programming counted, as in a run with data).
        ``(outputs, metrics)`` as :meth:`__call__` returns them, or None (the simulator's own
        data path then runs, and says what is wrong with the inputs): under
        ``matmul="numpy"``, for operands that are not of an integer dtype, a streamed one
        reaching 2**16, programmed values beyond the file's ``weight_bits`` or of another
        shape than the kernel can plan (:meth:`program_for`), or a program that is not a plain
        product."""
        kern = blas.current()
        if kern.mode == "numpy":
            return None
        A, B = np.asarray(inputs[0]), np.asarray(inputs[1])
        streamed, programmed = (B, A) if self.operand == "A" else (A, B)
        if streamed.dtype.kind not in "iu" or \
                (self._sim is None and programmed.dtype.kind not in "iu"):
            return None
        plan = self._int_plans.get((A.shape, B.shape))
        if plan is None:
            plan = self._int_plans[(A.shape, B.shape)] = self._int_plan(A.shape, B.shape)
        if plan is False:
            return None
        v, shape, axes, (inp, w, b, out), stand_in = plan
        lo, hi = (int(streamed.min()), int(streamed.max())) if streamed.size else (0, 0)
        if lo <= -2**16 or hi >= 2**16:
            return None
        X = layout.stream_rows(v, A, B)
        prog = self.prog
        if self._sim is None:
            W = layout.weights(v, A, B)
            levels = self.prog.header["int_cells"].weight_levels
            if W.size and max(-int(W.min()), int(W.max())) > levels:
                return None
        with self._lock:
            if self._sim is None:
                try:
                    prog = self.program_for(W.shape, A.shape, B.shape)
                except XbarError:
                    return None  # the simulator's own path raises it
            fresh = self._fresh.get(("int", A.shape, B.shape)) if self._sim is None else None
            if fresh is not None:  # counted before: a fresh simulator counts the same again
                sim, c = fresh
            elif self._sim is None:
                sim = CrossbarSimulator(prog, {**self._consts_at.get(tuple(W.shape),
                                                                     self._fresh_consts),
                                               w: np.broadcast_to(np.float64(0), W.shape)})
            else:
                sim, W = self._sim, self._sim.const[w]
            Yt = np.empty((v.G, v.rows, v.N), np.int32)
            for g in range(v.G):
                kern.int_matmul(X[g], W[g], Yt[g], const=self._sim is not None,
                                x_range=(lo, hi))
            if b is not None:
                np.add(Yt, self._int_bias(b, sim), out=Yt)  # wraps, as the simulator's int32 does
            if fresh is None:
                _, c = sim.run({inp: stand_in}, data=False)
                c = c.as_dict() if self._sim is not None else \
                    _add(sim.load_counters.as_dict(), c.as_dict())
                if self._sim is None:
                    # a fresh simulator starts from the same state at every run and counts a
                    # run without its data path from the shapes alone (the zero stand-ins):
                    # its counters are those of the first run of these shapes
                    self._remember(("int", A.shape, B.shape), (sim, dict(c)))
            c = dict(c)
            if prog is not self.prog:
                c["replanned"] = self._replanned(W.shape)
        Y = Yt.reshape(shape).transpose(axes)
        if self.bias_name and not self.bias_in_file:
            Y = Y + np.asarray(inputs[2], dtype=np.int32)
            if self.y_perm is not None:
                Y = Y.transpose(self.y_perm)
        return [np.ascontiguousarray(Y)], self._metrics(c, X, Yt)

    def _int_plan(self, a_shape: tuple, b_shape: tuple):
        """What :meth:`_int_product` does with inputs of these shapes: ``(view, reshape, axes,
        the program's affine form, the streamed operand's zero-stride stand-in)``, or False
        when the program is not a plain product."""
        form = self._affine()
        if form is None:
            return False
        v, _, shape, axes = self._layout(a_shape, b_shape)
        return v, shape, axes, form, np.broadcast_to(np.float64(0), (v.G, v.rows, v.K))

    def _int_bias(self, name: str, sim) -> np.ndarray:
        """The integer program's bias region ``name`` (of simulator ``sim``) as int32
        (wrapped, as the simulator wraps its sums)."""
        key = ("int bias", name)
        got = self._views.get(key)
        if got is None:
            got = self._views[key] = sim.const[name].astype(np.int64).astype(np.int32)
        return got

    def _metrics(self, c: dict, X, Yt) -> dict:
        """The simulator's counters ``c`` of one inference on ``X`` giving ``Yt`` (both as the
        simulator sees them, ``[G, rows, K]`` and ``[G, rows, N]``), with ``bytes_moved`` and
        ``basis`` added, and :data:`CLIPPED_NOTE` when an ADC conversion saturated."""
        # weights written, in elements (a quantized mode programs several cells per weight)
        weights = c["cell_writes"] // self.prog_mode_cells
        # as the plan counts them (paradigms.cim.schedule, "bytes moved"; report's
        # bytes_moved): each input row to each column tile, each partial sum out of each row
        # tile, at this run's rows
        h = self.prog.header
        k_tiles = -(-X.shape[-1] // h["rows"])
        n_tiles = -(-Yt.shape[-1] // h["cols"])
        c["bytes_moved"] = 4 * (X.size * n_tiles + Yt.size * k_tiles + weights)
        c["basis"] = "run"  # the simulator's counters of these inputs (Device.kernel)
        if c.get("adc_clipped"):
            c["clipped_note"] = CLIPPED_NOTE
        return c

    def _layout(self, a_shape: tuple, b_shape: tuple) -> tuple:
        """``(view, transposed, shape, axes)`` for inputs of these shapes: the
        :class:`~onnx_cinm.paradigms.cim.layout.ProductView`, the simulator's output layout
        (:meth:`_transposed`), and the one reshape and transpose that turn its ``[G, rows, N]``
        result into the node's (``y_perm`` composed in when no bias is added here)."""
        v = layout.view(self.op.op_type, self.operand, a_shape, b_shape)
        shape, axes = layout.unstream_plan(v)
        if self.y_perm is not None and not (self.bias_name and not self.bias_in_file):
            axes = tuple(axes[i] for i in self.y_perm)
        return v, self._transposed(v), shape, axes

    def _transposed(self, v) -> bool:
        """Whether the simulator should write its ``[G, rows, N]`` result as the view of a
        C-contiguous ``[G, N, rows]`` array: when that, and not the plain layout, makes the
        node's result (unstreamed, bias added, ``y_perm`` applied) contiguous, so it is never
        copied. Decided on the layouts alone (an unwritten uint8 buffer of the result's
        shape)."""
        if v.op_type != "Gemm":
            return False
        rows = v.rows
        for transposed in (False, True):
            buf = np.empty((v.G, v.N, rows) if transposed else (v.G, rows, v.N), np.uint8)
            Y = layout.unstream(v, buf.transpose(0, 2, 1) if transposed else buf)
            if self.bias_name and not self.bias_in_file:
                Y = Y + np.zeros((), np.uint8)  # a new array, in the layout numpy gives it
            if self.y_perm is not None:
                Y = Y.transpose(self.y_perm)
            if Y.flags.c_contiguous:
                return transposed
        return False

    def patch_runner(self, geometry: tuple, activation: str | None = None, groups: int = 1):
        """A callable computing this node from the input ``x`` of the Im2Col that makes its
        first input, so the patches are never materialized: ``f(x, out=None) -> (outputs,
        metrics)`` as a call with the patches returns (``out``: a C-contiguous float32 array
        of the output's shape the result is written into when the convolution lays it out as
        the node's output, else ignored; ``residual``: a float32 array of the output's shape
        added to it inside the convolution, then ``residual_activation`` (None or ``"Relu"``)
        applied, a residual connection's Add and Relu: the outputs are then theirs; only for
        a float kernel with no ``activation`` of its own, whose convolution's layout is the
        node's output's), or None when it does not apply to this call (the
        caller then runs the Im2Col and this kernel as usual). None instead of a callable when
        it never applies: only a Gemm with its weights ``B`` programmed for the session, in
        ideal mode, with no bias added outside its file. An integer kernel (``dtype int32``)
        convolves its integer input by :meth:`onnx_cinm.sim.blas.MatrixKernels.int_conv`
        (exactly the simulator's integers) and takes no activation; it may take the patches
        split into ``groups`` > 1 (``[n, G, *O, C/G*k]``, batch ``n`` 1, its weights ``[G, 1,
        C/G*k, N/G]``: a grouped convolution's), which a float kernel does not.

        ``geometry``: the Im2Col's ``(kernel_shape, strides, pads, dilations)``;
        ``activation``: None, or ``"Relu"`` applied to the result (the convolution's output
        is then the Relu's, :meth:`onnx_cinm.sim.blas.MatrixKernels.conv`). The callable
        computes only when the simulator reports its data path as exactly ``Y = X @ W (+
        bias)`` over one group (:meth:`CrossbarSimulator.affine`, :meth:`_affine`) and the
        session's matrix kernels convolve this shape
        (:meth:`onnx_cinm.sim.blas.MatrixKernels.conv`); the simulator then counts the
        inference without its data path (``data=False``), so the counters, tiles and wear
        are those of a run on the patches. Exact in the sense of ideal mode: the same
        products and sums, in the convolution kernel's order.
        """
        if self.op.op_type != "Gemm" or self.operand != "B" or self._sim is None or \
                not self.prog.mode.ideal or (self.bias_name and not self.bias_in_file):
            return None
        if activation not in (None, "Relu") or (self.integer and activation) or \
                (groups != 1 and not self.integer):
            return None
        geometry = tuple(tuple(int(v) for v in g) for g in geometry)
        return lambda x, out=None, residual=None, residual_activation=None: \
            self._from_patches(x, geometry, activation, int(groups), out, residual,
                               residual_activation)

    def _from_patches(self, x, geometry, activation, groups=1, dest=None, residual=None,
                      residual_activation=None):
        if residual is not None and (self.integer or groups != 1 or activation is not None):
            return None
        x = np.asarray(x)
        plan = self._patch_plans.get(x.shape)
        if plan is None:
            plan = self._patch_plan(x, geometry, activation, groups)
            if plan is None:  # not known yet (no inference with the patches so far)
                return None
            self._patch_plans[x.shape] = plan
        if plan is False or x.dtype != (x.dtype if self.integer and x.dtype.kind in "iu"
                                         else np.float32):
            return None
        inp, out, X, transposed, shape, axes, order, conv = plan
        if self.integer:  # the sums first: an input that does not fit leaves nothing counted
            with self._lock:
                Y = conv(x)
                if Y is None:
                    return None
                if self._int_conv_bias is not None:
                    np.add(Y, self._int_conv_bias, out=Y)
                outs, c = self._sim.run({inp: X}, data=False)
            if groups > 1:  # [n, G*Ng, *O] as the Gemm's [n, G, *O, Ng], y_perm applied: a
                # view, which the views merging the groups back make [n, G*Ng, *O] again
                Y = Y.reshape((Y.shape[0], groups, -1) + Y.shape[2:]).transpose(order)
                return [Y], self._metrics(c.as_dict(), X, outs[out])
            return [Y if order is None else np.ascontiguousarray(Y.transpose(order))], \
                self._metrics(c.as_dict(), X, outs[out])
        if residual is not None:  # added (then its activation) inside the convolution
            if order not in (None, tuple(range(x.ndim))) or type(residual) is not np.ndarray or \
                    residual.dtype != np.float32 or \
                    residual.shape != tuple(shape[a] for a in axes):
                return None
            conv = self._residual_conv(x, geometry, residual_activation)
            if conv is None:
                return None
        elif conv is None:  # released for the residual one (_residual_conv): the patches
            return None
        with self._lock:
            outs, c = self._sim.run({inp: X}, transposed=transposed, data=False)
            if order is None:  # the node's output is the simulator's buffer, as it is laid out
                Y = outs[out].reshape(shape).transpose(axes)
                if dest is not None and dest.shape == Y.shape and dest.dtype == Y.dtype and \
                        dest.flags.c_contiguous:  # or the caller's array, when it fits
                    Y = dest
                Y = conv(x, Y) if residual is None else conv(x, Y, residual)
            elif residual is None:
                Y = np.ascontiguousarray(conv(x).transpose(order))
            else:  # laid out as the node's output, in a new array (not the simulator's buffer)
                Y = conv(x, None, residual)
        return [Y], self._metrics(c.as_dict(), X, outs[out])

    def _residual_conv(self, x, geometry, activation):
        """The convolution of inputs of ``x``'s shape that adds a residual input and then
        applies ``activation`` (:meth:`onnx_cinm.sim.blas.MatrixKernels.conv`, ``residual``),
        built once per shape; None when the matrix kernels do not convolve it. Once built, the
        plain convolution's session of that shape is released (a kernel the provider gives a
        residual always runs with it): ResNet50's weights are then not held twice."""
        key = (x.shape, activation)
        got = self._residual_convs.get(key)
        if got is None:
            _, w, b, _ = self._affine()
            bias = None if b is None else self._sim.const[b].reshape(-1)
            kernels = blas.current()
            got = kernels.conv(x, self._sim.const[w][0], bias, geometry, activation,
                               residual=True) or False
            self._residual_convs[key] = got
            plan = self._patch_plans.get(x.shape)
            if got and plan:  # the plain convolution's session, not needed: its weights go
                self._patch_plans[x.shape] = plan[:-1] + (None,)
                kernels.release_conv(self._sim.const[w][0])
        return got or None

    def _affine(self):
        """The simulator's :meth:`~CrossbarSimulator.affine` form; before its first inference,
        that of a simulator of its own over the same program and weights (zeros for weights
        programmed at every run) run once on one row of zeros (an ideal program's data path
        depends on neither), so the first
        inference can compute from the patches too. None when the program is not one."""
        form = self._sim.affine() if self._sim is not None else None
        if form is None and self._probed is None:
            X = {r.name: np.zeros((r.dims[0], 1, r.dims[1]), np.float32)
                 for r in self.prog.regions.values() if r.kind == "input"}
            consts = dict(self._sim.const) if self._sim is not None else \
                {r.name: np.zeros(r.dims) for r in self.prog.regions.values()
                 if r.kind == "weight" and r.tensor is not None}
            try:  # its weights are the kernel's: checked once (a probe per unrolled step)
                probe = CrossbarSimulator(self.prog, consts, checked=self._checked)
            except XbarError:
                self._probed = False
                return None
            try:
                with blas.plain():  # one row of zeros: not a shape the session chooses for
                    probe.run(X)
            except XbarError:
                self._probed = False
            else:
                self._probed = probe.affine() or False
        return form or self._probed or None

    def _patch_plan(self, x, geometry, activation, groups=1):
        """What :meth:`_from_patches` does with inputs of ``x``'s shape: ``(input and output
        region, the patches' zero-stride stand-in, output layout, reshape, axes, the
        convolution's axes to the node's output or None when it writes the buffer as it is,
        the convolution)``; False when it never computes them (the matrix kernels take the
        materialized patches, or a shape that is not one group of ``C * prod(k)`` rows); None
        when the simulator's data path is not a plain product (:meth:`_affine`)."""
        form = self._affine()
        if form is None:
            return None
        kernel_shape, strides, pads, dilations = geometry
        r = len(kernel_shape)
        if x.dtype.kind != ("i" if self.integer else "f") or \
                (not self.integer and x.dtype != np.float32) or x.ndim != 2 + r:
            return False
        inp, w, b, out = form
        W = self._sim.const[w]
        O = tuple((x.shape[2 + i] + pads[i] + pads[i + r] - dilations[i] * (kernel_shape[i] - 1)
                   - 1) // strides[i] + 1 for i in range(r))
        G = groups
        if x.shape[1] % G or (G > 1 and x.shape[0] != 1):
            return False
        a_shape = (x.shape[0],) + ((G,) if G > 1 else ()) + O + \
            (x.shape[1] // G * int(np.prod(kernel_shape)),)
        b_shape = tuple(self.op.inputs[1].static_shape)
        if W.shape[0] != G or min(O, default=1) < 1 or a_shape[-1] != W.shape[1]:
            return False
        try:
            v, transposed, shape, axes = self._layout(a_shape, b_shape)
        except ValueError:
            return False
        bias = None if b is None else self._sim.const[b].reshape(-1)
        if v.G != G or v.rows != x.shape[0] * int(np.prod(O)):
            return False
        if self.integer:
            conv = blas.current().int_conv(x, W, geometry, groups=G)
            self._int_conv_bias = None if b is None else \
                self._int_bias(b, self._sim).reshape((-1,) + (1,) * r)
        else:
            conv = blas.current().conv(x, W[0], bias, geometry, activation)
        if conv is None:
            return False
        # the convolution's [n, N, *O] as the node's [n, *O, N] (grouped: [n, G, Ng, *O] as
        # [n, G, *O, Ng]), y_perm applied
        order = (0,) + tuple(range(2, 2 + r)) + (1,) if G == 1 else \
            (0, 1) + tuple(range(3, 3 + r)) + (2,)
        if self.y_perm is not None:
            order = tuple(order[i] for i in self.y_perm)
        # the patches' shape, no memory
        X = np.broadcast_to((np.float64 if self.integer else np.float32)(0), (v.G, v.rows, v.K))
        probe = np.empty((v.G, v.N, v.rows) if transposed else (v.G, v.rows, v.N), np.uint8)
        Y = (probe.transpose(0, 2, 1) if transposed else probe).reshape(shape).transpose(axes)
        direct = order == tuple(range(2 + r)) and Y.flags.c_contiguous and \
            np.shares_memory(Y, probe)  # a view of the buffer, not a copy made by reshape
        return inp, out, X, transposed, shape, axes, None if direct else order, conv


def _add(a: dict, b: dict) -> dict:
    out = {}
    for k in b:
        out[k] = max(a[k], b[k]) if k == "max_cell_writes" else a[k] + b[k]
    return out
