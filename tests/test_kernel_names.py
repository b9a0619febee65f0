"""One kernel, one name: ``optimize``'s kernel tables, ``run --profile`` and ``report`` name a
device kernel alike (the node's name, as the optimized model holds it), and where a file is
meant (``optimize -v``'s emit lines, a kernel's error) its path comes with the name.

The expected names are read from the optimized model with onnx (the nodes that carry a
``kernel`` attribute), not from the code that prints the tables."""
import re

import onnx

from onnx_cinm.cli import main

#: LeNet under the paper's rule on the paper's chip: kernels on both devices (crossbar Gemms,
#: UPMEM Im2Cols, Relus, a Gemm and the Softmax).
ARGS = ["--example", "lenet", "--placement", "heuristic", "--cim-preset", "pcm-occ"]


def _kernels(path) -> dict:
    """``{node name: (device, kernel file)}`` of the model's device kernels, by onnx."""
    out = {}
    for n in onnx.load(str(path), load_external_data=False).graph.node:
        at = {a.name: a.s.decode() for a in n.attribute if a.type == onnx.AttributeProto.STRING}
        if "kernel" in at:
            out[n.name] = (at["device"], at["kernel"])
    return out


def _cells(line: str) -> list[str]:
    return re.split(r" {2,}", line.strip())


def _table(text: str, head: str) -> list[list[str]]:
    """The body rows of the table whose header line starts with ``head`` (after indent):
    the lines between the rule under the header and the next rule, split into cells."""
    lines = text.splitlines()
    start = next(i for i, s in enumerate(lines) if s.strip().startswith(head))
    rows = []
    for s in lines[start + 2:]:
        if set(s.strip()) == {"-"}:
            break
        rows.append(_cells(s))
    return rows


def test_optimize_profile_and_report_name_kernels_alike(tmp_path, capsys):
    model = tmp_path / "lenet.onnx"
    assert main(["optimize", *ARGS, "-o", str(model), "-v"]) == 0
    opt = capsys.readouterr().out
    kernels = _kernels(model)
    devices = {d for d, _ in kernels.values()}
    assert devices == {"memristor", "upmem"}, kernels

    # optimize: one row per kernel in its device's table (-v folds nothing), and an emit line
    # per kernel with its file
    tables = {"crossbar kernel": "memristor", "UPMEM kernel": "upmem"}
    shown = {r[0]: dev for head, dev in tables.items() for r in _table(opt, head)}
    assert shown == {name: dev for name, (dev, _) in kernels.items()}
    emitted = dict(re.findall(r"emit \[\d+/\d+\] (\S+) -> (\S+)", opt))
    assert emitted == {name: f for name, (_, f) in kernels.items()}
    for f in emitted.values():
        assert (tmp_path / "lenet.cinm" / f).exists(), f

    # run --profile: the device nodes' rows, named alike
    assert main(["run", str(model), "--profile", "--all-nodes"]) == 0
    prof = capsys.readouterr().out
    rows = [r for r in _table(prof, "node ") if r[2] in devices]
    assert {r[0]: r[2] for r in rows} == {name: dev for name, (dev, _) in kernels.items()}

    # report: the layers on a device, named alike
    assert main(["report", str(model), "-o", str(tmp_path / "rep")]) == 0
    rep = capsys.readouterr().out
    rows = [r for r in _table(rep, "#") if len(r) > 5 and r[5] in devices]
    assert {r[1]: r[5] for r in rows} == {name: dev for name, (dev, _) in kernels.items()}
    csv = (tmp_path / "rep" / "layers.csv").read_text().splitlines()
    named = {line.split(",")[1] for line in csv[1:]}
    assert set(kernels) <= named


