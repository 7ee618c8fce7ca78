"""Write a fresh draw of a simulated recipe: the same cases with new seeds, the guilty rank (and a
contended link's peer) moved on, and each fault window moved by some steps, alternately earlier
and later, kept inside the run.

    .venv/bin/python scripts/redraw_sim_recipe.py evalsets/sim-eval-v1.json --name eval7 \\
        --seed-offset 13000 --rank-shift 3 --window-shift 4 -o evalsets/sim-eval-v7.json

Why: a board scored on cases a model was tuned against measures the tuning; a new draw of the
same shapes and faults, made before any model is scored on it, measures the model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from teller.atomic import write_text_atomic


def redraw(case: dict, index: int, name: str, seed_offset: int, rank_shift: int, window_shift: int):
    args = dict(case["args"])
    args["seed"] = int(args["seed"]) + seed_offset
    world = int(args.get("nodes", 1)) * int(args.get("gpus_per_node", 1))
    for key in ("rank", "peer"):
        if key in args:
            args[key] = (int(args[key]) + rank_shift) % world
    if "window" in args:
        first, last = (int(v) for v in str(args["window"]).split(":"))
        shift = window_shift if index % 2 == 0 else -window_shift
        steps = int(args.get("steps", last + 1))
        shift = max(1 - first, min(shift, steps - 1 - last))
        args["window"] = f"{first + shift}:{last + shift}"
    return {**case, "id": f"{name}-{index:03d}-{args['fault']}", "args": args}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="the recipe to redraw (evalsets/…)")
    parser.add_argument("--name", required=True, help="case-id prefix of the new draw")
    parser.add_argument("--seed-offset", type=int, required=True)
    parser.add_argument("--rank-shift", type=int, default=0)
    parser.add_argument("--window-shift", type=int, default=0)
    parser.add_argument("--note", default="", help="why the draw was made, for its description")
    parser.add_argument("-o", "--out", type=Path, required=True)
    args = parser.parse_args()
    base = json.loads(args.base.read_text())
    cases = [
        redraw(c, i, args.name, args.seed_offset, args.rank_shift, args.window_shift)
        for i, c in enumerate(base["cases"])
    ]
    command = (
        f"scripts/redraw_sim_recipe.py {args.base} --name {args.name} "
        f"--seed-offset {args.seed_offset} --rank-shift {args.rank_shift} "
        f"--window-shift {args.window_shift}"
    )
    description = (
        f"{args.note + ' ' if args.note else ''}Every {base['name']} case with seed "
        f"+{args.seed_offset}, the guilty rank (and a contended link's peer) moved "
        f"{args.rank_shift} ranks on and the fault window moved by {args.window_shift} steps "
        f"(alternately later and earlier, inside the run); written by `{command}`, built by "
        f"`teller lab recipe {args.out} --out DIR`."
    )
    recipe = {"name": args.out.stem, "description": description, "cases": cases}
    write_text_atomic(args.out, json.dumps(recipe, indent=1) + "\n")
    print(f"{args.out}: {len(cases)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
