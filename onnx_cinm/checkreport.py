"""The golden check's results: :class:`OutputCheck` (one output), :class:`CheckReport` (one
:func:`onnx_cinm.golden.compare`) and :class:`StepwiseCheck` (one
:func:`onnx_cinm.golden.compare_stepwise`).

Apart from :mod:`onnx_cinm.golden` so an ``optimize --check 0`` run, which compares nothing,
does not create these classes; :mod:`onnx_cinm.golden` re-exports them, and loads this module on
first use of one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import quantref
from .errors import CheckFailed
from .text import table
from .tolerance import default_tolerance

#: Above this share of NaN/Inf elements in an output's reference, its check proves nothing
#: (:attr:`OutputCheck.meaningless`): more than a quarter of the output is not computed.
MAX_NONFINITE_SHARE = 0.25


@dataclass
class OutputCheck:
    """The comparison of one output, accumulated over all runs.

    Attributes
    ----------
    name : str
        Output name.
    max_abs_err : float
        Largest ``|candidate - reference|`` over all elements and runs (positions where both are
        the same NaN/Inf count as 0; a NaN/Inf pattern mismatch counts as ``inf``). ``inf`` when
        the output could not be compared (missing, shape or dtype mismatch).
    max_rel_err : float
        Largest ``|candidate - reference| / |reference|`` over positions where the reference is
        finite and nonzero (zeros are judged by the absolute error alone).
    ok : bool
        Every element of every run within tolerance (exact for int/bool/string outputs).
    mismatched : int
        Number of elements outside tolerance, summed over runs.
    elements : int
        Number of elements compared, summed over runs.
    dtype, shape : str, tuple
        Of the reference output (last run).
    note : str
        Why it failed when it is not a numeric mismatch ("missing in candidate", "shape ...").
    ref_nonfinite : int
        Reference elements that are NaN or Inf, summed over runs (floats).
    ref_values : set
        The smallest and largest finite reference values seen (floats), until two differ: one
        value means the reference was constant over every element of every run.
    rtol, atol : float or None
        The tolerances this output was judged with (None until compared).
    rel_err_ref : float
        ``|reference|`` at the element of ``max_rel_err`` (floats): a relative error above
        ``rtol`` on an element below ``atol / rtol`` in size is covered by ``atol``
        (:meth:`rel_err_note`).
    k : int
        The reduction length ``atol`` was widened for (1: not widened by that rule).
    widened_by : str
        The rule that gave the default ``atol`` its value when it exceeds the dtype's
        (:func:`default_tolerance`): ``"sum"`` (the rounding of a ``k``-long reduction,
        :func:`accumulation_atol`), ``"step"`` (one quantization step of the output), or ''.
    stepwise : bool
        Beyond tolerance end to end, but judged OK tensor by tensor (a quantized model whose
        one-step rounding-tie differences cascade: :class:`StepwiseCheck`).
    by_node : bool
        Beyond tolerance end to end, but judged OK node by node (every device node computes
        what onnxruntime computes on its inputs, and the model quantizes at run time:
        :class:`NodeCheck`).
    """

    name: str
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    ok: bool = True
    mismatched: int = 0
    elements: int = 0
    dtype: str = ""
    shape: tuple = ()
    note: str = ""
    ref_nonfinite: int = 0
    ref_values: set = field(default_factory=set, repr=False)
    sq_err: float = 0.0
    sq_ref: float = 0.0
    rel_err_ref: float = 0.0
    k: int = 1
    stepwise: bool = False
    by_node: bool = False
    widened_by: str = ""
    #: rows (every index but the last axis's, every run) of a float output whose last axis has
    #: at least 2 entries, and of them those where candidate and reference take their largest
    #: value at the same index (``argmax``): for class scores, how many top-1 answers agree,
    #: which a relative error over probabilities can hide (a trial: 0.028 relative RMS error
    #: where a score fell from 3.7e-2 to 4.4e-26)
    argmax_rows: int = 0
    argmax_same: int = 0

    @property
    def rel_rms_err(self) -> float:
        """``sqrt(sum (candidate - reference)^2 / sum reference^2)`` over the finite elements of
        every run (float outputs; 0 when the reference is all zero or not float): the error as
        a share of the signal, the figure for a deliberately inexact data path (quantized or
        noisy crossbars) where a pass/fail verdict does not apply."""
        return float(np.sqrt(self.sq_err / self.sq_ref)) if self.sq_ref > 0 else 0.0

    @property
    def meaningless(self) -> str:
        """Why comparing this output proves nothing ('' if it does): its reference is NaN or Inf
        everywhere (a NaN equals a NaN whatever was computed) or in more than
        :data:`MAX_NONFINITE_SHARE` of its elements (the inputs drive the model where it does
        not compute: random data where it expects real data), or it is one value everywhere.
        (A few NaN/Inf among finite values leave the rest meaningful:
        :meth:`CheckReport.summary` counts them.)"""
        if self.elements and self.ref_nonfinite == self.elements:
            return f"the reference '{self.name}' is NaN/Inf everywhere"
        if self.elements and self.ref_nonfinite > MAX_NONFINITE_SHARE * self.elements:
            return (f"the reference '{self.name}' is NaN/Inf in {self.ref_nonfinite} of "
                    f"{self.elements} elements")
        if self.elements > 1 and len(self.ref_values) == 1:
            return f"the reference '{self.name}' is {next(iter(self.ref_values)) + 0.0:g} everywhere"  # no -0
        return ""
    rtol: float | None = None
    atol: float | None = None

    def widened_text(self) -> str:
        """What widened the default ``atol`` (:attr:`widened_by`), in words ('' if nothing):
        ``rounding of a sum of 160 terms`` or ``one quantization step``."""
        return {"sum": f"rounding of a sum of {self.k} terms",
                "step": "one quantization step"}.get(self.widened_by, "")

    def rel_err_note(self) -> str:
        """Why a passing output's ``max_rel_err`` exceeds ``rtol`` ('' if it does not): the
        element is smaller than ``atol / rtol``, where ``atol`` allows more than ``rtol`` does
        (``|c - r| <= atol + rtol |r|``), and what widened ``atol`` (:meth:`widened_text`)."""
        if not self.ok or self.stepwise or self.by_node or self.rtol is None or not math.isfinite(self.max_rel_err) \
                or self.max_rel_err <= self.rtol:
            return ""
        why = self.widened_text()
        atol = f"atol {self.atol:.2g}" + (f" ({why})" if why else "")
        if self.rtol > 0:  # |c - r| <= atol + rtol |r|: atol is the larger term below atol/rtol
            judged = (f"elements below |reference| {self.atol / self.rtol:.3g} are judged by "
                      f"{atol}, not rtol {self.rtol:.2g}")
        else:
            judged = f"every element is judged by {atol} (rtol 0)"
        return (f"'{self.name}' max rel err {self.max_rel_err:.2g} is at an element of "
                f"|reference| {self.rel_err_ref:.2g}; {judged}")

    def _fail(self, note: str) -> None:
        self.ok = False
        self.max_abs_err = self.max_rel_err = float("inf")
        if note and note not in self.note:
            self.note = f"{self.note}; {note}" if self.note else note


@dataclass
class CheckReport:
    """Result of :func:`compare`.

    Attributes
    ----------
    ok : bool
        All outputs matched in all runs and no structural problem was found.
    runs : int
        Number of input sets both models were run on.
    outputs : list[OutputCheck]
        One record per output name of either model (reference order, then candidate-only names).
    rtol, atol : float or None
        The tolerances given; None when they follow each output's dtype
        (:func:`default_tolerance`; each :class:`OutputCheck` records its own).
    problems : list[str]
        Model-level problems (e.g. the models take different inputs).
    skipped : list[str]
        Input sets the *reference* could not run (the reason per set); not counted in ``runs``.
    special : bool
        The NaN/Inf check (:func:`compare_special`): NaN/Inf in the references are expected.
    notes : list[str]
        How the reference was computed when not as given (exact integer products, see
        :func:`compare`), shown by :meth:`summary`.
    stepwise : StepwiseCheck or None
        The tensor-by-tensor check of a quantized model that failed end to end (None: not
        run); when it passed, ``ok`` is True and the outputs it cleared say ``stepwise``.
    nodes : NodeCheck or None
        The check node by node of a failure of the CINM provider's run (None: not run); when
        it explains the failure (:attr:`NodeCheck.ok`), ``ok`` is True and the outputs it
        cleared say ``by_node``.
    """

    ok: bool
    runs: int
    outputs: list[OutputCheck] = field(default_factory=list)
    rtol: float | None = None
    atol: float | None = None
    problems: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    special: bool = False
    notes: list[str] = field(default_factory=list)
    stepwise: StepwiseCheck | None = None
    nodes: NodeCheck | None = None

    @property
    def max_abs_err(self) -> float:
        return max((o.max_abs_err for o in self.outputs), default=0.0)

    @property
    def meaningless(self) -> list[str]:
        """Why the comparison proves nothing, per output (empty: it is meaningful). A check
        that passes on such outputs is not reported as OK (see :meth:`summary`). Empty for the
        NaN/Inf check (``special``), whose references hold NaN/Inf by design."""
        return [] if self.special else [o.meaningless for o in self.outputs if o.meaningless]

    @property
    def max_rel_err(self) -> float:
        return max((o.max_rel_err for o in self.outputs), default=0.0)

    def summary(self) -> str:
        """One short line, e.g. ``check: 3 runs, 2 outputs, max abs err 1.2e-07, max rel err
        3.4e-06: OK``; on failure the first few reasons follow ``FAILED``."""
        head = (f"check: {self.runs} run{'s' * (self.runs != 1)}, {len(self.outputs)} "
                f"output{'s' * (len(self.outputs) != 1)}, max abs err {self.max_abs_err:.2g}, "
                f"max rel err {self.max_rel_err:.2g}")
        if self.skipped:
            head += (f" ({len(self.skipped)} more input set{'s' * (len(self.skipped) != 1)} "
                     f"skipped: the original does not run on them)")
        for note in self.notes:
            head += f" ({note})"
        if self.ok and self.meaningless:
            more = f" (+{len(self.meaningless) - 2} more)" if len(self.meaningless) > 2 else ""
            return (f"{head}: NOT MEANINGFUL ({'; '.join(self.meaningless[:2])}{more}; give valid "
                    "inputs with --input NAME=FILE.npy or sizes with --dim NAME=SIZE; Python: "
                    "inputs={NAME: array}, dims={NAME: SIZE})")
        nonfinite = [f"{o.name}: {o.ref_nonfinite} of {o.elements}" for o in self.outputs
                     if o.ref_nonfinite and not o.meaningless and not self.special]
        notes = [o.rel_err_note() for o in self.outputs if o.rel_err_note()]
        why = f" ({notes[0]}{f'; +{len(notes) - 1} more' if len(notes) > 1 else ''})" if notes else ""
        if self.ok and nonfinite:
            return (f"{head}: OK on the finite elements (NaN/Inf in the reference, matched: "
                    f"{'; '.join(nonfinite[:2])}){why}")
        if self.ok and self.stepwise is not None:
            return f"{head}: OK tensor by tensor ({self.stepwise.summary()}){why}"
        if self.ok and self.nodes is not None:
            return f"{head}: OK node by node ({self.nodes.summary()}){why}"
        if self.ok:
            return f"{head}: OK{why}"
        reasons = list(self.problems)
        for o in self.outputs:
            if not o.ok:
                tol = (f", max abs err {o.max_abs_err:.3g} beyond atol {o.atol:.3g} + rtol "
                       f"{o.rtol:.3g} x |reference|" if o.atol is not None and o.rtol is not None
                       and o.dtype.startswith("float") else "")
                reasons.append(f"{o.name}: {o.note}" if o.note
                               else f"{o.name}: {o.mismatched} of {o.elements} elements off{tol}")
        more = f" (+{len(reasons) - 3} more)" if len(reasons) > 3 else ""
        step = f"; {self.stepwise.summary()}" if self.stepwise is not None else ""
        step += f"; {self.nodes.summary()}" if self.nodes is not None else ""
        return f"{head}: FAILED ({'; '.join(reasons[:3])}{more}{step})"

    def table(self, verdict: bool = True) -> str:
        """A fixed-width table, one row per output, with the tolerances in the header;
        ``verdict=False`` (an inexact data path) leaves out the pass/fail of numeric errors."""
        rows = [(o.name, o.dtype or "-", "x".join(map(str, o.shape)) if o.shape else "-",
                 f"{o.max_abs_err:.3g}", f"{o.max_rel_err:.3g}", f"{o.rel_rms_err:.3g}",
                 f"{o.mismatched}/{o.elements}",
                 ("FAIL: " + o.note) if o.note else
                 ("not meaningful" if o.meaningless and not self.special else
                  "ok tensor by tensor" if o.stepwise else
                  "ok node by node" if o.by_node else "ok") if o.ok
                 else "FAIL" if verdict else "-")
                for o in self.outputs]
        return (f"golden check: {self.runs} run{'s' * (self.runs != 1)}, {self.tolerances()}\n"
                + table(("output", "dtype", "shape", "max abs err", "max rel err", "rel rms err",
                         "off", "status"), rows, notes=[f"problem: {p}" for p in self.problems]))

    def tolerances(self) -> str:
        """The tolerances in words: ``rtol 1e-4, atol 1e-5``, or per dtype when they follow it
        (``rtol/atol by dtype: float16 0.0039/0.0039, float32 0.0001/1e-05``)."""
        if self.rtol is not None and self.atol is not None:
            return f"rtol {self.rtol:g}, atol {self.atol:g}"
        floats = [o for o in self.outputs
                  if o.rtol is not None and o.dtype and np.dtype(o.dtype).kind in "fc"]
        by, widened = set(), []
        for o in floats:  # the dtype's atol, and apart the outputs whose atol was widened
            base = default_tolerance(o.dtype)[1] if self.atol is None else self.atol
            if o.atol > base:
                widened.append(o)
            by.add((o.dtype, o.rtol, min(o.atol, base)))
        if not by:
            return "tolerances by dtype"
        text = "rtol/atol by dtype: " + ", ".join(f"{d} {r:g}/{a:g}" for d, r, a in sorted(by))
        if widened:
            text += "; atol widened: " + ", ".join(
                f"{o.name} {o.atol:.3g}" + (f" ({o.widened_text()})" if o.widened_text() else "")
                for o in widened[:3]) + (f" and {len(widened) - 3} more" if len(widened) > 3 else "")
        return text

    def raise_if_failed(self) -> "CheckReport":
        """Raise :class:`~onnx_cinm.errors.CheckFailed` with :meth:`summary` unless ``ok``."""
        if not self.ok:
            raise CheckFailed(self.summary())
        return self


@dataclass
class NodeCheck:
    """The check node by node of a failed comparison with the CINM provider
    (:func:`onnx_cinm.golden.compare_node_by_node`): every value the provider computed, against
    onnxruntime's run of the node that makes it (a device node's reference body, a host node
    as it is) on the very inputs the provider gave it, with
    :func:`onnx_cinm.golden.compare`'s default tolerances; and onnxruntime on the optimized
    model against the original, end to end (the rewrite of the host ops and the reference
    bodies, which a node-by-node comparison of the provider cannot see: a host node changed
    in the optimized model computes, node by node, exactly what it says). Where all of it
    agrees, a difference of the outputs is the last bits in which a device kernel rounds
    otherwise (an emulated DPU's ``tanhf`` against onnxruntime's vectorized approximation)
    grown by what follows: a model that quantizes at run time
    (:data:`onnx_cinm.golden.RUNTIME_QUANTIZERS`: one scale from the whole tensor's range)
    moves a value near a rounding boundary by a whole step, which the layers after it carry.

    Attributes
    ----------
    total : int
        Device nodes of the optimized model (those in If branches included).
    nodes : list[tuple[str, str, str, list[OutputCheck]]]
        The device nodes whose outputs the provider kept, in graph order: ``(label, op type,
        device, one check per output)``, accumulated over the input sets.
    host_off : list[tuple[str, str, str, list[OutputCheck]]]
        Host nodes (as ``nodes``) with a value the provider computed otherwise than
        onnxruntime from the same inputs.
    unjudged : list[str]
        Labels of the device nodes not judged: their outputs are never held by the provider
        and a node that is not judged reads them.
    quantizers : list[str]
        The ops of :data:`onnx_cinm.golden.RUNTIME_QUANTIZERS` in the original model.
    rewrite : str or None
        onnxruntime on the optimized model against the original: '' when they agree, else the
        check's summary; None when not compared (a node was off already, or nothing
        quantizes at run time).
    """

    total: int
    nodes: list = field(default_factory=list)
    host_off: list = field(default_factory=list)
    unjudged: list = field(default_factory=list)
    quantizers: list = field(default_factory=list)
    rewrite: str | None = None

    @property
    def judged(self) -> int:
        """Device nodes judged: an output held by the provider, or read only by judged nodes
        (an If's branch kernels with the If's outputs); :attr:`total` but the unjudged."""
        return self.total - len(self.unjudged)

    @property
    def off(self) -> list:
        """The entries of :attr:`nodes` with an output beyond tolerance."""
        return [n for n in self.nodes if not all(o.ok for o in n[3])]

    @property
    def ok(self) -> bool:
        """Whether this explains the end-to-end failure: every device node judged and within
        tolerance, every host value too, onnxruntime on the optimized model agreeing with the
        original, and the model quantizing at run time (without that, agreeing nodes leave
        the failure unexplained: it stands)."""
        return (self.judged > 0 and not self.off and not self.host_off and not self.unjudged
                and bool(self.quantizers) and self.rewrite == "")

    def summary(self) -> str:
        """One clause for :meth:`CheckReport.summary`."""
        def first_off(entries: list, what: str) -> str:
            label, op, device, outs = entries[0]
            o = next(o for o in outs if not o.ok)
            err = o.note or (f"{o.mismatched} of {o.elements} elements off, max abs err "
                             f"{o.max_abs_err:.3g}")
            more = f" (+{len(entries) - 1} more)" if len(entries) > 1 else ""
            return (f"node by node, on the inputs the provider gave it, the first {what} off is "
                    f"{op} '{label}' on {device}: {err}{more}")

        if self.off:
            return first_off(self.off, "device node")
        if self.host_off:
            return first_off(self.host_off, "host node")
        if not self.judged:
            return "node by node: the provider keeps no device node's output to judge"
        largest = ""
        if self.nodes:
            label, op, device, outs = max(self.nodes,
                                          key=lambda n: max(o.max_abs_err for o in n[3]))
            largest = (f" (largest difference: max abs err "
                       f"{max(o.max_abs_err for o in outs):.3g}, {op} '{label}' on {device})")
        n = self.judged
        agree = (f"each of the {n} device node{'s' * (n != 1)} judged computes, on the inputs "
                 f"the provider gave it, what onnxruntime computes from its reference "
                 f"body{largest}, and so does every host node")
        if self.unjudged:
            names = ", ".join(f"'{x}'" for x in self.unjudged[:3])
            more = f" and {len(self.unjudged) - 3} more" if len(self.unjudged) > 3 else ""
            k = len(self.unjudged)
            return (f"{agree}; {k} more device node{'s' * (k != 1)} not judged (the provider "
                    f"holds no output of {'it' if k == 1 else 'them'} that a judged node "
                    f"reads: {names}{more})")
        if not self.quantizers:
            return f"{agree}: the outputs' difference grows in the nodes after them"
        if self.rewrite:
            return (f"{agree}; but onnxruntime on the optimized model differs from the original "
                    f"itself ({self.rewrite}): the rewrite is off, not a device kernel")
        return (f"{agree}; the model quantizes at run time ({', '.join(self.quantizers)}: one "
                f"scale from the whole tensor's range), where a last-bit difference before it "
                f"moves whole quantization steps; onnxruntime on the optimized model matches "
                f"the original")


@dataclass
class StepwiseCheck:
    """The tensor-by-tensor check of a quantized (QDQ) model, :func:`compare_stepwise`.

    In a QDQ model every activation is rounded to a grid by a ``QuantizeLinear``. Where a value
    sits at a rounding tie, two correct computations (onnxruntime's float32 sum of dequantized
    terms; an exact int32 product rescaled in float32; onnxruntime's own fused integer kernels)
    land on neighbouring levels, and the layers after it move that one step on and grow it: the
    outputs of a deep model can then differ by far more than one step although no op computes
    anything wrong. Here every quantized tensor of the candidate is computed from the
    *reference's* quantized inputs, so a difference cannot cascade, and must match the
    reference's level, or be one step off where the reference's float value lies at a rounding
    tie (:func:`onnx_cinm.quantref.at_rounding_tie`: within :data:`~onnx_cinm.quantref.TIE_ULPS`
    ulps of the value, float32 ones for a float32 model, or :data:`~onnx_cinm.quantref.TIE_RTOL`
    of it, whichever is wider, of a half step, inside the type's range, the candidate on one of
    the two levels around it).

    Attributes
    ----------
    tensors : int
        Quantized tensors compared: the reference's ``QuantizeLinear`` outputs the candidate
        also computes (by name).
    total : int
        The reference's quantized tensors (:func:`onnx_cinm.quantref.quantized_tensors`).
    elements : int
        Elements compared, summed over tensors and input sets.
    at_ties : int
        Elements one step off at a rounding tie (allowed).
    off : list[tuple[str, int, int, int]]
        Tensors with elements off beyond that, in graph order: ``(name, elements off, elements,
        largest difference in steps)``, summed over input sets.
    outputs : list[OutputCheck]
        The graph outputs of the rewired candidate (computed from the reference's quantized
        tensors too, so the float ops after the last quantizer and any float path are judged)
        against the reference's, with :func:`compare`'s default tolerances.
    onnxruntime_self : float or None
        Max abs err between onnxruntime's ``ORT_ENABLE_ALL`` and ``ORT_DISABLE_ALL`` sessions
        of the reference on the first input set (its own fused integer kernels round
        differently), for scale; None when not measured.
    """

    tensors: int
    total: int
    elements: int = 0
    at_ties: int = 0
    off: list = field(default_factory=list)
    onnxruntime_self: float | None = None
    outputs: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether this explains an end-to-end failure as rounding ties cascading: at least one
        tensor compared, at least one element one step off at a tie (with none, the tensors
        all match and a cascade cannot be what moved the outputs), none off beyond that, and
        every output within tolerance."""
        return self.tensors > 0 and self.at_ties > 0 and not self.off and all(o.ok for o in self.outputs)

    def summary(self) -> str:
        """One clause for :meth:`CheckReport.summary`."""
        which = (f"each of the {self.tensors} quantized tensors" if self.tensors == self.total
                 else f"each of {self.tensors} of the {self.total} quantized tensors (the others "
                 "are not in the optimized model)")
        ort = (f"; onnxruntime's ORT_ENABLE_ALL session differs from its ORT_DISABLE_ALL one by "
               f"{self.onnxruntime_self:.3g} here" if self.onnxruntime_self is not None else "")
        if self.ok:
            ties = (f", {self.at_ties} of {self.elements} elements one step off at rounding ties "
                    f"(within {quantref.TIE_ULPS} ulps or {quantref.TIE_RTOL:g} of the value of a "
                    f"half step, inside the type's range)")
            return (f"quantized model: {which} recomputed from the original's quantized inputs "
                    f"matches it{ties}; the end-to-end error is such one-step differences "
                    f"cascading through the layers{ort}")
        if not self.tensors:
            return "tensor by tensor: the optimized model keeps none of the quantized tensors' names"
        if not self.off and all(o.ok for o in self.outputs):  # no tie: nothing cascaded
            return (f"tensor by tensor, {which} recomputed from the original's quantized inputs "
                    f"matches it with no element at a rounding tie, so the end-to-end error is "
                    f"no cascade of rounding ties")
        if not self.off:
            o = next(o for o in self.outputs if not o.ok)
            return (f"tensor by tensor, output '{o.name}' computed from the original's quantized "
                    f"tensors is still off: {o.note or f'max abs err {o.max_abs_err:.3g}'}")
        name, bad, n, steps = self.off[0]
        more = f" (+{len(self.off) - 1} more tensors)" if len(self.off) > 1 else ""
        return (f"tensor by tensor, from the original's quantized inputs, the first quantized "
                f"tensor off beyond a rounding tie is '{name}': {bad} of {n} elements, up to "
                f"{steps} steps{more}")
