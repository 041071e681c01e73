"""The value types a SidecarSet is written in, as Kubernetes and Kruise define them.

`resource.Quantity` (quantity), Kruise's resource expressions (calculator), IntOrString values
such as `30%` (intorpercent), Go's number formats where we must say what Go says (gofmt), and JSON
templates copied into pods without `copy.deepcopy` (jsontemplate). It imports nothing of ours but
kuberuntime's JSON types: every other room may build on it.
"""
