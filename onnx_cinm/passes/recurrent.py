"""The ``to_cinm`` rules of the recurrent ops: LSTM, GRU and RNN expose their matrix products.

An ONNX LSTM/GRU/RNN (operator specs in onnx's ``docs/Operators.md``; gate orders ``iofc``,
``zrh``, ``i``) does two kinds of matrix product: the input projection ``X_t @ W^T`` of every
step, which depends on no earlier step, and the recurrent product ``H_{t-1} @ R^T``, one per
step. With a static sequence length ``S`` the rule rewrites the op into

- one cinm ``Gemm`` per direction for the input projection of all steps at once:
  ``X[S, batch, input] @ W^T[input, gates*hidden] + bias`` (``S*batch`` rows streamed through
  one weight: the big GEMM);
- per step, one cinm ``Gemm`` ``H_{t-1}[1, batch, hidden] @ R^T[hidden, gates*hidden]`` whose
  weight is one initializer shared by the ``S`` steps (a crossbar programs it once: the tile
  sets of :mod:`onnx_cinm.paradigms.cim.residency`). GRU with ``linear_before_reset = 0``
  multiplies ``(r_t * H_{t-1})`` by ``R_h``, so it has two recurrent products per step, over
  ``R_zr`` and ``R_h``;
- the gate math as standard ONNX ops on the host: ``Split`` into gates, ``Add``, ``Mul``,
  the activations (``Sigmoid``, ``Tanh``, ``Relu``), ``Clip`` to ``[-clip, clip]`` before
  every activation, peepholes ``P``, and ``Concat`` of the step results into ``Y``, ``Y_h``
  (``Y_c``).

With a dynamic ``S`` (or one above :data:`MAX_UNROLL`) the input projection is hoisted the
same way (one cinm Gemm over all steps, whatever their number) and the steps run in a ``Scan``
per direction whose body does one step with standard ops (its recurrent product a host
``MatMul``: control-flow bodies are not compiled). ONNX's LSTM/GRU/RNN themselves have no
form taking a precomputed projection.

Supported: directions forward, reverse and bidirectional; layouts 0 and 1; ``initial_h``,
``initial_c`` (any tensor), ``B`` and ``P`` (constant); ``sequence_lens`` absent or a constant
equal to ``S`` for every batch row; activations Sigmoid/Tanh/Relu; ``clip``; ``input_forget``;
GRU's ``linear_before_reset`` 0 and 1; batch static or symbolic. A length sized only by
``--dim`` fixes that dim: the pass records it (:func:`onnx_cinm.frontend.unrolled_dims`) and
the execution provider refuses another size of it in one line; a batch sized so stays free.
Kept whole on the host, with the reason in the summary: ``W``/``R``/``B``/``P`` computed at run
time, ``sequence_lens`` given at run time, shorter than ``S`` or with a dynamic ``S``, other
activations, opset below 13.
LSTM ``input_forget = 1`` couples the gates as onnxruntime does: ``f_t = 1 - i_t``.

onnxruntime's contrib ``com.microsoft DynamicQuantizeLSTM`` (int8/uint8 ``W [dirs, I, 4H]`` and
``R [dirs, H, 4H]`` with float scales and zero points per tensor ``[dirs]`` or per output
channel ``[dirs, 4H]``: ContribOperators.md) takes the LSTM route with integer products, as
onnxruntime's kernel computes them (``dynamic_quantize_lstm.cc`` -> ``uni_directional_lstm.cc``
and ``rnn_helpers.cc``'s quantized ``ComputeGemm``): the whole sequence ``X`` quantized once
(uint8, per tensor, from its range: ``DynamicQuantizeLinear``'s rule), one int32 cinm ``Gemm``
of ``(X_q - x_zp)`` by the constant ``W - w_zp``, then ``float(acc) * (x_scale * w_scale)``; per
step, ``H_{t-1}`` quantized the same way on its own and its int32 ``Gemm`` by ``R - r_zp``
rescaled likewise; ``B``'s ``Wb + Rb`` added to their sum (with peepholes onnxruntime adds
``P * C`` before the bias, here after it: last-bit differences); the gate math in float. The weights
reach the devices as the model stores them (no re-quantization). One difference is not
reproduced: with a batch of 2 or more rows and at most 256 hidden units (or more than 4 rows),
onnxruntime's kernel splits the batch over its threads and quantizes each part's ``H_{t-1}``
on its own range; here the whole batch shares one range (onnxruntime's result with one thread).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..dialects import cinm
from ..rewrite import Builder, Rule, ir, names_of

#: Gates per op and the activations each direction takes (ONNX defaults).
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
#: onnxruntime's int8 LSTM (see the module docstring): lowered as an LSTM with integer products.
_QLSTM = "com.microsoft::DynamicQuantizeLSTM"
_DEFAULT_ACTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
_ACTS = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu"}
#: The ``doc_string`` of a ``Scan`` this pass makes (the steps of a recurrence of a dynamic
#: length, or of one longer than :data:`MAX_UNROLL`): the compiler's, not the model's control
#: flow (:func:`made_scan`); ``{why}`` is :data:`DYNAMIC` or :data:`TOO_LONG` filled in.
SCAN_DOC = "onnx-cinm: the steps of {op} '{name}' ({why})"
DYNAMIC = "a sequence of dynamic length"
TOO_LONG = "length {length} exceeds the unroll limit of {limit} steps"


def made_scan(node) -> str | None:
    """The recurrent op type (``LSTM``, ``GRU``, ``RNN``) whose steps ``node`` (a NodeProto)
    runs, if it is a ``Scan`` this pass made; else None. :func:`scan_reason` tells why it is
    a Scan."""
    head = SCAN_DOC.split("{op}")[0]
    if node.op_type != "Scan" or not node.doc_string.startswith(head):
        return None
    op = node.doc_string[len(head):].split(" ")[0]
    return op if op in _GATES else None


def scan_reason(node) -> str:
    """Why the recurrence whose steps ``node`` (a ``Scan`` :func:`made_scan` names) runs is
    not unrolled: :data:`DYNAMIC`, or :data:`TOO_LONG` with its numbers (``"length 300
    exceeds the unroll limit of 256 steps"``)."""
    return node.doc_string.rsplit("(", 1)[-1].rstrip(")")


#: Longest sequence unrolled: each step is about 15 nodes and a crossbar kernel file per
#: direction; a longer one runs its steps in a Scan, as a dynamic length does.
MAX_UNROLL = 256


class _Ops:
    """Gate-math helpers over ``std``/``multi``/``const`` (see :class:`_Cell`, :class:`_Body`)."""

    dtype: np.dtype
    clip: float | None

    def once(self, suffix: str, array: np.ndarray) -> str:
        """A constant made once per builder (the same ``suffix`` gives the same one)."""
        if suffix not in self._consts:
            self._consts[suffix] = self.const(suffix, array)
        return self._consts[suffix]

    def ints(self, suffix: str, values) -> str:
        return self.const(suffix, np.asarray(values, dtype=np.int64))

    def act(self, name: str, x: str) -> str:
        if self.clip is not None:
            lim = [self.once("clip_lo", np.array(-self.clip, self.dtype)),
                   self.once("clip_hi", np.array(self.clip, self.dtype))]
            x = self.std("Clip", [x] + lim)
        return self.std(name, [x])

    def split(self, x: str, parts: int, width: int, axis: int = 2) -> list[str]:
        if parts == 1:
            return [x]
        sizes = self.once(f"split{parts}x{width}", np.asarray([width] * parts, dtype=np.int64))
        return self.multi("Split", [x, sizes], parts, axis=axis)


class _Cell(Builder, _Ops):
    """Builds one recurrent op's replacement: standard ops, cinm Gemms and constants."""

    def __init__(self, rw, node: ir.Node, dtype: np.dtype, clip: float | None) -> None:
        super().__init__(rw, node)
        self.rw, self.source, self.dtype, self.clip = rw, node, dtype, clip
        self._consts: dict = {}

    def std(self, op: str, inputs: list[str], outputs: list[str] | None = None, **attrs) -> str:
        return self.node(helper.make_node, op, inputs, outputs, op.lower(), **attrs)

    def multi(self, op: str, inputs: list[str], count: int, **attrs) -> list[str]:
        """A standard op with ``count`` fresh outputs (Split)."""
        outs = [self.rw.fresh(f"{self.base}_{op.lower()}") for _ in range(count)]
        self.node(helper.make_node, op, inputs, outs, op.lower(), **attrs)
        return outs

    def gemm(self, inputs: list[str], suffix: str) -> str:
        return self.node(cinm.make_node, "Gemm", inputs, None, suffix)

    def const(self, suffix: str, array: np.ndarray) -> str:
        return self.rw.const(f"{self.base}_{suffix}", np.asarray(array))


class _Body(_Ops):
    """Builds the body of the ``Scan`` of a recurrence of dynamic length: standard ops only
    (``MatMul`` for the recurrent product, ``Constant`` nodes for its weights), as NodeProtos
    with names fresh in the whole model."""

    def __init__(self, rw, base: str, dtype: np.dtype, clip: float | None) -> None:
        self.rw, self.base, self.dtype, self.clip = rw, base, dtype, clip
        self.nodes: list = []
        self._consts: dict = {}

    def fresh(self, suffix: str) -> str:
        return self.rw.fresh(f"{self.base}_{suffix}")

    def std(self, op: str, inputs: list[str], outputs: list[str] | None = None, **attrs) -> str:
        outs = outputs or [self.fresh(op.lower())]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.fresh(op), **attrs))
        return outs[0]

    def multi(self, op: str, inputs: list[str], count: int, **attrs) -> list[str]:
        outs = [self.fresh(op.lower()) for _ in range(count)]
        self.std(op, inputs, outs, **attrs)
        return outs

    def gemm(self, inputs: list[str], suffix: str) -> str:
        y = self.std("MatMul", inputs[:2])
        return self.std("Add", [y, inputs[2]]) if len(inputs) > 2 and inputs[2] else y

    def const(self, suffix: str, array: np.ndarray) -> str:
        name = self.fresh(suffix)
        self.nodes.append(helper.make_node("Constant", [], [name], name=self.fresh("Constant"),
                                           value=numpy_helper.from_array(np.asarray(array), name)))
        return name


