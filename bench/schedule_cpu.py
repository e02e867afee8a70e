"""The cost of an exact learning rate per optimizer step (issue 5: at most 2 us amortized).

    python bench/schedule_cpu.py [--steps 100000] [--repeat 5] [--write]

Figures: for each schedule, the median over --repeat runs of a fresh schedule's
``lr_at(1) .. lr_at(steps)`` in a Python loop (what an optimizer does, one call per step, the
native library answering 1024 steps per call), divided by the steps; and the same steps as
one ``lr_values`` call (the native cost alone). With torch installed, torch's own
``CosineAnnealingLR.step()`` + ``get_last_lr()`` per step is measured beside them. --write
appends the record to bench/results/schedule_cpu.jsonl. Exits 1 if a schedule's lr_at costs
more than 2 us per step.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import write_result  # noqa: E402

import mojo_train as mt  # noqa: E402

LIMIT_US = 2.0


def schedules(steps):
    return {
        "WarmupCosineLR": lambda: mt.WarmupCosineLR(3e-4, warmup_steps=2000, total_steps=steps, min_lr=3e-5),
        "WarmupLinearLR": lambda: mt.WarmupLinearLR(3e-4, warmup_steps=2000, total_steps=steps, min_lr=3e-5),
        "ConstantLR": lambda: mt.ConstantLR(3e-4, warmup_steps=2000),
    }


def per_step_us(fn, steps, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / steps * 1e6


def lr_at_loop(make, steps):
    def run():
        s = make()
        lr_at = s.lr_at
        for t in range(1, steps + 1):
            lr_at(t)
    return run


def torch_cosine(steps):
    try:
        import torch
    except ImportError:
        return None
    w = torch.zeros(1, requires_grad=True)

    def run():
        opt = torch.optim.SGD([w], lr=3e-4)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=3e-5)
        for _ in range(steps):
            sched.step()
            sched.get_last_lr()
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    figures, worst = {}, 0.0
    for name, make in schedules(args.steps).items():
        at = per_step_us(lr_at_loop(make, args.steps), args.steps, args.repeat)
        block = per_step_us(lambda: make().lr_values(args.steps), args.steps, args.repeat)
        figures[name] = {"lr_at_us_per_step": round(at, 3), "lr_values_us_per_step": round(block, 3)}
        worst = max(worst, at)
        print("%-15s lr_at %.3f us/step   lr_values %.3f us/step" % (name, at, block))
    torch_run = torch_cosine(args.steps)
    if torch_run is not None:
        us = per_step_us(torch_run, args.steps, args.repeat)
        figures["torch CosineAnnealingLR step+get_last_lr"] = {"us_per_step": round(us, 3)}
        print("%-15s %.3f us/step (torch CosineAnnealingLR, for scale)" % ("torch", us))
    figures["steps"] = args.steps
    if args.write:
        write_result("schedule_cpu", figures, "python bench/schedule_cpu.py --steps %d --repeat %d"
                     % (args.steps, args.repeat))
    if worst > LIMIT_US:
        print("FAIL: lr_at costs %.3f us per step, over the %.1f us target" % (worst, LIMIT_US))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
