"""The crossbar schedule of one matrix product: tiles, loop order, writes, MVMs and their cost.

Setting (field notes ``crossbar.md`` §1.2 and §3): ``Y[g] = A[g] @ W[g] (+ C)`` for ``g`` in
``range(groups)``, ``A[g]`` is ``M x K`` (the activations; each of its ``M`` rows is one input
vector), ``W[g]`` is ``K x N`` (the constant operand, programmed into crossbars: K along the
rows / word lines, N along the columns, as in OCC). A Gemv ``y = A x`` with a constant ``A[M, K]``
is the case ``M=1, K=K, N=M`` with ``W = A^T`` (OCC turns GEMV into GEVM by transposition).

Tiles. ``W[g]`` is cut into ``Kt = ceil(K / rows)`` by ``Nt = ceil(N / cols)`` tiles; the last
row/column of tiles is partial (its unused cells are never programmed and hold 0). ``T = groups *
Kt * Nt`` tiles in all, enumerated in the order of the loops ``(g, k, n)``, ``n`` fastest.

Counting units.
- One **tile write** programs one tile into one crossbar (OCC counts writes this way, §1.4).
  Its cell writes are the cells the tile uses: ``rows_used * cols_used``.
- One **MVM** streams one input vector (one row of ``A``) through one programmed tile; it gives
  ``cols_used`` outputs, each one **ADC conversion**. ``MVMs = groups * M * Kt * Nt`` in every
  order: the loop order moves writes, not compute (§3).

Loop orders.
- ``weight_stationary`` (OCC ``-cim-min-writes``; loops ``(k, n, m)``, ``m`` innermost): every
  tile is programmed, then all ``M`` rows stream through it. Tile ``j`` (in the order above) goes
  to crossbar ``j mod P``; ``P`` consecutive tiles form a *round* that runs in parallel on the
  ``P`` crossbars and ends with a barrier. Residency: a tile still programmed in its crossbar is
  never rewritten, within an inference or across inferences.

  * Fits (``T <= P``): every tile is programmed **once, at load** (when the model is loaded,
    before the first inference): ``writes_load = T``, ``writes_per_inference = 0``.
  * Capacity-limited (``T > P``): the load programs the first ``P`` tiles; every inference runs
    the rounds forward, the next one backward ("serpentine"), so the ``P`` tiles left in the
    crossbars by one inference are the first ``P`` the next one needs:
    ``writes_load = P``, ``writes_per_inference = T - P``. That is the lower bound: an inference
    uses all ``T`` tiles and at most ``P`` can be resident when it starts; and
    ``writes_load + writes_per_inference = T`` is the bound for a cold start.
- ``shared`` (weight-stationary, one kernel of a model whose kernels share the device's
  crossbars; see :mod:`onnx_cinm.paradigms.cim.residency`): the other kernels evict this one's tiles
  between inferences, so all ``T`` tiles are written every inference, in ``ceil(T / P)``
  rounds, and none at load.
- ``naive`` (OCC's default order ``(m, n, k)``, ``k`` innermost; CINM's current lowering, which
  writes B before every product): for every row block of ``m_block`` rows of ``A`` (``Mt =
  ceil(M / m_block)`` blocks) and every ``(n, k)``, the tile is written, then the block streams
  through it. No residency, no load: ``writes_per_inference = groups * Mt * Nt * Kt``. The
  ``P`` crossbars take ``P`` consecutive ``k`` tiles per round (OCC unrolls K by P).
  ``m_block = 1`` (default) streams one vector per write, the crossbar's native GEVM as CINM
  emits it; ``m_block = rows`` is OCC's tiling of M by the tile size, and reproduces the worked
  example of §3: ``M = N = K = 256``, 64 x 64 tiles, ``P = 1``: naive 4*4*4 = 64 writes,
  weight-stationary 4*4 = 16. The write reduction is ``Mt``.

Cost (:meth:`CrossbarPlan.cost`), figures from the chip's
:class:`~onnx_cinm.paradigms.cim.CrossbarArray` (e.g. the memristor device's ``CrossbarParams``,
OCC, §1.4):
- latency: each round takes ``write_latency`` if any of its tiles is written (crossbars are
  programmed in parallel, one write driver per crossbar) plus ``rows_in_round * mvm_latency``
  (the rows stream through the round's crossbars in parallel). OCC's sheet, with one crossbar:
  ``writes * 2.5 us + reads * 1 us``; ours reduces to exactly that for ``P = 1``.
- energy: ``writes * write_energy + MVMs * mvm_energy + ADC conversions * adc_energy +
  DAC drives * dac_energy + busy_cycles * periphery_energy_per_cycle``, where busy cycles are
  the summed busy time of all crossbars (``writes * write_latency + MVMs * mvm_latency``) times
  the clock: OCC charges 2.1 nJ per CIM cycle; parallel crossbars each keep their periphery
  busy, so ``P`` does not change the energy. DAC drives: ``groups * M * K * Nt`` (each input
  element drives its row of each column tile once).
- breakdown (``Cost.parts``, summing to the totals): ``array`` = tile writes and the analog
  MVMs (energy ``writes * write_energy + MVMs * mvm_energy``; latency the write rounds plus the
  MVM time not spent converting); ``adc_dac`` = the conversions (energy ``ADC conversions *
  adc_energy + DAC drives * dac_energy``; latency the MVM time times
  :func:`conversion_share`); ``periphery`` = the periphery energy per busy cycle (no time of its
  own: the digital post-processing overlaps the conversions). Area per term: the crossbars the
  kernel occupies (``min(P, T)``: its own tiles when resident, else the crossbars it streams
  through) times the chip's ``cell_area_mm2``, ``adc_dac_area_mm2`` and
  ``periphery_area_mm2`` per array. A chip whose published MVM figure already includes its
  converters and periphery (HERMES's TOPS/W) shows them under ``array``.
- bytes moved: ``itemsize * (inputs + outputs + cells written)`` with inputs ``groups * M * K *
  Nt`` (each row k-slice goes to each of the ``Nt`` column tiles), outputs ``groups * M * N * Kt``
  (one partial sum per k tile, merged on the accumulator side).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...graph import Cost, CostPart
from . import CrossbarArray
from .layout import ProductView

LOOP_ORDERS = {"weight_stationary": "weight_stationary", "knm": "weight_stationary",
               "naive": "naive", "mnk": "naive"}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class CrossbarPlan:
    """The schedule of one product ``[groups] x (M x K) @ (K x N)`` on ``P`` crossbars.

    All counts are exact integers. ``*_load`` happen once when the model is loaded,
    ``*_per_inference`` every inference (steady state; for the weight-stationary order the first
    inference after the load costs the same as every later one).

    Attributes:
        M, K, N, groups: the problem (``M`` rows stream; ``K x N`` is programmed).
        rows, cols, crossbars: geometry (``crossbars`` is ``P``).
        loop_order: ``"weight_stationary"`` or ``"naive"``.
        m_block: rows per block in the naive order (1 for weight-stationary, unused).
        Kt, Nt, Mt: tile counts (``Mt = ceil(M / m_block)``, 1 for weight-stationary).
        tiles: ``T = groups * Kt * Nt``.
        resident: True if all tiles fit (``T <= P``) and stay programmed.
        writes_load, writes_per_inference: tile writes.
        cell_writes_load, cell_writes_per_inference: cells programmed (used cells only; for the
            capacity-limited weight-stationary order, inferences alternate direction and the
            figure is the mean of a backward and a forward inference, rounded down).
        mvms, adc_conversions: per inference.
        shared: the ``P`` crossbars are shared with other kernels of the model, which evict
            this kernel's tiles between inferences: every tile is written every inference,
            nothing at load (see :func:`plan`, ``shared=True``).
        rounds: barrier-delimited rounds per inference.
        write_rounds: rounds per inference in which at least one tile is written.
        first: the crossbar (of ``P``) a shared plan's first tile goes to; tile ``j`` goes to
            ``(first + j) mod P``, so kernels streaming through one pool continue its
            round-robin where the kernel before them stopped (0 for any other plan).
        round_rows: rows streamed per round (``M``, or ``m_block`` for naive).
        itemsize: bytes per element (4 for fp32).
    """

    M: int
    K: int
    N: int
    groups: int
    rows: int
    cols: int
    crossbars: int
    loop_order: str
    m_block: int
    Kt: int
    Nt: int
    Mt: int
    tiles: int
    resident: bool
    writes_load: int
    writes_per_inference: int
    cell_writes_load: int
    cell_writes_per_inference: int
    mvms: int
    adc_conversions: int
    rounds: int
    write_rounds: int
    itemsize: int = 4
    shared: bool = False
    first: int = 0

    @property
    def writes_lower_bound(self) -> int:
        """The fewest tile writes any schedule on ``P`` crossbars needs per steady inference
        (``T`` when the crossbars are shared: the other kernels evict every tile)."""
        return self.tiles if self.shared else max(0, self.tiles - self.crossbars)

    @property
    def writes_cold(self) -> int:
        """Tile writes of loading the model and running one inference."""
        return self.writes_load + self.writes_per_inference

    @property
    def dac_drives(self) -> int:
        """DAC drives per inference: every MVM drives the used rows of its tile, so each
        element of ``A`` is driven once per column tile: ``groups * M * K * Nt`` (one drive per
        input element, as one conversion per output column: bit-serial input cycles and weight
        slices are not multiplied in)."""
        return self.groups * self.M * self.K * self.Nt

    @property
    def bytes_moved(self) -> int:
        """Bytes in and out per inference (see the module docstring)."""
        g = self.groups
        return self.itemsize * (g * self.M * self.K * self.Nt + g * self.M * self.N * self.Kt
                                + self.cell_writes_per_inference)

    def cost(self, params, *, load: bool = False) -> Cost:
        """Modeled cost of one inference (``load=True``: of programming at load instead).

        ``params`` is a :class:`~onnx_cinm.paradigms.cim.CrossbarArray` (latencies in seconds,
        energies in joules).
        """
        if load:
            writes, cells, mvms, adc = self.writes_load, self.cell_writes_load, 0, 0
            latency = (params.write_latency_s * _ceil(self.writes_load, self.crossbars)
                       if self.writes_load else 0.0)
        else:
            writes, cells = self.writes_per_inference, self.cell_writes_per_inference
            mvms, adc = self.mvms, self.adc_conversions
            if self.loop_order == "naive":
                # per (g, n) and k round: Mt writes rounds and M streamed rows
                kr = _ceil(self.Kt, self.crossbars)
                latency = self.groups * self.Nt * kr * (
                    self.Mt * params.write_latency_s + self.M * params.mvm_latency_s)
            else:
                latency = (self.write_rounds * params.write_latency_s
                           + self.rounds * self.M * params.mvm_latency_s)
        dac = 0 if load else self.dac_drives
        busy = writes * params.write_latency_s + mvms * params.mvm_latency_s
        e_array = writes * params.write_energy_j + mvms * params.mvm_energy_j
        e_conv = adc * params.adc_energy_j + dac * params.dac_energy_j
        e_peri = busy * params.clock_hz * params.periphery_energy_per_cycle_j
        # the MVM share of the latency, and the conversions' share of one MVM
        if load:
            t_mvm = 0.0
        elif self.loop_order == "naive":
            t_mvm = self.groups * self.Nt * _ceil(self.Kt, self.crossbars) * self.M * params.mvm_latency_s
        else:
            t_mvm = self.rounds * self.M * params.mvm_latency_s
        t_conv = t_mvm * conversion_share(params)
        used = min(self.crossbars, self.tiles)  # a resident kernel's own, or the pool
        area = [used * a for a in (params.cell_area_mm2, params.adc_dac_area_mm2,
                                             params.periphery_area_mm2)]
        holder = getattr(params, "folded_into", "array")  # (optional: see CrossbarArray)
        into = lambda term: holder if term in params.folded else ""  # noqa: E731
        parts = (CostPart("array", latency - t_conv, e_array, area[0]),
                 CostPart("adc_dac", t_conv, e_conv, area[1], into("adc_dac")),
                 CostPart("periphery", 0.0, e_peri, area[2], into("periphery")))
        moved = self.itemsize * cells if load else self.bytes_moved
        return Cost(latency_s=latency, energy_j=e_array + e_conv + e_peri, writes=writes,
                    bytes_moved=moved, parts=parts)


def conversion_share(params) -> float:
    """The fraction of one MVM's latency spent converting: the ADC time of one MVM, ``ceil(cols
    / adcs_per_array)`` conversions of ``adc_latency_s`` one after another on each ADC, at most
    the whole MVM; 0 when the chip publishes no conversion time (``adc_latency_s`` or
    ``adcs_per_array`` 0) or folds it into the MVM figure."""
    if not (params.adc_latency_s and params.adcs_per_array and params.mvm_latency_s):
        return 0.0
    t = params.adc_latency_s * _ceil(params.cols, params.adcs_per_array)
    return min(1.0, t / params.mvm_latency_s)


def tile_extent(index: int, size: int, full: int) -> int:
    """Used length of tile ``index`` along a dimension of ``size`` cut into ``full``-long tiles."""
    return min(full, size - index * full)


def tile_cells(K: int, N: int, rows: int, cols: int) -> list[int]:
    """Used cells of every tile of one ``K x N`` matrix, in ``(k, n)`` order, ``n`` fastest."""
    Kt, Nt = _ceil(K, rows), _ceil(N, cols)
    return [tile_extent(k, K, rows) * tile_extent(n, N, cols) for k in range(Kt) for n in range(Nt)]


def cells_prefix(count: int, K: int, N: int, rows: int, cols: int) -> int:
    """Used cells of the first ``count`` tiles of ``groups`` stacked ``K x N`` matrices in
    schedule order ``(g, k, n)``, ``n`` fastest: ``sum(tile_cells(K, N, rows, cols) * groups)
    [:count]`` in closed form (O(1), not a Python entry per tile).

    Whole groups hold ``K * N`` cells; within a group, ``kr`` whole tile rows hold
    ``min(kr * rows, K) * N`` cells, and the next ``rn`` tiles of tile row ``kr`` hold
    ``extent(kr) * min(rn * cols, N)``.
    """
    Kt, Nt = _ceil(K, rows), _ceil(N, cols)
    per_group = Kt * Nt
    whole, r = divmod(max(count, 0), per_group)
    kr, rn = divmod(r, Nt)
    part = min(kr * rows, K) * N
    if rn:
        part += tile_extent(kr, K, rows) * min(rn * cols, N)
    return whole * K * N + part


def plan(M: int, K: int, N: int, params: CrossbarArray, loop_order: str = "weight_stationary", *,
         groups: int = 1, m_block: int = 1, crossbars: int | None = None,
         itemsize: int = 4, shared: bool = False, first: int = 0) -> CrossbarPlan:
    """Plan ``[groups] x (M x K) @ (K x N)`` on the crossbars of ``params``.

    Args:
        M: rows of A streamed per group (batch dims of A folded in), >= 1.
        K, N: the programmed matrix is ``K x N`` per group, >= 1.
        params: the chip, a :class:`~onnx_cinm.paradigms.cim.CrossbarArray` (rows, cols,
            crossbars are read here).
        loop_order: ``"weight_stationary"`` (alias ``"knm"``) or ``"naive"`` (alias ``"mnk"``).
        groups: independent weight matrices (grouped convolutions), >= 1.
        m_block: rows of A per write in the naive order (1: one vector per write, as CINM;
            ``params.rows``: OCC's M tiling).
        crossbars: overrides ``params.crossbars`` (``P``).
        itemsize: bytes per element, for ``bytes_moved``.
        shared: the crossbars are shared with other kernels (weight-stationary only): the tiles
            are written every inference in ``ceil(T / P)`` rounds, none stays resident, nothing
            is programmed at load: ``writes_per_inference = T``.
        first: with ``shared``, the crossbar its first tile goes to (taken modulo ``P``;
            :attr:`CrossbarPlan.first`); ignored otherwise.

    Returns:
        A :class:`CrossbarPlan`; see the module docstring for every formula.

    Raises:
        ValueError: on a non-positive size or an unknown loop order.
    """
    if loop_order not in LOOP_ORDERS:
        raise ValueError(f"unknown loop order {loop_order!r} (known: {', '.join(LOOP_ORDERS)})")
    order = LOOP_ORDERS[loop_order]
    P = params.crossbars if crossbars is None else crossbars
    for name, v in (("M", M), ("K", K), ("N", N), ("groups", groups), ("m_block", m_block),
                    ("crossbars", P), ("rows", params.rows), ("cols", params.cols)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    R, C = params.rows, params.cols
    Kt, Nt = _ceil(K, R), _ceil(N, C)
    T = groups * Kt * Nt
    total = groups * K * N  # used cells of all tiles (each weight in exactly one tile)
    mvms = groups * M * Kt * Nt
    adc = groups * M * Kt * N  # every MVM converts the used columns of its tile
    if order == "naive":
        Mt = _ceil(M, m_block)
        writes = groups * Mt * Nt * Kt
        kr = _ceil(Kt, P)
        return CrossbarPlan(M, K, N, groups, R, C, P, order, m_block, Kt, Nt, Mt, T, False,
                            0, writes, 0, Mt * groups * K * N, mvms, adc,
                            rounds=groups * Mt * Nt * kr, write_rounds=groups * Mt * Nt * kr,
                            itemsize=itemsize)
    rounds = _ceil(T, P)
    if shared:
        return CrossbarPlan(M, K, N, groups, R, C, P, order, 1, Kt, Nt, 1, T, False,
                            0, T, 0, total, mvms, adc, rounds=rounds, write_rounds=rounds,
                            itemsize=itemsize, shared=True, first=int(first) % P)
    if T <= P:
        return CrossbarPlan(M, K, N, groups, R, C, P, order, 1, Kt, Nt, 1, T, True,
                            T, 0, total, 0, mvms, adc, rounds=rounds, write_rounds=0,
                            itemsize=itemsize)
    # serpentine: a backward inference finds the last P tiles resident, a forward one the first P
    first = cells_prefix(P, K, N, R, C)
    last = total - cells_prefix(T - P, K, N, R, C)
    backward, forward = total - last, total - first
    return CrossbarPlan(M, K, N, groups, R, C, P, order, 1, Kt, Nt, 1, T, False,
                        P, T - P, first, (backward + forward) // 2, mvms, adc,
                        rounds=rounds, write_rounds=rounds - 1, itemsize=itemsize)


def plan_product(v: ProductView, params: CrossbarArray, loop_order: str, *,
                 crossbars: int | None = None, shared: bool = False,
                 first: int = 0) -> CrossbarPlan:
    """:func:`plan` of the product a :class:`~.layout.ProductView` describes: ``v.rows`` streamed
    rows (at least 1: a product with an empty batch still has its tiles), ``v.K x v.N``
    programmed per group, ``v.G`` groups (at least 1). Arguments as in :func:`plan`."""
    return plan(max(v.rows, 1), v.K, v.N, params, loop_order, groups=max(v.G, 1),
                crossbars=crossbars, shared=shared, first=first)
