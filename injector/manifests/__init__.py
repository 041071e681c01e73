"""Injection outside admission: manifest files (`sidecarctl inject`) and new pods imagined for `preview`.

Finding the pod template in each workload kind, the run's context (SidecarSets, namespace labels,
revisions, warnings), revision pins and timestamps without the webhook's store and clock, and what
a new pod like a running one would get. May import `injector.engine`, `injector.policy` and
sidecarsets (spec, values, store, pins, validation); never `injector.http`.
"""
