"""Library defects the fuzz suite has found and that are not fixed yet: each with the finding
it produces and the smallest example that shows it (plain data, as the worker runs it).

tests/test_fuzz.py does not fail on a finding listed here (it fails on every other one), and
checks that each example still shows its finding: fixing a defect makes that check fail, and
the entry is then deleted. Nothing may stay here without an issue to fix it.
"""
from _fuzz_spec import buf

F2 = buf("float32", (2,), "numpy", "unit", 1)
OPT = {"cls": "SGD", "params": [F2], "hyper": {}, "schedule": None, "accumulation_steps": 1, "prior": []}


def example(target, args, faults=(), expect=None, setup=None):
    """A description as tests/_fuzz_spec.py's Example gives it; ``args``: (name, spec, keyword)."""
    faults = [(tuple(names), kind, level, tuple(extra)) for names, kind, level, extra in faults]
    hard = any(f[2] == "hard" for f in faults)
    return {"target": target, "numeric_mode": "identical", "setup": setup, "pool": {}, "args": list(args),
            "faults": faults, "expect": expect or ("refuse" if hard else "either" if faults else "accept"),
            "blame": sorted({n for f in faults for n in f[0]})}


MODE = ("numeric_mode", ("lit", "identical"), True)

# (what is wrong, target (targets: "a|b"), finding category, a regex its text matches, the example that shows it)
KNOWN = [
    # Emptied 2026-12-03: the five entries here (step_accumulated's wrong microbatch count and
    # mismatched microbatch tensors, embedding backward's grad named as the C library's dweight,
    # accumulate's parts[k], cross_entropy over (N, C, 0) logits) are fixed; the long fuzz run's
    # record at that commit is bench/results/fuzz.md's.
]


def known(desc, verdict):
    """The KNOWN entry a finding is an instance of, or None."""
    import re
    category, text = verdict["finding"]
    for entry in KNOWN:
        if desc["target"] in entry[1].split("|") and entry[2] == category and re.search(entry[3], text):
            return entry
    return None
