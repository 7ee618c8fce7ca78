"""Write a simulated recipe whose every case draws every simulator knob at random.

    .venv/bin/python scripts/draw_sim_recipe.py --name sim-train-v3 --cases 240 --seed 21000 \\
        --hold-out tp8 pp --hold-out-fault bandwidth_throttle -o evalsets/sim-train-v3.json
    .venv/bin/python scripts/draw_sim_recipe.py --name sim-shapes-v2 --cases 48 --seed 22000 \\
        --only tp8 pp -o evalsets/sim-shapes-v2.json

What is drawn, and from which ranges: `teller.eval.draw`. The recipe builds with
`teller lab recipe RECIPE --out DIR`; the same arguments write the same file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from teller.eval.draw import DEFAULT_BUDGET, MAX_WORLD, SHAPES, DrawRules, draw_cases
from teller.eval.recipes import write_recipe
from teller.lab.sim.faults import SIM_FAULTS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="the recipe's name and case-id prefix")
    parser.add_argument("--cases", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True, help="draws, and case i's seed + i")
    parser.add_argument("--hold-out", nargs="*", default=[], choices=sorted(SHAPES))
    parser.add_argument("--only", nargs="*", default=[], choices=sorted(SHAPES))
    parser.add_argument("--hold-out-fault", nargs="*", default=[], choices=SIM_FAULTS)
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="ranks x steps x layers")
    parser.add_argument(
        "--max-world", type=int, default=MAX_WORLD, help="the most ranks a case has"
    )
    parser.add_argument("--note", default="", help="why the recipe was made, for its description")
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    rules = DrawRules(
        tuple(args.hold_out),
        tuple(args.only),
        tuple(args.hold_out_fault),
        args.budget,
        args.max_world,
    )
    cases = draw_cases(args.cases, args.seed, args.name, rules)
    command = (
        f"scripts/draw_sim_recipe.py --name {args.name} --cases {args.cases} --seed {args.seed}"
        + (f" --hold-out {' '.join(args.hold_out)}" if args.hold_out else "")
        + (f" --only {' '.join(args.only)}" if args.only else "")
        + (f" --hold-out-fault {' '.join(args.hold_out_fault)}" if args.hold_out_fault else "")
        + (f" --budget {args.budget}" if args.budget != DEFAULT_BUDGET else "")
        + (f" --max-world {args.max_world}" if args.max_world != MAX_WORLD else "")
    )
    description = (
        f"{args.note + ' ' if args.note else ''}Every simulator knob drawn per case "
        f"(teller.eval.draw), written by `{command}`; built by "
        f"`teller lab recipe {args.out} --out DIR`."
    )
    write_recipe(args.out, args.name, description, cases)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