def _attrs(node: ir.Node) -> dict:
    return {k: a.value for k, a in node.attributes.items()}


def _quantized(node: ir.Node) -> bool:
    return node.domain == "com.microsoft" and node.op_type == "DynamicQuantizeLSTM"


def _kind(node: ir.Node) -> str:
    """The recurrent op ``node`` computes: LSTM, GRU or RNN."""
    return "LSTM" if _quantized(node) else node.op_type


def _check_quant(rw, ins: list, W, R):
    """The quantization inputs of a DynamicQuantizeLSTM (constant scales ``[dirs]`` or
    ``[dirs, 4H]`` float32, zero points the same shape and weights' dtype), or why not."""
    dtypes = {W.dtype.name, R.dtype.name}
    if not dtypes <= {"int8", "uint8"}:
        return f"weights of dtype {sorted(dtypes)}"
    arrays = [rw.value(n) if n else None for n in ins[8:12]]
    if any(a is None for a in arrays):
        return "weight scales or zero points computed at run time"
    dirs, g4 = W.shape[0], W.shape[2]
    for a in arrays:
        if a.shape not in ((dirs,), (dirs, g4)):
            return f"scale or zero point of shape {list(a.shape)}"
    ws, wz, rs, rz = arrays
    if ws.dtype != np.float32 or rs.dtype != np.float32:
        return "scales not float32"
    return {"Ws": ws, "Wz": wz.astype(np.int32), "Rs": rs, "Rz": rz.astype(np.int32)}


