"""``onnx-cinm report``: per-op figures of an optimized model, as text, CSV, pictures and HTML."""
from __future__ import annotations

from pathlib import Path



def _cmd_report(args) -> int:
    from .. import artifacts, frontend, report
    from ..errors import CinmError
    from .args import _check_writable_folder, written_by_optimize

    path = Path(args.model)
    out = Path(args.output) if args.output else artifacts.beside(path, ".report")
    artifacts.check_output_outside_kernels(out, "-o" if args.output else "the report folder")
    _check_writable_folder(str(out), "report")  # before reading the model, not after rendering
    model = frontend.load_model(str(path))
    if not written_by_optimize(model):
        raise CinmError(f"'{path}' was not written by 'onnx-cinm optimize' (no cinm op, no record "
                        "of optimize): report reads an optimized model; run 'onnx-cinm optimize "
                        f"{path} -o OUT.onnx' first (or optimize --report DIR)")
    opts = report.options_from_plans(model)
    if args.host_roofline:
        opts["host_roofline"] = args.host_roofline
    res = report.write_report(model, out, opts, title=path.name)
    if not args.quiet:
        print(f"onnx-cinm report: {path} -> {out}/")
        print(report.table(res["rows"], res["totals"], cinm_only=not args.all_nodes,
                           fold=not args.all_nodes))
        print(f"written: {', '.join(p.name for p in res['files'])}")
    return 0
