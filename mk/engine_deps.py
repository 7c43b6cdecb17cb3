"""Print an installed distribution's requirements, less the names given (one a line, for pip -r).

vLLM 0.34 pins GPU kernel packages that the package index does not carry for this host (and that
the scheduler-side tests never import); the engine's venv installs vLLM without them."""

import re
import sys
from importlib.metadata import requires

dist, skip = sys.argv[1], {s.lower().replace("_", "-") for s in sys.argv[2:]}
for req in requires(dist) or []:
    name = re.match(r"[A-Za-z0-9._-]+", req).group(0).lower().replace("_", "-")
    if name not in skip and "extra ==" not in req:
        print(req)