def check(rw, node: ir.Node):
    """The binding of a recurrent op the rule rewrites, or the reason it stays whole."""
    op, at, quant = _kind(node), _attrs(node), _quantized(node)
    ins = names_of(node.inputs) + [""] * 12
    x, w, r, b, seq_lens = ins[:5]
    if rw.opset < 13:
        return "opset below 13"
    xi = _input_info(rw, node)
    if xi is None or xi.shape is None or len(xi.shape) != 3 or xi.dtype is None:
        return "input shape unknown"
    dtype = np.dtype(xi.dtype)
    if dtype.name not in ("float32", "float64") or quant and dtype.name != "float32":
        return f"dtype {dtype.name}"
    layout = int(at.get("layout", 0))
    S, batch, size = (xi.shape[1], xi.shape[0], xi.shape[2]) if layout else xi.shape
    length = S if isinstance(S, int) else None  # the sequence's length, if static
    if not isinstance(S, int) or S > MAX_UNROLL:
        S = None  # dynamic (or too long to unroll): the steps run in a Scan (see replace)
    if S == 0:
        return "empty sequence"
    W, R = rw.value(w), rw.value(r)
    if W is None or R is None:
        return "W or R computed at run time"
    q = _check_quant(rw, ins, W, R) if quant else None
    if isinstance(q, str):
        return q
    B = rw.value(b) if b else None
    if b and B is None:
        return "bias B computed at run time"
    peep = ins[7] if op == "LSTM" else ""
    P = rw.value(peep) if peep else None
    if peep and P is None:
        return "peepholes P computed at run time"
    if seq_lens:
        lens = rw.value(seq_lens)
        if lens is None:
            return "sequence_lens given at run time"
        if S is None:
            return "sequence_lens with a dynamic sequence length"
        if np.any(lens != S):
            return f"sequence_lens {lens.tolist()} shorter than the sequence ({S})"
    dirs = W.shape[0]
    direction = at.get("direction", "forward")
    if (direction == "bidirectional") != (dirs == 2):
        return f"direction {direction} with {dirs} weight sets"
    acts = list(at.get("activations") or _DEFAULT_ACTS[op] * dirs)
    if len(acts) != len(_DEFAULT_ACTS[op]) * dirs or any(a.lower() not in _ACTS for a in acts):
        return f"activations {acts} (supported: Sigmoid, Tanh, Relu)"
    if at.get("activation_alpha") or at.get("activation_beta"):
        return "activation_alpha/beta"
    hidden = R.shape[1] if quant else R.shape[-1]
    clip = at.get("clip")
    return {"S": S, "length": length, "batch": batch, "input": size, "hidden": hidden, "dirs": dirs,
            "x_shape": None if rw.info(x).shape is not None else xi.shape,
            "reverse": [direction == "reverse" or d == 1 for d in range(dirs)],
            "acts": [_ACTS[a.lower()] for a in acts], "layout": layout, "dtype": dtype,
            "W": W, "R": R, "B": B, "P": P, "clip": None if clip is None else float(clip), "quant": q,
            "lbr": int(at.get("linear_before_reset", 0)),
            "coupled": op == "LSTM" and bool(int(at.get("input_forget", 0)))}


