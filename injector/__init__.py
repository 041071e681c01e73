"""Admission: the /inject and /validate-sidecarset webhooks over HTTP, and the pure injection engine."""
