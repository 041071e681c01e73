"""Per-pod overrides: what a pod asks of its sidecars by the `sidecarctl.io/overrides` annotation,
read, merged into the sidecar and checked against what the SidecarSet's `spec.overrides` allows.

Istio's `sidecar.istio.io/proxyCPU` and its kind replace a whole section from one value and let a
team ask for anything; here the SidecarSet owner bounds what a pod may change, the annotation is
read into typed values (`annotation`), and the check and the field-by-field merge (`merge`) refuse
what is outside the bounds, like a LimitRange, never clamping. One meaning for every reader: the
injection engine (webhook and `sidecarctl inject`), the in-place resize of running pods and the
rollout, `check-inject` and the SidecarSet webhook's warning about tightened bounds.
Pure: no cluster, no clock. May import `sidecarsets.spec` and `sidecarsets.values`.
"""