def test_a_kernel_error_names_the_node_and_its_file(tmp_path, capsys, monkeypatch):
    # a crossbar kernel program's own error names only its file (the simulator's
    # "<file>:<line>: ..."): the run says whose kernel it is, as the tables name it, in one line
    from onnx_cinm.devices.memristor.kernel import CrossbarKernel
    from onnx_cinm.sim.crossbar import XbarError

    model = tmp_path / "lenet.onnx"
    assert main(["optimize", *ARGS, "-o", str(model), "-q"]) == 0
    kernels = _kernels(model)

    def broken(self, inputs):
        raise XbarError(f"{self.prog.path}:3: a fault for the test")

    monkeypatch.setattr(CrossbarKernel, "__call__", broken)
    capsys.readouterr()
    # numpy products: every crossbar node runs its kernel (under auto a convolution timed
    # faster in onnxruntime computes conv1 from its Im2Col's input, not through __call__)
    assert main(["run", str(model), "--provider-option", "matmul=numpy"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    err = [s for s in lines if s.startswith("onnx-cinm: error: ")]
    assert len(err) == 1, lines
    first = next(n for n, (dev, _) in kernels.items() if dev == "memristor")
    rel = kernels[first][1]
    assert err[0].startswith(f"onnx-cinm: error: node '{first}' on memristor failed: "), err[0]
    assert err[0].endswith(f"lenet.cinm/{rel}:3: a fault for the test"), err[0]


def test_a_kernel_error_without_its_file_gets_it(tmp_path, capsys, monkeypatch):
    # an error that does not name the kernel's file gets it after the node's name
    from onnx_cinm.devices.memristor.kernel import CrossbarKernel
    from onnx_cinm.errors import CinmError

    model = tmp_path / "lenet.onnx"
    assert main(["optimize", *ARGS, "-o", str(model), "-q"]) == 0
    kernels = _kernels(model)

    def broken(self, inputs):
        raise CinmError("a fault for the test")

    monkeypatch.setattr(CrossbarKernel, "__call__", broken)
    capsys.readouterr()
    # numpy products: every crossbar node runs its kernel (under auto a convolution timed
    # faster in onnxruntime computes conv1 from its Im2Col's input, not through __call__)
    assert main(["run", str(model), "--provider-option", "matmul=numpy"]) == 1
    err = [s for s in capsys.readouterr().err.splitlines() if s.startswith("onnx-cinm: error: ")]
    first = next(n for n, (dev, _) in kernels.items() if dev == "memristor")
    assert err == [f"onnx-cinm: error: node '{first}' on memristor (kernel {kernels[first][1]} "
                   f"in {tmp_path / 'lenet.cinm'}) failed: a fault for the test"]


def test_an_unnamed_node_is_named_as_the_profile_names_it(tmp_path):
    # an unnamed host node the optimizer leaves as it was: report names it '<Erf #i>', i its
    # index in the written graph (read by onnx), the form run --profile gives it
    import numpy as np
    from onnx import TensorProto as T, helper as h

    from onnx_cinm import artifacts, report
    from onnx_cinm.pipeline import optimize

    x = h.make_tensor_value_info("x", T.FLOAT, [1, 64])
    y = h.make_tensor_value_info("y", T.FLOAT, [1, 64])
    w = h.make_tensor("w", T.FLOAT, [64, 64], np.linspace(-1, 1, 64 * 64, dtype=np.float32))
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["t"]), h.make_node("Erf", ["t"], ["y"])],
                     "g", [x], [y], [w])
    res = optimize(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), check=0,
                   place=[("Gemm", "memristor")])
    artifacts.save(res.model, tmp_path / "m.onnx")
    nodes = onnx.load(str(tmp_path / "m.onnx")).graph.node
    unnamed = [(i, n.op_type) for i, n in enumerate(nodes) if not n.name]
    assert unnamed and unnamed[0][1] == "Erf", [(n.name, n.op_type) for n in nodes]
    rows, _ = report.layers(onnx.load(str(tmp_path / "m.onnx")))
    assert f"<Erf #{unnamed[0][0]}>" in [r.name for r in rows]
