"""The sizes a user gives a model's dimensions.

Input shapes baked in (:func:`overwrite_input_shapes`, from ``--overwrite-input-shape``
specs parsed by :func:`parse_shape_spec`), and the sizes of symbolic dimensions a model is
planned for (``optimize --dim``): recorded in the model (:func:`planned_dims`,
:func:`set_planned_dims`) so every later step sizes it the same way, and bound into a graph's
declared types (:func:`bind_dims`).
"""
from __future__ import annotations

import json

import onnx

from .errors import CinmError


def overwrite_input_shapes(
    model: onnx.ModelProto, shapes: dict[str, list[int]]
) -> onnx.ModelProto:
    """Bake static dimensions into graph inputs (onnxsim's ``--overwrite-input-shape``).

    The intermediate value_info is dropped and the output dimensions are made unknown (their
    rank is kept), since both may have been computed from the old input shapes; run
    :func:`onnx_cinm.frontend.infer_shapes` afterwards to refill them.

    Parameters
    ----------
    model : onnx.ModelProto
        Updated in place.
    shapes : dict of str to list of int
        Input name -> new dimensions (all positive), e.g. ``{"x": [1, 3, 224, 224]}``.

    Returns
    -------
    onnx.ModelProto
        ``model``.

    Raises
    ------
    CinmError
        A name is not a graph input (initializers are not inputs here), a rank differs from the
        input's declared rank, or a dimension is not positive.
    """
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = {value.name: value for value in model.graph.input if value.name not in initializers}
    for name, dims in shapes.items():
        if name not in inputs:
            raise CinmError(
                f"--overwrite-input-shape: the model has no input '{name}' "
                f"(inputs: {', '.join(inputs) or 'none'})"
            )
        tensor_type = inputs[name].type.tensor_type
        if tensor_type.HasField("shape") and len(tensor_type.shape.dim) != len(dims):
            raise CinmError(
                f"--overwrite-input-shape: input '{name}' has rank {len(tensor_type.shape.dim)}, "
                f"got {len(dims)} dimensions"
            )
        if any(int(d) <= 0 for d in dims):
            raise CinmError(f"--overwrite-input-shape: dimensions of '{name}' must be positive")
        tensor_type.shape.Clear()
        for d in dims:
            tensor_type.shape.dim.add().dim_value = int(d)
    del model.graph.value_info[:]
    for output in model.graph.output:
        for dim in output.type.tensor_type.shape.dim:
            dim.Clear()
    return model


def parse_shape_spec(text: str) -> tuple[str, list[int]]:
    """Parse a CLI shape spec ``name:d0,d1,...`` (e.g. ``data_0:1,3,224,224``).

    The name is everything before the *last* colon, so names such as ``input:0`` work.

    Parameters
    ----------
    text : str
        The spec.

    Returns
    -------
    name : str
    dims : list of int

    Raises
    ------
    CinmError
        No colon, an empty name or an empty/non-integer/non-positive dimension.
    """
    name, colon, dims_text = text.rpartition(":")
    if not colon or not name:
        raise CinmError(f"bad shape spec '{text}': expected name:d0,d1,... e.g. x:1,3,224,224")
    try:
        dims = [int(part) for part in dims_text.split(",")]
    except ValueError:
        raise CinmError(f"bad shape spec '{text}': dimensions must be integers") from None
    if any(d <= 0 for d in dims):
        raise CinmError(f"bad shape spec '{text}': dimensions must be positive")
    return name, dims


#: ``metadata_props`` key of the sizes of symbolic dimensions a model was planned for: a JSON
#: object ``{"name": size}``. ``optimize --dim`` writes it; planning, FLOPs, ``run`` and
#: ``compare`` read it, so a model is sized the same way at every step.
PLANNED_DIMS_KEY = "onnx_cinm.planned_dims"

#: Largest size accepted for one symbolic dimension (a size is a tensor extent: int32 range).
_MAX_DIM = 2**31 - 1


def planned_dims(model: onnx.ModelProto) -> dict[str, int]:
    """The symbolic-dimension sizes recorded in ``model`` (see :data:`PLANNED_DIMS_KEY`).

    Returns:
        ``{dim name: size}``; empty if the model records none.

    Raises:
        CinmError: the record is not a JSON object of names to positive integers (a model file
            is untrusted input).
    """
    text = next((p.value for p in model.metadata_props if p.key == PLANNED_DIMS_KEY), None)
    if text is None:
        return {}
    try:
        dims = json.loads(text)
    except ValueError:
        dims = None
    if not isinstance(dims, dict) or not all(
            isinstance(k, str) and k and type(v) is int and 1 <= v <= _MAX_DIM for k, v in dims.items()):
        raise CinmError(f"the model's metadata '{PLANNED_DIMS_KEY}' is malformed: expected a JSON "
                        "object of dimension names to positive integers")
    return dims


def set_planned_dims(model: onnx.ModelProto, dims: dict[str, int]) -> None:
    """Record ``dims`` (``{dim name: size}``) as the sizes ``model`` is planned for, replacing any
    earlier record; an empty ``dims`` removes it. ``model`` is changed in place."""
    keep = [p for p in model.metadata_props if p.key != PLANNED_DIMS_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    if dims:
        model.metadata_props.add(key=PLANNED_DIMS_KEY, value=json.dumps(dict(sorted(dims.items()))))


def bind_dims(graph: onnx.GraphProto, dims: dict[str, int]) -> None:
    """Replace every symbolic dimension named in ``dims`` by its size, in the declared types of
    ``graph``'s inputs, outputs and value_info (in place; subgraphs are left alone)."""
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
            continue
        for d in value.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in dims:
                d.dim_value = dims[d.dim_param]
