"""A generic Kubernetes runtime: API client, informer, work queue, leader election, events.

It knows nothing of SidecarSets, so the cert watcher and the domain packages can share it; it
imports nothing of ours.
"""