def _input_info(rw, node: ir.Node):
    """The TensorInfo of ``node``'s sequence input ``X`` (its shape from :func:`_reshaped` when
    shape inference could not tell it), or None."""
    xi = rw.info(node.inputs[0].name) if node.inputs and node.inputs[0] is not None else None
    if xi is not None and xi.shape is None and xi.dtype is not None:
        xi = type(xi)(xi.name, xi.dtype, _reshaped(rw, node.inputs[0]), xi.const)
    return xi


class _At:
    """``rw`` seen with the tensor infos ``infos`` (shapes at other dim sizes)."""

    def __init__(self, rw, infos: dict) -> None:
        self.rw, self.infos = rw, infos

    def info(self, name: str):
        return self.infos.get(name)

    def array(self, value):
        return self.rw.array(value)


def _follows(rw, node: ir.Node, axis: int, size: int) -> dict[str, int]:
    """The planned dims (``rw.planned``) that the static extent ``size`` of axis ``axis`` of
    ``node``'s input ``X`` follows: ``{name: planned size}`` of each dim at whose double the
    extent is another number (a dim it does not follow leaves it as it is). A graph built for
    that extent (unrolled steps, a zero state of that batch) runs at that size only."""
    out = {}
    for name, planned in rw.planned.items():
        xi = _input_info(_At(rw, rw.infos_at({**rw.planned, name: 2 * planned})), node)
        if xi is not None and xi.shape is not None and len(xi.shape) == 3:
            other = xi.shape[axis]
            if isinstance(other, int) and other != size:
                out[name] = planned
    return out


#: Ops :func:`_evaluate` runs on the shape path (small int64 vectors).
_SHAPE_OPS = {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Add", "Sub",
              "Mul", "Div", "Constant", "Identity"}


