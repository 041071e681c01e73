"""What `/validate-sidecarset` says beyond a SidecarSet's own fields (sidecarsets.validation):

- `tenants`: whether a NamespacedSidecarSet may be written, by whom (a SubjectAccessReview) and where;
- `tightened`: the running pods an update of `spec.overrides` leaves outside its new bounds (a warning);
- `advice`: warnings for what a Kruise manifest asks and sidecarctl gives no effect.
"""
