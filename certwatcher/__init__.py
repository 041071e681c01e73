"""Serving-certificate reload and caBundle sync. Depends on nothing else in sidecarctl."""
