"""``onnx-cinm devices``: every registered device, its parameters with sources, options and run
modes."""
from __future__ import annotations


from ..text import Column, table


def _attribute_docs(cls) -> dict[str, str]:
    """``{field: description}`` from the ``Attributes:`` section of a dataclass docstring
    (``name[, name2]: text`` lines, indented continuation lines joined). Fields described
    together get the text once, on the first of them; the others refer to it."""
    import inspect
    import re

    doc = inspect.getdoc(cls) or ""
    _, sep, section = doc.partition("Attributes:\n")
    out: dict[str, str] = {}
    names: list[str] = []
    for line in section.splitlines() if sep else []:
        m = re.match(r"    ([A-Za-z_][\w, ]*):\s*(.*)", line)
        if m and not line.startswith("     "):
            names = [n.strip() for n in m.group(1).split(",")]
            for n in names:
                out[n] = m.group(2)
        elif line.startswith("        ") and names:
            for n in names:
                out[n] += " " + line.strip()
        elif line.strip() and not line.startswith(" "):
            break  # the next section
        if m and len(names) > 1:
            for n in names[1:]:
                out[n] = f"see {names[0]}"
            names = names[:1]
    return out


def _cmd_devices(args) -> int:
    from dataclasses import fields

    from ..devices import all_devices

    for dev in all_devices():
        print(f"{dev.name} ({dev.paradigm})")
        docs = _attribute_docs(type(dev.params))
        rows = [(f"{f.name} = {getattr(dev.params, f.name)}", docs.get(f.name, ""))
                for f in fields(dev.params) if f.repr]  # not repr: sources, with the presets
        if rows:
            print(table((Column("parameter", fit=42), "meaning"), rows, header=False, indent="  "))
        _print_options(dev)
        for line in dev.catalog():
            print(f"  {line}")
    return 0


def _print_options(dev) -> None:
    """``onnx-cinm devices``: the device's options from its declaration (key, what it takes with
    its unit, default, help) and its run modes."""
    from ..options import help_text

    opts = dev.option_specs()
    if opts:
        section = next(iter(opts.values())).section
        print(f"  options (flags --{dev.option_prefix.replace('_', '-')}-*, --config table [{section}], sweep keys "
              f"{section}.*):")
        width = max(len(k) for k in opts)
        for key, spec in opts.items():
            print(f"    {key:{width}s}  {help_text(spec)}")
    if len(dev.modes) > 1:
        print(f"  run modes (--provider-option {dev.name}_mode=...): {', '.join(dev.modes)} "
              f"(default {dev.modes[0]})")
    run = dev.run_option_specs()
    if run:
        print("  run options (--provider-option KEY=VALUE of run, compare and evaluate; unset: "
              "as compiled):")
        width = max(len(k) for k in run)
        for key, spec in run.items():
            print(f"    {key:{width}s}  {help_text(spec)}")