def _reshaped(rw, value: ir.Value) -> tuple | None:
    """The static shape of ``value`` when shape inference could not tell it but it is a
    ``Reshape`` of a tensor of known static shape to a shape computed from ``Shape`` ops (a
    CRNN's ``[width, batch, C*H]`` sequence): the shape computation evaluated at the planned
    sizes. None otherwise."""
    node = value.producer()
    if node is None or node.op_type != "Reshape" or len(node.inputs) < 2:
        return None
    data = rw.info(node.inputs[0].name) if node.inputs[0] is not None else None
    if data is None or data.shape is None or not all(isinstance(d, int) for d in data.shape):
        return None
    target = _evaluate(rw, node.inputs[1], 32)
    if target is None or node.attributes.get("allowzero") and node.attributes["allowzero"].value:
        return None
    dims = [data.shape[i] if int(d) == 0 else int(d) for i, d in enumerate(target)]
    if dims.count(-1) == 1:
        known = int(np.prod([d for d in dims if d != -1]))
        if known == 0:
            return None
        dims[dims.index(-1)] = int(np.prod(data.shape)) // known
    return tuple(dims) if int(np.prod(dims)) == int(np.prod(data.shape)) else None


def _evaluate(rw, value: ir.Value | None, budget: int) -> np.ndarray | None:
    """The value of a small shape computation (ops in :data:`_SHAPE_OPS`, ``Shape`` of tensors
    of known static shape, constants), run node by node in onnx's reference evaluator; None
    when it depends on anything else or needs more than ``budget`` nodes."""
    if value is None:
        return None
    arr = rw.array(value)
    if arr is not None:
        return arr
    node = value.producer()
    if node is None or budget <= 0 or node.op_type not in _SHAPE_OPS or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Shape":
        info = rw.info(node.inputs[0].name)
        if info is None or info.shape is None or not all(isinstance(d, int) for d in info.shape):
            return None
        at = {k: a.value for k, a in node.attributes.items()}
        return np.asarray(info.shape[at.get("start", 0):at.get("end")], np.int64)
    feeds = {}
    for v in node.inputs:
        if v is not None:
            got = _evaluate(rw, v, budget - 1)
            if got is None:
                return None
            feeds[v.name] = got
    from onnx.reference import ReferenceEvaluator

    proto = ir.serde.serialize_node(node)
    try:
        outs = ReferenceEvaluator(proto).run(None, feeds)
    except Exception:  # noqa: BLE001 - not evaluable here: the shape stays unknown
        return None
    return np.asarray(outs[list(proto.output).index(value.name)])


