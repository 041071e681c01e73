"""Pods as the SidecarSet controller sees them, and what it concludes from them.

A pod projection (the few fields the controller keeps instead of whole pods) and its records,
the pod key, the questions asked of one pod against one SidecarSet (updated, consistent, ready,
done upgrading), and pods that run without the sidecars they should have.
Pure: it reads no cluster. May import `sidecarsets.spec` and `sidecarsets.values`; never rollout
or controller.
"""
