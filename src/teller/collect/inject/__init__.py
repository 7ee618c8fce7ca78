"""Code that runs inside the target's processes (kept importable without teller on the path)."""