def replace(rw, node: ir.Node, p: dict):
    """The replacement nodes of a recurrent op (see the module docstring)."""
    op = _kind(node)
    ins = names_of(node.inputs) + [""] * 8
    outs = names_of(node.outputs) + [""] * 3
    S, H, G, dirs, dt = p["S"], p["hidden"], _GATES[op], p["dirs"], p["dtype"]
    c = _Cell(rw, node, dt, p["clip"])
    x = ins[0]
    if p["x_shape"] is not None:  # known here only (see _reshaped): say it to shape inference
        x = c.std("Reshape", [x, c.ints("xshape", p["x_shape"])])
    if p["layout"]:
        x = c.std("Transpose", [x], perm=[1, 0, 2])  # [S, batch, input]
    init_h, init_c = ins[5], (ins[6] if op == "LSTM" else "")
    if p["layout"]:
        init_h = init_h and c.std("Transpose", [init_h], perm=[1, 0, 2])
        init_c = init_c and c.std("Transpose", [init_c], perm=[1, 0, 2])
    ys, yhs, ycs = [], [], []
    q = p["quant"]
    xq = _quantize(c, x) if q is not None else None  # once: both directions read the same X
    for d in range(dirs):
        B = np.zeros(2 * G * H, dt) if p["B"] is None else p["B"][d].astype(dt)
        wb, rb = B[:G * H], B[G * H:]
        if q is not None:  # integer products (W, R already [in, 4H]); the bias after them
            xp = _qproj(c, xq, c.const(f"W{d}q", p["W"][d].astype(np.int32) - q["Wz"][d]),
                        c.const(f"W{d}scale", q["Ws"][d]))
            rec = [(p["R"][d].astype(np.int32) - q["Rz"][d], q["Rs"][d],
                    None if p["B"] is None else wb + rb)]
        else:
            W, R = p["W"][d].astype(dt), p["R"][d].astype(dt)
            if op == "GRU" and p["lbr"]:
                x_bias, rec = wb, [(R, rb)]
            elif op == "GRU":
                x_bias, rec = wb + rb, [(R[:2 * H], None), (R[2 * H:], None)]
            else:
                x_bias, rec = wb + rb, [(R, None)]
            xp = c.gemm([x, c.const(f"W{d}T", W.T), c.const(f"B{d}", x_bias)], f"xproj{d}")
        acts = p["acts"][d * len(_DEFAULT_ACTS[op]):(d + 1) * len(_DEFAULT_ACTS[op])]
        if S is None:  # dynamic length: the input projection above, the steps in a Scan
            h, cell, ystack = _scan(c, rw, op, xp, [_state(init_h, d, x, p, c, H, dt)] +
                                    ([_state(init_c, d, x, p, c, H, dt)] if op == "LSTM" else []),
                                    rec, acts, p, d)
            ys.append(ystack)
            yhs.append(h)
            ycs.append(cell)
            continue
        if d == 0:  # the steps below exist for this length only: say which dims fix it
            rw.unrolled.update(_follows(rw, node, 1 if p["layout"] else 0, S))
        steps = c.split(xp, S, 1, axis=0)  # S x [1, batch, G*H]
        rts = _recurrent_weights(c, rec, p, d)

        h = _state(init_h, d, x, p, c, H, dt)
        cell = _state(init_c, d, x, p, c, H, dt) if op == "LSTM" else None
        peep = _peepholes(c, p, d)
        by_t: dict[int, str] = {}
        for t in (reversed(range(S)) if p["reverse"][d] else range(S)):
            h, cell = _step(c, op, steps[t], h, cell, rts, acts, peep, p)
            by_t[t] = h
        ys.append(c.std("Unsqueeze", [c.std("Concat", [by_t[t] for t in range(S)], axis=0),
                                      c.ints("axis1", [1])]))  # [S, 1, batch, H]
        yhs.append(h)
        ycs.append(cell)
    y, y_h, y_c = outs[:3]
    if y:
        full = ys[0] if dirs == 1 else c.std("Concat", ys, axis=1)  # [S, dirs, batch, H]
        if p["layout"]:
            full = c.std("Transpose", [full], perm=[2, 0, 1, 3])
        c.std("Identity", [full], [y])
    for name, finals in ((y_h, yhs), (y_c, ycs)):
        if not name:
            continue
        last = finals[0] if dirs == 1 else c.std("Concat", finals, axis=0)  # [dirs, batch, H]
        if p["layout"]:
            last = c.std("Transpose", [last], perm=[1, 0, 2])
        c.std("Identity", [last], [name])
    return c.nodes


def _state(given: str, d: int, x: str, p: dict, c: _Cell, H: int, dt: np.dtype) -> str:
    """Direction ``d``'s initial state ``[1, batch, H]``: from ``given`` (``[dirs, batch, H]``)
    or zeros (made once per replacement)."""
    if given:
        return c.std("Gather", [given, c.ints(f"dir{d}", [d])], axis=0)
    if "zeros" not in c._consts:
        batch = p["batch"]
        if isinstance(batch, int) and _follows(c.rw, c.source, 0 if p["layout"] else 1, batch):
            batch = None  # sized by a planned dim, not fixed: the state follows the input
        c._consts["zeros"] = _zeros(c, x, batch, H, dt)
    return c._consts["zeros"]


def _recurrent_weights(c: _Ops, rec: list, p: dict, d: int) -> list:
    """The constants of direction ``d``'s recurrent products ``rec`` (``[(R_k, bias_k or
    None)]``): ``[(R_k^T, bias_k)]``; the integer one (``p["quant"]``: ``[(R - r_zp as [H, 4H],
    r_scale, Wb + Rb or None)]``) as it is."""
    if p["quant"] is not None:
        return [(c.const(f"R{d}q", Rk), c.const(f"R{d}scale", sk),
                 None if bk is None else c.const(f"B{d}", bk)) for Rk, sk, bk in rec]
    return [(c.const(f"R{d}T_{k}", Rk.T), None if bk is None else c.const(f"RB{d}_{k}", bk))
            for k, (Rk, bk) in enumerate(rec)]


