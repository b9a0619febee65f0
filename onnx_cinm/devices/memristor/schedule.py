"""The crossbar schedule of the memristor device: the cim paradigm's, re-exported.

Tiling, loop orders and write/MVM counting live at the paradigm level,
:mod:`onnx_cinm.paradigms.cim.schedule` (any crossbar chip uses them); this name stays so that
code written against the device keeps importing it. New code imports the paradigm.
"""
from ...paradigms.cim.schedule import (LOOP_ORDERS, CrossbarPlan, cells_prefix, plan,  # noqa: F401
                                       plan_product, tile_cells, tile_extent)
