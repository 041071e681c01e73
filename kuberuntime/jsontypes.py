"""Wire objects are kept as the plain JSON the API server sends.

Generated client models cost memory and time per pod and lose unknown fields; a dict keeps
every field the user wrote and round-trips byte for byte.
"""

from __future__ import annotations

from typing import Any

JsonObj = dict[str, Any]