def _quantize(c: _Ops, a: str) -> tuple[str, str]:
    """``(a_q - a_zp as int32, a_scale)``: float32 ``a`` quantized to uint8 over its whole
    range (``DynamicQuantizeLinear``, as onnxruntime's quantized LSTM does)."""
    aq, a_scale, a_zp = c.multi("DynamicQuantizeLinear", [a], 3)
    i32 = onnx.TensorProto.INT32
    return c.std("Sub", [c.std("Cast", [aq], to=i32), c.std("Cast", [a_zp], to=i32)]), a_scale


def _qproj(c: _Ops, a, w: str, w_scale: str) -> str:
    """``a @ W`` as onnxruntime's quantized LSTM computes it: ``a`` (float32, or
    the pair of :func:`_quantize`) quantized, the int32 product of ``a_q - a_zp`` by the constant ``w``
    (int32 ``W - w_zp``, ``[K, N]``), then ``float(acc) * (a_scale * w_scale)`` (``w_scale`` a
    scalar or ``[N]``): float32 ``[..., N]``."""
    a32, a_scale = a if isinstance(a, tuple) else _quantize(c, a)
    acc = c.gemm([a32, w], "qproj")
    return c.std("Mul", [c.std("Cast", [acc], to=onnx.TensorProto.FLOAT),
                         c.std("Mul", [a_scale, w_scale])])


def _peepholes(c: _Ops, p: dict, d: int) -> list | None:
    if p["P"] is None:
        return None
    H = p["hidden"]
    return [c.const(f"P{d}_{k}", p["P"][d][k * H:(k + 1) * H].astype(p["dtype"])) for k in range(3)]


def _step(c: _Ops, op: str, xt: str, h: str, cell: str | None, rts, acts, peep, p: dict):
    """One step of ``op``: ``(H_t, C_t or None)``."""
    lbr, H = p["lbr"], p["hidden"]
    if op == "LSTM" and p["quant"] is not None:
        w, scale, bias = rts[0]
        return _lstm_step(c, xt, h, cell, lambda c, a: _qproj(c, a, w, scale), acts, peep, H,
                          p["coupled"], bias)
    if op == "LSTM":
        return _lstm_step(c, xt, h, cell, rts[0][0], acts, peep, H, p["coupled"])
    if op == "GRU":
        return _gru_step(c, xt, h, rts, acts, lbr, H), None
    return c.act(acts[0], c.std("Add", [xt, c.gemm([h, rts[0][0]], "hproj")])), None


def _scan(c: _Cell, rw, op: str, xp: str, states: list, rec, acts, p: dict, d: int):
    """The steps of direction ``d`` of a dynamic length as one ``Scan`` over the input
    projection ``xp`` ``[S, batch, G*H]``: its body runs one step (standard ops, the recurrent
    product a host ``MatMul``; bodies are not compiled), reversed for a reverse direction.
    Returns ``(H_final, C_final or None, Y_d [S, 1, batch, H])``."""
    dt = p["dtype"]
    b = _Body(rw, f"{c.base}_scan{d}", dt, p["clip"])
    elem = helper.np_dtype_to_tensor_dtype(dt)
    ins = [b.fresh("h"), b.fresh("c")][:len(states)] + [b.fresh("x")]
    xt = b.std("Unsqueeze", [ins[-1], b.ints("axis0", [0])])  # [1, batch, G*H]
    rts = _recurrent_weights(b, rec, p, d)
    h, cell = _step(b, op, xt, ins[0], ins[1] if op == "LSTM" else None, rts, acts,
                    _peepholes(b, p, d), p)
    outs = [h] + ([cell] if op == "LSTM" else [])
    outs = [b.std("Identity", [v]) for v in outs] + [b.std("Identity", [h])]
    body = helper.make_graph(b.nodes, f"{c.base}_scan{d}",
                             [helper.make_tensor_value_info(n, elem, None) for n in ins],
                             [helper.make_tensor_value_info(n, elem, None) for n in outs])
    rev = int(p["reverse"][d])
    results = c.multi("Scan", states + [xp], len(outs), body=body, num_scan_inputs=1,
                      scan_input_directions=[rev], scan_output_directions=[rev],
                      doc_string=SCAN_DOC.format(op=op, name=c.source.name or c.base, why=(
                          DYNAMIC if p["length"] is None else
                          TOO_LONG.format(length=p["length"], limit=MAX_UNROLL))))
    return results[0], (results[1] if op == "LSTM" else None), results[-1]


