"""The HBM-PIM command stream: ISA, CRF microkernels, host command streams and data layouts.

ISA (chips.md §3.1 [code], restated): 32-bit instructions in the 32-entry CRF of every PCU,
opcodes NOP 0, ADD 1, MUL 2, MAC 3, MAD 4, MOV 8, FILL 9, JUMP 14, EXIT 15; operand types
A_OUT 0, M_OUT 1, EVEN_BANK 2, ODD_BANK 3, GRF_A 4, GRF_B 5, SRF_M 6, SRF_A 7. The host never
fetches instructions: every DRAM column command (a *trigger*: RD or WR) to a channel in AB-PIM
mode makes each of its PCUs execute the CRF entry at its PC on the addressed column and advance.
JUMP (a zero-cycle static loop) and EXIT take no trigger.

Our bit layout (the field widths are the simulator's, the positions ours): [31:28] opcode,
[27:25] dst type, [24:22] src0 type, [21:19] src1 type, [18:16] src2 type, [15] AAM, [14] ReLU,
[11:8] dst index, [7:4] src0 index, [3:0] src1 index; JUMP: [27:11] repeat count (17 bits),
[10:0] how many instructions back (11 bits); NOP: [10:0] cycles.

AAM (address-aligned mode), our simplified reading: a GRF operand of an AAM instruction takes
its index from the triggering column address ``col``: ``col & 7`` (the "A index"), except the
accumulator GRF_B of a MAC, which takes ``(col >> 3) & 7`` (the "B index"). One MAC plus a JUMP
thus sweeps 8 rows x 8 chunks.

Kernels (all PCUs in lockstep, each over its own bank pair):

- ``GEMV`` y[M] = W[M, K] x[K] with W resident: rows in groups of 8 per PCU (GRF_B[j] holds
  row j's 16 lane partial sums), K in tiles of 128 (GRF_A[0..7] = 8 x 16 values of x, broadcast
  by the host); the even bank holds the even K tiles, the odd bank the odd ones, so x is
  rebroadcast between the two phases. Program: MAC even x64, MAC odd x64, loop over tile pairs,
  NOP, MOV GRF_B -> even bank x8, loop over row groups, EXIT. The host reads the partials back
  and reduces the 16 lanes (chips.md §3.1: "the host or GPU reduces the partial sums").
- ``ADD``/``MUL`` of two same-shape operands: per block of 8 columns and bank, FILL GRF <- A,
  op GRF <- GRF (op) B, MOV Y <- GRF; with a scalar operand, op GRF <- bank (op) SRF then MOV.
- ``RELU``: MOV GRF <- bank with the ReLU bit, MOV bank <- GRF.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

OPCODES = {"NOP": 0, "ADD": 1, "MUL": 2, "MAC": 3, "MAD": 4, "MOV": 8, "FILL": 9,
           "JUMP": 14, "EXIT": 15}
OPERANDS = {"A_OUT": 0, "M_OUT": 1, "EVEN_BANK": 2, "ODD_BANK": 3, "GRF_A": 4, "GRF_B": 5,
            "SRF_M": 6, "SRF_A": 7}
_OPNAME = {v: k for k, v in OPCODES.items()}
_OPERAND_NAME = {v: k for k, v in OPERANDS.items()}
BANKS = ("EVEN_BANK", "ODD_BANK")

#: K elements per GRF_A load: 8 registers x 16 lanes.
TILE = 128
#: Rows per group: one per GRF_B register.
GROUP = 8


@dataclass(frozen=True)
class Instr:
    """One CRF instruction (``op`` a name of :data:`OPCODES`; operand types by name or "")."""

    op: str
    dst: str = ""
    src0: str = ""
    src1: str = ""
    src2: str = ""
    aam: bool = False
    relu: bool = False
    idst: int = 0
    isrc0: int = 0
    isrc1: int = 0
    count: int = 0   # JUMP: repeats; NOP: cycles
    back: int = 0    # JUMP: instructions back

    def encode(self) -> int:
        """The 32-bit word (layout in the module docstring)."""
        w = OPCODES[self.op] << 28
        if self.op == "JUMP":
            return w | (self.count & 0x1FFFF) << 11 | (self.back & 0x7FF)
        if self.op == "NOP":
            return w | (self.count & 0x7FF)
        if self.op == "EXIT":
            return w
        for name, shift in ((self.dst, 25), (self.src0, 22), (self.src1, 19), (self.src2, 16)):
            if name:
                w |= OPERANDS[name] << shift
        return (w | int(self.aam) << 15 | int(self.relu) << 14 | (self.idst & 15) << 8
                | (self.isrc0 & 15) << 4 | (self.isrc1 & 15))

    def text(self) -> str:
        """Assembly-like text, e.g. ``MAC GRF_B[aam.B], GRF_A[aam.A], EVEN_BANK``."""
        if self.op == "JUMP":
            return f"JUMP -{self.back} x{self.count}"
        if self.op == "NOP":
            return f"NOP {self.count}"
        if self.op == "EXIT":
            return "EXIT"

        def opnd(name, idx, role):
            if name in ("GRF_A", "GRF_B"):
                if self.aam:
                    return f"{name}[aam.{'B' if (self.op == 'MAC' and role == 'dst') else 'A'}]"
                return f"{name}[{idx}]"
            if name in ("SRF_M", "SRF_A"):
                return f"{name}[{idx}]"
            return name

        ops = [opnd(self.dst, self.idst, "dst"), opnd(self.src0, self.isrc0, "src0")]
        if self.src1:
            ops.append(opnd(self.src1, self.isrc1, "src1"))
        if self.src2:
            ops.append(self.src2)
        flags = [f for f, on in (("aam", self.aam), ("relu", self.relu)) if on]
        return f"{self.op} {', '.join(ops)}" + (f"  ; {' '.join(flags)}" if flags else "")


def decode(word: int) -> Instr:
    """The :class:`Instr` of a 32-bit word. Raises ValueError on an unknown opcode or operand."""
    word = int(word)
    if not 0 <= word < 1 << 32:
        raise ValueError(f"CRF word {word} is not 32-bit")
    code = word >> 28
    if code not in _OPNAME:
        raise ValueError(f"unknown opcode {code} in CRF word 0x{word:08x}")
    op = _OPNAME[code]
    if op == "JUMP":
        return Instr("JUMP", count=(word >> 11) & 0x1FFFF, back=word & 0x7FF)
    if op == "NOP":
        return Instr("NOP", count=word & 0x7FF)
    if op == "EXIT":
        return Instr("EXIT")
    names = []
    for shift in (25, 22, 19, 16):
        names.append(_OPERAND_NAME[(word >> shift) & 7])
    n_src = {"ADD": 2, "MUL": 2, "MAC": 2, "MAD": 3, "MOV": 1, "FILL": 1}[op]
    dst, srcs = names[0], names[1:1 + n_src] + [""] * (3 - n_src)
    return Instr(op, dst, srcs[0], srcs[1], srcs[2], bool(word >> 15 & 1), bool(word >> 14 & 1),
                 (word >> 8) & 15, (word >> 4) & 15, word & 15)


# --------------------------------------------------------------------------------------------
# Plans: the geometry of one kernel and its command stream
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PimPlan:
    """Everything about one HBM-PIM kernel that the cost, the emitter and the runtime share.

    Attributes:
        op: ``GEMV``, ``ADD``, ``MUL`` or ``RELU``.
        pcus, channels: PCUs in use and their pseudo-channels (pcus / 8).
        M, K: GEMV rows and contracted length (0 for elementwise).
        runs: program runs per inference: GEMV input vectors (the batch), 1 otherwise.
        tiles: K tiles of 128 (GRF_A loads) per run, even (the two banks alternate).
        groups: row groups of 8 per PCU (GRF_B fills) per run.
        n: elements of an elementwise op (0 for GEMV).
        cols: bank columns per operand per bank (elementwise), a multiple of 8.
        scalar: which input is a scalar in the SRF (``0`` or ``1``), -1 if none.
        resident: the inputs of an elementwise op that are constants, kept in their bank
            regions across inferences (written once, at load).
        crf: the CRF program.
        stream: the host command stream of one run (see :func:`walk`).
        bank_cols: columns each bank holds for the kernel (weights/operands and results).
    """

    op: str
    pcus: int
    channels: int
    M: int = 0
    K: int = 0
    runs: int = 1
    tiles: int = 0
    groups: int = 0
    n: int = 0
    cols: int = 0
    scalar: int = -1
    resident: tuple = ()
    crf: tuple = ()
    stream: tuple = ()
    bank_cols: int = 0
    _counts: dict = field(default_factory=dict, compare=False, repr=False)

    def counts(self) -> dict:
        """Per run: ``triggers`` (column commands in AB-PIM mode, per PCU), ``bank_accesses``
        (those that read or write a bank), ``grf_writes`` (broadcast 32 B register writes per
        channel), ``lane_ops`` (FP16 lane operations per PCU)."""
        if not self._counts:
            c = {"triggers": 0, "bank_accesses": 0, "grf_writes": 0, "lane_ops": 0}
            for step, _env in walk(self.stream):
                if "write" in step:
                    c["grf_writes"] += 8
                elif "trigger" in step:
                    n = step["count"]
                    c["triggers"] += n
                    if step["trigger"] != "NOP":
                        c["bank_accesses"] += n
            c["lane_ops"] = self.lane_ops()
            self._counts.update(c)
        return dict(self._counts)

    def lane_ops(self) -> int:
        """FP16 lane operations per PCU and run (a MAC counts 2: multiply and add)."""
        if self.op == "GEMV":
            return self.groups * self.tiles * 64 * 2 * 16
        if self.op in ("ADD", "MUL"):
            return 2 * self.cols * 16
        return 0


def _aff(**terms) -> dict:
    return {k: v for k, v in terms.items() if v}


def walk(stream, env: dict | None = None):
    """Yield ``(step, loop variables)`` of a host command stream in execution order.

    A stream is a list of steps: ``{"loop": var, "count": n, "body": [...]}``;
    ``{"write": "GRF_A", "x_tile": affine}`` (broadcast 128 values of the input, tile number
    from the affine form) or ``{"write": "GRF_B", "value": "zero"}``; ``{"trigger": "RD"|"WR"|
    "NOP", "col": affine, "count": n}`` (``n`` column commands at ``col``, ``col + 1``, ...).
    An affine form is ``{"base": b, var: coefficient, ...}`` over the loop variables."""
    env = dict(env or {})
    for step in stream:
        if "loop" in step:
            for i in range(step["count"]):
                env[step["loop"]] = i
                yield from walk(step["body"], env)
            env.pop(step["loop"], None)
        else:
            yield step, env


def affine(form: dict, env: dict) -> int:
    """The value of an affine form (see :func:`walk`) under loop variables ``env``."""
    return int(form.get("base", 0)) + sum(int(c) * env[v] for v, c in form.items() if v != "base")


def _gemv_crf(tile_pairs: int, groups: int) -> list[Instr]:
    prog = [Instr("MAC", "GRF_B", "GRF_A", "EVEN_BANK", aam=True),
            Instr("JUMP", count=63, back=1),
            Instr("MAC", "GRF_B", "GRF_A", "ODD_BANK", aam=True),
            Instr("JUMP", count=63, back=1)]
    if tile_pairs > 1:
        prog.append(Instr("JUMP", count=tile_pairs - 1, back=len(prog)))
    prog += [Instr("NOP", count=1),
             Instr("MOV", "EVEN_BANK", "GRF_B", aam=True),
             Instr("JUMP", count=7, back=1)]
    if groups > 1:
        prog.append(Instr("JUMP", count=groups - 1, back=len(prog)))
    prog.append(Instr("EXIT"))
    return prog


def plan_gemv(M: int, K: int, runs: int, pcus: int, per_channel: int = 8) -> PimPlan:
    """The GEMV kernel of ``W[M, K]`` on at most ``pcus`` PCUs, run ``runs`` times per
    inference (one per input vector). It takes as few whole pseudo-channels as hold one row
    group of 8 rows per PCU (fewer PCUs idle on padding; the time is the same). Raises
    ValueError if a size is not positive."""
    if M < 1 or K < 1 or runs < 0:
        raise ValueError(f"GEMV sizes must be positive (M={M}, K={K})")
    pcus = min(pcus, per_channel * math.ceil(M / (GROUP * per_channel)))
    tiles = 2 * math.ceil(K / (2 * TILE))
    groups = math.ceil(M / (pcus * GROUP))
    pairs = tiles // 2
    out = groups * pairs * 64
    stream = [{"loop": "g", "count": groups, "body": [
        {"write": "GRF_B", "value": "zero"},
        {"loop": "s", "count": pairs, "body": [
            {"write": "GRF_A", "x_tile": _aff(s=2)},
            {"trigger": "RD", "bank": "EVEN_BANK", "col": _aff(g=64 * pairs, s=64), "count": 64},
            {"write": "GRF_A", "x_tile": _aff(base=1, s=2)},
            {"trigger": "RD", "bank": "ODD_BANK", "col": _aff(g=64 * pairs, s=64), "count": 64}]},
        {"trigger": "NOP", "col": {}, "count": 1},
        {"trigger": "WR", "bank": "EVEN_BANK", "col": _aff(base=out, g=GROUP), "count": 8}]}]
    crf = tuple(i.encode() for i in _gemv_crf(pairs, groups))
    return PimPlan("GEMV", pcus, pcus // per_channel, M=M, K=K, runs=runs, tiles=tiles,
                   groups=groups, crf=crf, stream=tuple(stream), bank_cols=out + groups * GROUP)


def _elt_crf(op: str, blocks: int, scalar: bool) -> list[Instr]:
    prog: list[Instr] = []
    for bank, reg in (("EVEN_BANK", "GRF_A"), ("ODD_BANK", "GRF_B")):
        if op == "RELU":
            prog += [Instr("MOV", reg, bank, aam=True, relu=True), Instr("JUMP", count=7, back=1)]
        elif scalar:
            srf = ("SRF_A", 8) if op == "ADD" else ("SRF_M", 0)
            prog += [Instr(op, reg, bank, srf[0], aam=True, isrc1=srf[1]),
                     Instr("JUMP", count=7, back=1)]
        else:
            prog += [Instr("FILL", reg, bank, aam=True), Instr("JUMP", count=7, back=1),
                     Instr(op, reg, reg, bank, aam=True), Instr("JUMP", count=7, back=1)]
        prog += [Instr("MOV", bank, reg, aam=True), Instr("JUMP", count=7, back=1)]
    if blocks > 1:
        prog.append(Instr("JUMP", count=blocks - 1, back=len(prog)))
    prog += [Instr("NOP", count=1), Instr("EXIT")]
    return prog


def plan_eltwise(op: str, n: int, pcus: int, scalar: int = -1, per_channel: int = 8,
                 resident: tuple = ()) -> PimPlan:
    """The elementwise kernel ``op`` (``ADD``, ``MUL``, ``RELU``) over ``n`` elements on
    ``pcus`` PCUs; ``scalar`` is the input (0 or 1) held in the SRF, -1 if none; ``resident``
    the constant inputs whose regions stay in the banks across inferences. Each bank holds
    ``cols`` columns of each operand: input A at ``[0, cols)``, input B at ``[cols, 2 cols)``
    (two-operand ops), the result after them. It takes as few whole pseudo-channels as keep
    one block of 8 columns per bank busy."""
    if n < 1:
        raise ValueError(f"elementwise size must be positive, got {n}")
    pcus = min(pcus, per_channel * math.ceil(n / (2 * 16 * 8 * per_channel)))
    cols = 8 * math.ceil(n / (pcus * 2 * 16 * 8))
    blocks = cols // 8
    two = op in ("ADD", "MUL") and scalar < 0
    out = (2 if two else 1) * cols
    body = []
    for bank in BANKS:
        if two:
            body += [{"trigger": "RD", "bank": bank, "col": _aff(k=8), "count": 8},
                     {"trigger": "RD", "bank": bank, "col": _aff(base=cols, k=8), "count": 8}]
        else:
            body.append({"trigger": "RD", "bank": bank, "col": _aff(k=8), "count": 8})
        body.append({"trigger": "WR", "bank": bank, "col": _aff(base=out, k=8), "count": 8})
    stream = [{"loop": "k", "count": blocks, "body": body},
              {"trigger": "NOP", "col": {}, "count": 1}]
    crf = tuple(i.encode() for i in _elt_crf(op, blocks, scalar >= 0))
    return PimPlan(op, pcus, pcus // per_channel, n=n, cols=cols, scalar=scalar,
                   resident=tuple(i for i in resident if i != scalar), crf=crf,
                   stream=tuple(stream), bank_cols=out + cols)


# --------------------------------------------------------------------------------------------
# Data layouts
# --------------------------------------------------------------------------------------------

def gemv_weights(plan: PimPlan, W: np.ndarray) -> np.ndarray:
    """``W[M, K]`` laid out per PCU and bank as float16 ``[pcus, 2, groups, tiles/2, 8, 8, 16]``:
    element ``[p, b, g, s, j, c, l]`` is ``W[(g * pcus + p) * 8 + j, (2 s + b) * 128 + c * 16 +
    l]`` (zero outside W); bank ``b`` of PCU ``p`` holds it at column ``(g * tiles/2 + s) * 64 +
    j * 8 + c``, lane ``l``."""
    P, G, S = plan.pcus, plan.groups, plan.tiles // 2
    Wp = np.zeros((G * P * GROUP, plan.tiles * TILE), np.float16)
    Wp[:plan.M, :plan.K] = np.asarray(W, np.float16)
    # rows: (g, p, j); cols: (s, b, c, l)
    return np.ascontiguousarray(Wp.reshape(G, P, GROUP, S, 2, 8, 16).transpose(1, 4, 0, 3, 2, 5, 6))


def gemv_rows(plan: PimPlan, partials: np.ndarray) -> np.ndarray:
    """Rows of the partial sums read back: ``[pcus, groups, 8, 16]`` -> ``[M, 16]`` (row
    ``(g * pcus + p) * 8 + j``)."""
    P, G = plan.pcus, plan.groups
    return partials.transpose(1, 0, 2, 3).reshape(G * P * GROUP, 16)[:plan.M]


def eltwise_layout(plan: PimPlan, x: np.ndarray) -> np.ndarray:
    """A flat operand of ``n`` elements as ``[pcus, 2 banks, cols, 16]`` float16: element
    ``e = ((p * 2 + b) * cols + col) * 16 + l`` (zero padded)."""
    flat = np.zeros(plan.pcus * 2 * plan.cols * 16, np.float16)
    flat[:plan.n] = np.asarray(x, np.float16).reshape(-1)
    return flat.reshape(plan.pcus, 2, plan.cols, 16)


def eltwise_unlayout(plan: PimPlan, banks: np.ndarray) -> np.ndarray:
    """The inverse of :func:`eltwise_layout`: ``[pcus, 2, cols, 16]`` -> flat ``[n]``."""
    return banks.reshape(-1)[:plan.n]
