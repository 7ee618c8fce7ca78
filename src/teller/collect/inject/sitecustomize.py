"""Interpreter start-up hook of `teller collect`: this folder is prepended to PYTHONPATH.

Python imports `sitecustomize` at start-up; this one installs the collector's agent (which waits for
`import torch`, so processes that never import torch pay only this file), then runs the
`sitecustomize` that would have run without us, if any, so the target's own start-up is unchanged.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _install_agent() -> None:
    if not os.environ.get("TELLER_COLLECT_DIR"):
        return
    try:
        import _teller_collect_agent

        _teller_collect_agent.install()
    except Exception as error:  # never stop the target from starting
        print(f"teller collect: agent not installed: {error}", file=sys.stderr)


def _chain_to_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_install_agent()
_chain_to_next_sitecustomize()
