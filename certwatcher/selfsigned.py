"""The self-signed issuer's former place: it is `selfsigned.issuer`. These names stay importable from
here only for the manager's control role, which has not moved to the new names yet; nothing else
may import them from here (tests/unit/test_layering.py).
"""

from __future__ import annotations

from selfsigned.issuer import SelfSignedConfig as SelfSignedConfig
from selfsigned.issuer import SelfSignedIssuer as SelfSignedIssuer
