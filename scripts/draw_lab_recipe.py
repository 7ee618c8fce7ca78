"""Write a lab recipe whose every case draws its parameters at random (real recordings).

    .venv/bin/python scripts/draw_lab_recipe.py --name lab-train-v2 --cases 18 --seed 300 \\
        -o evalsets/lab-train-v2.json

What is drawn, and from which ranges: `teller.eval.draw_lab`. The recipe records with
`teller lab recipe RECIPE --out DIR` (root, for the faults that need it); the same arguments write
the same file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from teller.eval.draw_lab import draw_lab_cases
from teller.eval.recipes import write_recipe


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="the recipe's name and case-id prefix")
    parser.add_argument("--cases", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True, help="draws, and case i's seed + i")
    parser.add_argument("--note", default="", help="why the recipe was made, for its description")
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    cases = draw_lab_cases(args.cases, args.seed, args.name)
    command = (
        f"scripts/draw_lab_recipe.py --name {args.name} --cases {args.cases} --seed {args.seed}"
    )
    description = (
        f"{args.note + ' ' if args.note else ''}Real lab cases with TP, rate, duration, window, "
        f"intensity and guilty rank drawn per case (teller.eval.draw_lab), written by "
        f"`{command}`; recorded by `teller lab recipe {args.out} --out DIR`."
    )
    write_recipe(args.out, args.name, description, cases)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