def _zeros(c: _Cell, x: str, batch, H: int, dt: np.dtype) -> str:
    """A zero state ``[1, batch, H]``: a constant, or built from ``x``'s shape when the batch
    is symbolic (``None``: also a batch sized only by a planned dim)."""
    if isinstance(batch, int):
        return c.const("zeros", np.zeros((1, batch, H), dt))
    b = c.std("Slice", [c.std("Shape", [x]), c.ints("b0", [1]), c.ints("b1", [2])])
    shape = c.std("Concat", [c.ints("one", [1]), b, c.ints("hid", [H])], axis=0)
    return c.std("ConstantOfShape", [shape],
                 value=helper.make_tensor("zero", helper.np_dtype_to_tensor_dtype(dt), [1], [0]))


def _lstm_step(c: _Ops, xt: str, h: str, cell: str, rt, acts, peep, H: int,
               coupled: bool = False, bias: str | None = None):
    """One LSTM step (gates i, o, f, c): returns ``(H_t, C_t)``, each ``[1, batch, H]``.
    ``rt``: the constant ``R^T``, or a function ``(c, h) -> H_{t-1} @ R^T`` (the quantized
    product); ``bias`` (a constant ``[4H]``): added to the products' sum (onnxruntime's quantized LSTM adds
    ``Wb + Rb`` there; the float route puts it in the input projection). ``coupled``
    (``input_forget = 1``): the forget gate is ``1 - i_t``, as onnxruntime computes it."""
    f, g, hh = acts
    pre = c.std("Add", [xt, rt(c, h) if callable(rt) else c.gemm([h, rt], "hproj")])
    if bias is not None:
        pre = c.std("Add", [pre, bias])
    i, o, fg, cc = c.split(pre, 4, H)
    if peep is not None:
        i = c.std("Add", [i, c.std("Mul", [peep[0], cell])])
    i, cc = c.act(f, i), c.act(g, cc)
    if coupled:
        fg = c.std("Sub", [c.once("one", np.array(1, c.dtype)), i])
    else:
        if peep is not None:
            fg = c.std("Add", [fg, c.std("Mul", [peep[2], cell])])
        fg = c.act(f, fg)
    cell = c.std("Add", [c.std("Mul", [fg, cell]), c.std("Mul", [i, cc])])
    if peep is not None:
        o = c.std("Add", [o, c.std("Mul", [peep[1], cell])])
    o = c.act(f, o)
    return c.std("Mul", [o, c.std(hh, [cell])]), cell


def _gru_step(c: _Ops, xt: str, h: str, rts, acts, lbr: int, H: int) -> str:
    """One GRU step (gates z, r, h): returns ``H_t`` ``[1, batch, H]``."""
    f, g = acts
    xz, xr, xh = c.split(xt, 3, H)
    if lbr:
        (rt, rb), = rts
        hz, hr, hh = c.split(c.gemm([h, rt, rb], "hproj"), 3, H)
        z = c.act(f, c.std("Add", [xz, hz]))
        r = c.act(f, c.std("Add", [xr, hr]))
        cand = c.act(g, c.std("Add", [xh, c.std("Mul", [r, hh])]))
    else:
        (rzr, _), (rh, _) = rts
        hz, hr = c.split(c.gemm([h, rzr], "hproj"), 2, H)
        z = c.act(f, c.std("Add", [xz, hz]))
        r = c.act(f, c.std("Add", [xr, hr]))
        cand = c.act(g, c.std("Add", [xh, c.gemm([c.std("Mul", [r, h]), rh], "hproj")]))
    # H_t = (1 - z) * cand + z * H_{t-1}
    keep = c.std("Sub", [c.once("one", np.array(1, c.dtype)), z])
    return c.std("Add", [c.std("Mul", [keep, cand]), c.std("Mul", [z, h])])


RULES = [Rule(frozenset(_GATES) | {_QLSTM}, check, replace)]
