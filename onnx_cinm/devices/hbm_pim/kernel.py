"""The functional model of HBM-PIM: the emitted CRF program executed over the laid-out banks.

:class:`Pcus` holds the state of every PCU in use (both banks' columns, GRF_A, GRF_B, the SRF)
and executes a host command stream (:func:`~.program.walk`) against a CRF program, one
instruction per trigger, all PCUs in lockstep, as the hardware does (chips.md §3.1 [code]).
:class:`HbmPimKernel` is what the execution provider calls for a node: it reads the node's
``.pim`` file and weights sidecar, lays the inputs out, runs the stream and reads the results.

FP16 semantics (the PCU's arithmetic is FP16 [abs]; the rounding details are our assumption,
[unconfirmed]):

- inputs, weights and scalars are rounded to FP16 (round to nearest even) when written to the
  banks or registers, float32 ones included (option ``hbm_pim_accept_float32``);
- every lane operation rounds its result to FP16: ADD and MUL once; a MAC rounds the product,
  then the sum (not fused); overflow gives +-inf, subnormals are kept, NaN propagates;
- MOV with the ReLU bit writes ``max(x, 0)``;
- a GEMV accumulates each lane in FP16 in GRF_B over all K tiles (lane ``l`` of row ``m`` sums
  ``W[m, k] x[k]`` over ``k = l (mod 16)`` in increasing ``k``); the host then sums the 16 lane
  partials of a row in float32, in lane order 0..15, adds the bias (if any) in float32 and
  rounds once to the output dtype (FP16, or float32 for an accepted float32 op).

Tolerance against onnxruntime on the original model (which rounds once per output): elementwise
ops match exactly; a product of length K within ``|y - y_ref| <= rtol |y_ref| + atol`` with
``rtol = 4 x 2^-10`` (4 FP16 ulps at 1) and ``atol = 4 x 2^-10 x sqrt(K) x rms(y_ref)`` -- the
golden check's K-aware tolerance (:func:`onnx_cinm.golden.accumulation_atol`) with FP16's
epsilon. The FP16 lane accumulation's error grows like ``2^-11 x sqrt(K/16)`` times the lane
partial sums: measured on a 1024 x 1024 product of standard normal data, the largest error is
0.13-0.19 against an ``atol`` of 4.0-5.5 (outputs of RMS 32-44; 4 seeds).
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from ...errors import CinmError
from . import codegen, program
from .cost import kernel_cost
from .params import HbmPimParams
from .program import Instr, PimPlan, affine, decode, walk

_BANK = {"EVEN_BANK": 0, "ODD_BANK": 1}


class Pcus:
    """``pcus`` PCUs in lockstep: banks ``[pcus, 2, cols, 16]`` float16, GRF ``[pcus, 2, 8, 16]``
    (GRF_A, GRF_B), SRF ``[16]`` (the host broadcasts it). Counts the triggers it executes."""

    def __init__(self, pcus: int, cols: int, crf: list[int]) -> None:
        if len(crf) > 32:
            raise CinmError(f"hbm_pim: CRF program of {len(crf)} instructions (at most 32)")
        self.prog = [decode(w) for w in crf]
        self.banks = np.zeros((pcus, 2, cols, 16), np.float16)
        self.grf = np.zeros((pcus, 2, 8, 16), np.float16)
        self.srf = np.zeros(16, np.float16)
        self.pc = 0
        self.loops: dict[int, int] = {}
        self.triggers = 0

    # -- the program --------------------------------------------------------------------------
    def _next(self) -> Instr:
        """The next instruction that takes a trigger (JUMP and EXIT take none)."""
        while True:
            if not 0 <= self.pc < len(self.prog):
                raise CinmError(f"hbm_pim: program counter {self.pc} outside the CRF")
            ins = self.prog[self.pc]
            if ins.op == "JUMP":
                done = self.loops.get(self.pc, 0)
                if done < ins.count:
                    self.loops[self.pc] = done + 1
                    self.pc -= ins.back
                else:
                    self.loops[self.pc] = 0
                    self.pc += 1
                continue
            if ins.op == "EXIT":
                raise CinmError("hbm_pim: a trigger arrived after the program's EXIT")
            self.pc += 1
            return ins

    def _finish(self) -> None:
        """Run the zero-cycle tail; the program must reach EXIT (then its PC is reset)."""
        while self.pc < len(self.prog) and self.prog[self.pc].op == "JUMP":
            ins = self.prog[self.pc]
            if self.loops.get(self.pc, 0) < ins.count:
                raise CinmError("hbm_pim: the command stream ended inside a program loop")
            self.loops[self.pc] = 0
            self.pc += 1
        if self.pc >= len(self.prog) or self.prog[self.pc].op != "EXIT":
            raise CinmError("hbm_pim: the command stream ended before the program's EXIT")
        self.pc = 0

    # -- operands -----------------------------------------------------------------------------
    def _index(self, ins: Instr, role: str, col: int) -> int:
        if ins.aam:
            return (col >> 3) & 7 if (ins.op == "MAC" and role == "dst") else col & 7
        return {"dst": ins.idst, "src0": ins.isrc0, "src1": ins.isrc1}[role]

    def _read(self, ins: Instr, name: str, role: str, col: int) -> np.ndarray:
        if name in _BANK:
            return self.banks[:, _BANK[name], col]
        if name in ("GRF_A", "GRF_B"):
            return self.grf[:, 0 if name == "GRF_A" else 1, self._index(ins, role, col)]
        if name in ("SRF_M", "SRF_A"):
            return self.srf[getattr(ins, "i" + role)]
        raise CinmError(f"hbm_pim: operand {name} cannot be read by {ins.op}")

    def _write(self, ins: Instr, col: int, value: np.ndarray) -> None:
        if ins.dst in _BANK:
            self.banks[:, _BANK[ins.dst], col] = value
        elif ins.dst in ("GRF_A", "GRF_B"):
            self.grf[:, 0 if ins.dst == "GRF_A" else 1, self._index(ins, "dst", col)] = value
        else:
            raise CinmError(f"hbm_pim: {ins.op} cannot write {ins.dst}")

    def _execute(self, ins: Instr, kind: str, col: int) -> None:
        writes_bank = ins.dst in _BANK
        reads_bank = any(s in _BANK for s in (ins.src0, ins.src1, ins.src2))
        want = "NOP" if ins.op == "NOP" else ("WR" if writes_bank else "RD" if reads_bank else kind)
        if want != kind:
            raise CinmError(f"hbm_pim: a {kind} trigger met {ins.text()} (needs {want})")
        if ins.op == "NOP":
            return
        a = self._read(ins, ins.src0, "src0", col)
        if ins.op in ("MOV", "FILL"):
            v = np.maximum(a, np.float16(0)) if ins.relu else a
        else:
            b = self._read(ins, ins.src1, "src1", col)
            if ins.op == "ADD":
                v = a + b
            elif ins.op == "MUL":
                v = a * b
            elif ins.op == "MAC":  # product rounded, then the sum (not fused)
                v = self._read(ins, ins.dst, "dst", col) + a * b
            elif ins.op == "MAD":
                v = a * b + self._read(ins, ins.src2, "src2", col)
            else:
                raise CinmError(f"hbm_pim: unknown instruction {ins.op}")
        self._write(ins, col, np.asarray(v, np.float16))

    # -- the host -----------------------------------------------------------------------------
    def run(self, stream, x_tiles: np.ndarray | None = None) -> None:
        """Execute one run of ``stream``; ``x_tiles[t]`` is input tile ``t`` (``[8, 16]``
        float16) for the GRF_A broadcasts. Raises CinmError when program and stream disagree."""
        with np.errstate(over="ignore", invalid="ignore"):
            for step, env in walk(stream):
                if "write" in step:
                    reg = 0 if step["write"] == "GRF_A" else 1
                    self.grf[:, reg] = 0 if reg else x_tiles[affine(step["x_tile"], env)]
                    continue
                base = affine(step["col"], env)
                for i in range(step["count"]):
                    ins = self._next()
                    if "bank" in step and step["bank"] not in (ins.dst, ins.src0, ins.src1):
                        raise CinmError(f"hbm_pim: a trigger for {step['bank']} met {ins.text()}")
                    self._execute(ins, step["trigger"], base + i)
                    self.triggers += 1
        self._finish()


def _plan_of(doc: dict) -> PimPlan:
    """The plan a ``.pim`` document describes (program and stream from the file)."""
    g, s = doc["geometry"], doc["sizes"]
    common = dict(pcus=int(g["pcus"]), channels=int(g["channels"]),
                  crf=tuple(int(c["word"], 16) for c in doc["crf"]), stream=tuple(doc["stream"]),
                  bank_cols=int(g["bank_columns"]))
    if doc["op"] == "GEMV":
        return PimPlan("GEMV", M=int(s["M"]), K=int(s["K"]), runs=int(s["runs"]),
                       tiles=int(s["tiles"]), groups=int(s["groups"]), **common)
    return PimPlan(doc["op"], n=int(s["n"]), cols=int(s["cols"]), scalar=int(s["scalar"]),
                   resident=tuple(int(i) for i in s.get("resident_inputs", ())), **common)


class HbmPimKernel:
    """Run one node through its ``.pim`` kernel in the functional model.

    Args:
        op: the node (:class:`~onnx_cinm.devices.base.OpInfo`).
        attrs: its ``pim_*`` plan attributes (``pim_pin_gbps`` prices the runs).
        path: the ``.pim`` file (a GEMV's ``.W.npy`` beside it).
        params: the device's figures.

    Calling it with the node's inputs (numpy arrays in node order; a constant matrix is read
    from the sidecar, not from its input) returns ``(outputs, metrics)``: the result in the
    node's output dtype, and ``latency_s``, ``energy_j``, ``bytes_moved`` (HBM interface bytes
    the kernel moves), ``triggers`` (AB-PIM commands per PCU, counted) of this inference, from
    the cost model (:mod:`.cost`) at the runs actually made. ``load_metrics``: the one-time
    load of its resident constants (GEMV weights, constant elementwise operands) or None. Calls are serialized (one device).

    Raises:
        CinmError: a missing or malformed file, a file that does not match the node, or inputs
            of other shapes than planned (elementwise) or another contracted length.
    """

    def __init__(self, op, attrs: dict, path: Path, params: HbmPimParams) -> None:
        self.op, self.params = op, params
        doc = codegen.read(path)
        try:
            self.plan = _plan_of(doc)
        except (KeyError, TypeError, ValueError) as e:
            raise CinmError(f"hbm_pim: malformed kernel '{path}': {e}") from None
        self.form = doc.get("form", "")
        if self.plan.op != attrs.get("pim_op") or len(self.plan.crf) != attrs.get("pim_instructions"):
            raise CinmError(f"hbm_pim: kernel '{path}' does not match node '{op.name}' "
                            "(compile it again)")
        self.pin = float(attrs["pim_pin_gbps"]) if "pim_pin_gbps" in attrs else None
        self.out_dtype = np.dtype(op.outputs[0].dtype)
        self.weights = None
        self.load_metrics = None
        if self.plan.op == "GEMV":
            side = Path(path).with_suffix(".W.npy")
            try:
                w = np.load(side, allow_pickle=False)
            except (OSError, ValueError) as e:
                raise CinmError(f"hbm_pim: cannot read weights '{side}': {str(e).splitlines()[0]}") \
                    from None
            P, G, S = self.plan.pcus, self.plan.groups, self.plan.tiles // 2
            if w.dtype != np.float16 or w.shape != (P, 2, G, S, 8, 8, 16):
                raise CinmError(f"hbm_pim: weights '{side}' are {w.dtype}{list(w.shape)}, not "
                                f"float16{[P, 2, G, S, 8, 8, 16]}")
            self.weights = w.reshape(P, 2, G * S * 64, 16)
        c = kernel_cost(self.plan, params, self.pin)
        if c.resident_bytes:
            self.load_metrics = {"tile_writes": 0, "latency_s": c.load_s, "energy_j": c.load_j}
        self._lock = threading.Lock()

    def __call__(self, inputs: list) -> tuple[list, dict]:
        with self._lock:
            if self.plan.op == "GEMV":
                y, runs, triggers = self._gemv(inputs)
            else:
                y, runs, triggers = self._eltwise(inputs)
        c = kernel_cost(self.plan, self.params, self.pin, runs=runs)
        return [y], {"latency_s": c.latency_s, "energy_j": c.energy_j, "tile_writes": 0,
                     "bytes_moved": c.interface_bytes, "triggers": triggers,
                     "basis": "run"}  # the cost of the commands these inputs triggered

    def _machine(self) -> Pcus:
        return Pcus(self.plan.pcus, self.plan.bank_cols, list(self.plan.crf))

    def _gemv(self, inputs: list):
        plan = self.plan
        if self.form == "gemv":        # Gemv(A const, x): y = A x
            X = np.asarray(inputs[1])[None, :]
            shape = (plan.M,)
        elif self.form == "gemm_b":    # Gemm(A, B const): rows of A times B
            A = np.asarray(inputs[0])
            X = A.reshape(-1, A.shape[-1])
            shape = A.shape[:-1] + (plan.M,)
        else:                          # gemm_a: Gemm(A const, B): A times columns of B
            X = np.asarray(inputs[1]).T
            shape = (X.shape[0], plan.M)
        if X.shape[-1] != plan.K:
            raise CinmError(f"hbm_pim: node '{self.op.name}' got K = {X.shape[-1]}, its kernel "
                            f"was planned for {plan.K}")
        pcu = self._machine()
        P, G = plan.pcus, plan.groups
        pcu.banks[:, :, :self.weights.shape[2]] = self.weights
        out = G * (plan.tiles // 2) * 64
        xp = np.zeros((X.shape[0], plan.tiles * program.TILE), np.float16)
        xp[:, :plan.K] = X.astype(np.float16)
        Y = np.zeros((X.shape[0], plan.M), np.float32)
        for r in range(X.shape[0]):
            pcu.run(plan.stream, xp[r].reshape(plan.tiles, 8, 16))
            partials = pcu.banks[:, 0, out:out + G * 8].reshape(P, G, 8, 16)
            lanes = program.gemv_rows(plan, partials).astype(np.float32)
            acc = np.zeros(plan.M, np.float32)
            for lane in range(16):  # the host's reduction, in lane order
                acc += lanes[:, lane]
            Y[r] = acc
        Y = Y.reshape(shape) if self.form != "gemm_a" else Y.T
        if len(inputs) > 2 and inputs[2] is not None:
            Y = Y + np.asarray(inputs[2], np.float32)
        return np.ascontiguousarray(Y.astype(self.out_dtype)), X.shape[0], pcu.triggers

    def _eltwise(self, inputs: list):
        plan = self.plan
        arrs = [np.asarray(x) for x in inputs if x is not None]
        shape = tuple(self.op.outputs[0].shape)
        big = [a for i, a in enumerate(arrs) if i != plan.scalar]
        if any(a.size != plan.n for a in big) or (plan.scalar >= 0 and arrs[plan.scalar].size != 1):
            raise CinmError(f"hbm_pim: node '{self.op.name}' got inputs of shapes "
                            f"{[list(a.shape) for a in arrs]}; its kernel was planned for {list(shape)}")
        pcu = self._machine()
        C = plan.cols
        pcu.banks[:, :, :C] = program.eltwise_layout(plan, big[0])
        if len(big) > 1:
            pcu.banks[:, :, C:2 * C] = program.eltwise_layout(plan, big[1])
        if plan.scalar >= 0:  # beyond FP16's range the register holds +-inf, as the chip's would
            with np.errstate(over="ignore"):
                pcu.srf[8 if plan.op == "ADD" else 0] = np.float16(arrs[plan.scalar].reshape(-1)[0])
        pcu.run(plan.stream)
        res = (2 if len(big) > 1 else 1) * C
        y = program.eltwise_unlayout(plan, pcu.banks[:, :, res:res + C])
        return np.ascontiguousarray(y.reshape(shape).astype(self.out_dtype)), 1, pcu.triggers
