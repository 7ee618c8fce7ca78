"""Each incident as one JSON POST (`incident.json`'s content) to a URL the user names."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from teller.errors import TellerError
from teller.watch.incident import Incident

WEBHOOK_TIMEOUT_S = 10.0


def post_incident(url: str, incident: Incident) -> None:
    """POST the incident; a TellerError says why it did not arrive."""
    body = json.dumps({"teller": "incident", **incident.to_json()}).encode()
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as response:
            response.read()
    except urllib.error.HTTPError as error:
        raise TellerError(f"webhook {url}: HTTP {error.code} {error.reason}") from None
    except (urllib.error.URLError, OSError) as error:
        raise TellerError(f"webhook {url}: {getattr(error, 'reason', error)}") from None
