"""The engine's own profiler endpoints, driven over HTTP: `POST /start_profile`, `/stop_profile`.

vLLM serves them when started with `VLLM_TORCH_PROFILER_DIR` (or `--profiler-config` in newer
releases), SGLang has its own `/start_profile`, the lab's server has both; each engine writes one
trace per rank into its profile folder, and answers the stop once they are written.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from teller.errors import TellerError

START_TIMEOUT_S = 30.0
#: A stop waits for every rank's export, which takes seconds per rank on a loaded host.
STOP_TIMEOUT_S = 300.0


class CaptureError(TellerError):
    """A capture could not be made (the engine refused, went away or wrote no trace)."""


class EngineProfiler:
    def __init__(self, engine_url: str) -> None:
        self.engine_url = engine_url.rstrip("/")

    def start(self) -> None:
        self._post("/start_profile", START_TIMEOUT_S)

    def stop(self) -> None:
        self._post("/stop_profile", STOP_TIMEOUT_S)

    def _post(self, path: str, timeout_s: float) -> None:
        url = f"{self.engine_url}{path}"
        request = urllib.request.Request(url, data=b"", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode("utf-8", errors="replace").strip()[:200]
            hint = ""
            if error.code == 404:
                hint = " (is the engine started with VLLM_TORCH_PROFILER_DIR set?)"
            raise CaptureError(f"POST {url}: HTTP {error.code} {detail}{hint}") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise CaptureError(f"POST {url}: {reason}") from None
