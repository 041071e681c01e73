"""Whether this run is CI's (`CI=true`), where a tier that would skip for want of a binary or a
capability must fail instead: there every tier must really run."""

from __future__ import annotations

import os

IN_CI = os.environ.get("CI", "").lower() == "true"
