"""The caBundle syncer's former place: it is `cabundle.syncer`. These names stay importable from
here only for the manager's control role, which has not moved to the new names yet; nothing else
may import them from here (tests/unit/test_layering.py).
"""

from __future__ import annotations

from cabundle.syncer import CABundleSyncer as CABundleSyncer
from cabundle.syncer import WebhookConfigRef as WebhookConfigRef
