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
    ("optim.py: step_accumulated's refusal of a wrong microbatch count does not name microbatch_grads",
     "SGD.step_accumulated|Adam.step_accumulated|AdamW.step_accumulated", "unclear error",
     r"microbatch gradients for accumulation_steps",
     example("SGD.step_accumulated", [("microbatch_grads", ("list", [("list", [F2]), ("list", [F2])]), False),
                                      ("tokens", ("lit", None), False)],
             [(("microbatch_grads",), "two microbatches for accumulation_steps=1", "hard", ())], setup=OPT)),
    ("optim.py: step_accumulated refuses microbatch gradients that do not match params (count, shapes) only in "
     "the step after combining them, as 'mojo_train.<Opt>.step: grads ...' (another entry point, another "
     "argument)", "SGD.step_accumulated|Adam.step_accumulated|AdamW.step_accumulated", "unclear error",
     r"\.step: grads",
     example("SGD.step_accumulated", [("microbatch_grads", ("list", [("list", [F2, F2])]), False),
                                      ("tokens", ("lit", None), False)],
             [(("microbatch_grads",), "a microbatch of 2 tensors for 1 parameter", "hard", ())], setup=OPT)),
    ("embedding backward: NaN or inf in grad= is refused naming the C argument 'dweight (the gradient "
     "accumulated into)', not grad", "embedding_backward|Embedding.backward", "unclear error", r"dweight \(the gradient",
     example("embedding_backward", [("dy", buf("float32", (1, 2), "numpy", "unit", 1), False),
                                    ("ids", ("lit", [0]), False), ("vocab", ("lit", 1), False),
                                    ("grad", buf("float32", (1, 2), "numpy", "unit", 2, ((0, "nan"),)), True), MODE],
             [(("grad",), "grad holds NaN", "hard", ())])),
    ("accumulate.py: NaN in a microbatch is refused naming the C argument parts[1], not microbatch_grads "
     "(tests/test_accumulate.py asserts 'parts[1]' too); inside step_accumulated the refusal also names "
     "accumulate_grads, not the step", "accumulate_grads|SGD.step_accumulated|Adam.step_accumulated|"
     "AdamW.step_accumulated", "unclear error", r"parts\[",
     example("accumulate_grads", [("microbatch_grads", ("list", [("list", [F2]), ("list", [
         buf("float32", (2,), "numpy", "unit", 1, ((0, "nan"),))])]), False), ("tokens", ("lit", None), False), MODE],
             [(("microbatch_grads",), "NaN in microbatch 1", "hard", ())])),
    ("loss.py: (N, C, 0) logits (no positions) are refused with the native library's 'inner must be >= 1 (the "
     "product of the positions' sizes)', naming no argument of the call (torch takes them: an empty batch)",
     "cross_entropy positions", "unclear error", r"inner must be >= 1",
     example("cross_entropy positions", [("logits", buf("float32", (1, 2, 0), "numpy", "unit", 1), False),
                                          ("targets", buf("int64", (1, 0), "numpy", ("ids", 0, 2), 2), False), MODE],
             [((), "edge dimensions {'N': 1, 'V': 2, 'P': 0}", "soft", ())])),
]


def known(desc, verdict):
    """The KNOWN entry a finding is an instance of, or None."""
    import re
    category, text = verdict["finding"]
    for entry in KNOWN:
        if desc["target"] in entry[1].split("|") and entry[2] == category and re.search(entry[3], text):
            return entry
    return None
