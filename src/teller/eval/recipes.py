"""Evaluation-set recipes: small committed spec files that rebuild the same cases from seeds.

Generated cases are never committed; a recipe is. `build(spec, out)` runs each entry through the
same commands a user would (`teller lab sim …`, `teller lab run …`, through the library functions behind them), skips cases already built
(resumable), records failures without stopping, and writes `index.jsonl`.

Spec (JSON): ``{"name": str, "description": str, "cases": [{"id": str, "kind": "sim"|"lab",
"args": {option: value, …}}, …]}``; each option is the command's long flag without the dashes
(`gpus_per_node` → ``--gpus-per-node``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from teller.errors import TellerError

COMMANDS = {"sim": ["lab", "sim"], "lab": ["lab", "run"]}


@dataclass
class Recipe:
    name: str
    description: str
    cases: list[dict]

    @classmethod
    def read(cls, path: Path) -> Recipe:
        try:
            data = json.loads(Path(path).read_text())
            recipe = cls(data["name"], data.get("description", ""), list(data["cases"]))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise TellerError(f"{path}: not an evaluation recipe: {error}") from None
        for index, case in enumerate(recipe.cases):
            if case.get("kind") not in COMMANDS or "id" not in case:
                raise TellerError(f"{path}: case {index}: needs an id and kind sim or lab")
        return recipe


def command_line(case: dict, out: Path) -> list[str]:
    argv = [*COMMANDS[case["kind"]], "--out", str(out / case["id"])]
    for key, value in case.get("args", {}).items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv.extend([flag, str(value)])
    return argv


def build_case(case: dict, out: Path) -> None:
    """One case of a recipe, by the library function its command runs; TellerError when the
    case cannot be built."""
    if case["kind"] == "sim":
        from teller.lab.sim.cli import add_arguments, run_from_args

        parser = argparse.ArgumentParser(prog="teller lab sim", exit_on_error=False)
        add_arguments(parser)
        try:
            args = parser.parse_args(command_line(case, out)[len(COMMANDS["sim"]) :])
        except (argparse.ArgumentError, SystemExit) as error:
            raise TellerError(f"case {case['id']}: bad simulator arguments: {error}") from None
        run_from_args(args, progress=False)
        return
    from teller.lab.run import CaseSpec, parse_window, run_case

    args = dict(case.get("args", {}))
    spec = CaseSpec()
    renamed = {"duration": "duration_s", "rate": "rate_per_s"}
    for key, value in args.items():
        field_name = renamed.get(key, key)
        if key == "window":
            spec.window_s = parse_window(value)
        elif hasattr(spec, field_name):
            setattr(spec, field_name, type(getattr(spec, field_name))(value))
        else:
            raise TellerError(f"case {case['id']}: unknown lab option {key!r}")
    run_case(spec, out / case["id"])


def build(spec: Path, out: Path, progress: bool = True) -> tuple[int, int, int]:
    """Build every case of the recipe under `out`; returns (built, skipped, failed)."""
    recipe = Recipe.read(spec)
    out.mkdir(parents=True, exist_ok=True)
    built = skipped = failed = 0
    with (out / "index.jsonl").open("a") as index:
        for case in tqdm(recipe.cases, desc=f"building {recipe.name}", disable=not progress):
            if (out / case["id"] / "labels.json").is_file():
                skipped += 1
                continue
            started = time.monotonic()
            record: dict = {"id": case["id"], "status": 0}
            try:
                build_case(case, out)
            except TellerError as error:
                record.update(status=2, error=str(error))
            record["seconds"] = round(time.monotonic() - started, 1)
            status = record["status"]
            index.write(json.dumps(record) + "\n")
            index.flush()
            if status == 0:
                built += 1
            else:
                failed += 1
    return built, skipped, failed
