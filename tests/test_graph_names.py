"""Fresh names (passes/graph_names.Names) against their definition."""


def test_fresh_names_are_the_first_free_suffix_after_reserves():
    """Names.fresh remembers where each base's free suffixes start (an unrolled recurrence asks
    one base thousands of times); what it hands out must stay the first of base, base_1, ...
    not taken, also after reserve() and with names of another base that look like suffixes."""
    import random

    from onnx import helper as h

    from onnx_cinm.passes.graph_names import Names

    g = h.make_graph([h.make_node("Relu", ["x"], ["a_2"], name="a"),
                      h.make_node("Relu", ["a_2"], ["a_1_1"], name="b_3")], "g", [], [])
    names, taken = Names(g), {"x", "a_2", "a_1_1", "a", "b_3"}
    rng = random.Random(0)

    def first_free(base):  # the definition, probed from the start every time
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        return name

    for _ in range(300):
        if rng.random() < 0.2:
            extra = f"{rng.choice('ab')}_{rng.randrange(12)}"
            names.reserve([extra])
            taken.add(extra)
            continue
        base = rng.choice(["a", "b", "a_1", "c"])
        want = first_free(base)
        assert names.fresh(base) == want
        taken.add(want)
