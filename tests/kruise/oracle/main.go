// Command kruise-oracle answers questions about SidecarSets with OpenKruise's
// own code (v1.9.1), so sidecarctl's answers can be compared with Kruise's on
// the same objects. It reads one JSON request per line on stdin and writes one
// JSON answer per line on stdout:
//
//	{"op":"inject","pod":{},"namespaces":[],"sidecarSets":[],"revisions":[]}
//	  -> {"allowed":true,"pod":{},"changed":true} or {"error":"..."}
//	{"op":"validate","sidecarSet":{},"existing":[],"namespaces":[]}
//	  -> {"allowed":false,"message":"..."}
//	{"op":"sort","strategy":{},"pods":[]} -> {"order":[2,0,1]}
//	{"op":"scatter","strategy":[],"pods":[],"indexes":[]} -> {"order":[1,0]}
//	{"op":"convert","object":{},"to":"v1beta1"} -> {"object":{}}
//	{"op":"bench","pod":{},"namespaces":[],"sidecarSets":[],"seconds":3}
//	  -> {"perPodMicros":1750.2,"pods":1700}
//
// SidecarSets may be given at either apps.kruise.io version; they are stored
// as v1beta1, Kruise's hub, through Kruise's own conversion.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	jsonpatch "github.com/evanphx/json-patch"
	admissionv1 "k8s.io/api/admission/v1"
	apps "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/openkruise/kruise/apis"
	"github.com/openkruise/kruise/apis/apps/defaults"
	appsv1alpha1 "github.com/openkruise/kruise/apis/apps/v1alpha1"
	appsv1beta1 "github.com/openkruise/kruise/apis/apps/v1beta1"
	"github.com/openkruise/kruise/pkg/controller/sidecarset"
	"github.com/openkruise/kruise/pkg/util/controllerfinder"
	"github.com/openkruise/kruise/pkg/util/fieldindex"
	"github.com/openkruise/kruise/pkg/util/updatesort"
	podmutating "github.com/openkruise/kruise/pkg/webhook/pod/mutating"
	ssvalidating "github.com/openkruise/kruise/pkg/webhook/sidecarset/validating"
)

type request struct {
	Op          string            `json:"op"`
	Pod         json.RawMessage   `json:"pod"`
	Namespaces  []json.RawMessage `json:"namespaces"`
	SidecarSets []json.RawMessage `json:"sidecarSets"`
	Revisions   []json.RawMessage `json:"revisions"`
	SidecarSet  json.RawMessage   `json:"sidecarSet"`
	Existing    []json.RawMessage `json:"existing"`
	Strategy    json.RawMessage   `json:"strategy"`
	Pods        []json.RawMessage `json:"pods"`
	Object      json.RawMessage   `json:"object"`
	Indexes     []int             `json:"indexes"`
	To          string            `json:"to"`
	Seconds     float64           `json:"seconds"`
}

type answer map[string]interface{}

func main() {
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)
	// The API server sends CreateOptions with every create; Kruise's
	// WorkloadSpread step decodes them.
	scheme.Scheme.AddKnownTypes(metav1.SchemeGroupVersion, &metav1.CreateOptions{})
	if err := apis.AddToScheme(scheme.Scheme); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for in.Scan() {
		var req request
		var ans answer
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			ans = answer{"error": "bad request: " + err.Error()}
		} else {
			ans = serve(&req)
		}
		if err := enc.Encode(ans); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		out.Flush()
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}

func serve(req *request) (ans answer) {
	defer func() {
		if r := recover(); r != nil {
			ans = answer{"error": fmt.Sprintf("panic: %v\n%s", r, debug.Stack())}
		}
	}()
	var err error
	switch req.Op {
	case "inject":
		ans, err = inject(req)
	case "validate":
		ans, err = validate(req)
	case "sort":
		ans, err = sortPods(req)
	case "scatter":
		ans, err = scatter(req)
	case "convert":
		ans, err = convert(req)
	case "bench":
		ans, err = bench(req)
	default:
		err = fmt.Errorf("unknown op %q", req.Op)
	}
	if err != nil {
		return answer{"error": err.Error()}
	}
	return ans
}

// toBeta reads a SidecarSet at either version and returns Kruise's hub form.
// With admit, the object first goes through what Kruise's SidecarSet mutating
// webhook does at its version (`admitted`), as a stored SidecarSet has.
func toBeta(raw json.RawMessage, admit bool) (*appsv1beta1.SidecarSet, error) {
	var meta metav1.TypeMeta
	if err := json.Unmarshal(raw, &meta); err != nil {
		return nil, err
	}
	version := strings.TrimPrefix(meta.APIVersion, "apps.kruise.io/")
	if version != "v1alpha1" && version != "v1beta1" {
		return nil, fmt.Errorf("not a Kruise SidecarSet: apiVersion %q", meta.APIVersion)
	}
	if admit {
		var err error
		if raw, err = admitted(raw, version); err != nil {
			return nil, err
		}
	}
	out := &appsv1beta1.SidecarSet{}
	if version == "v1beta1" {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, err
		}
		return out, nil
	}
	alpha := &appsv1alpha1.SidecarSet{}
	if err := json.Unmarshal(raw, alpha); err != nil {
		return nil, err
	}
	if err := alpha.ConvertTo(out); err != nil {
		return nil, err
	}
	return out, nil
}

func objects(req *request) ([]client.Object, error) {
	var objs []client.Object
	for _, raw := range req.Namespaces {
		ns := &corev1.Namespace{}
		if err := json.Unmarshal(raw, ns); err != nil {
			return nil, err
		}
		objs = append(objs, ns)
	}
	for _, raw := range append(append([]json.RawMessage{}, req.SidecarSets...), req.Existing...) {
		ss, err := toBeta(raw, true)
		if err != nil {
			return nil, err
		}
		objs = append(objs, ss)
	}
	for _, raw := range req.Revisions {
		rev := &apps.ControllerRevision{}
		if err := json.Unmarshal(raw, rev); err != nil {
			return nil, err
		}
		objs = append(objs, rev)
	}
	return objs, nil
}

// newClient is the fake API Kruise's handlers read; it also becomes Kruise's global controller
// finder, which its PodUnavailableBudget step uses to look up a pod's owner (a manager sets it up
// at start in Kruise itself).
func newClient(objs []client.Object) client.Client {
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(objs...).WithIndex(
		&appsv1beta1.SidecarSet{}, fieldindex.IndexNameForSidecarSetNamespace, fieldindex.IndexSidecarSetV1Beta1,
	).Build()
	controllerfinder.Finder = &controllerfinder.ControllerFinder{Client: c}
	return c
}

func podRequest(raw json.RawMessage, pod *corev1.Pod) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       "oracle",
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Namespace: pod.Namespace,
		Name:      pod.Name,
		Operation: admissionv1.Create,
		Object:    kruntime.RawExtension{Raw: raw},
		Options:   kruntime.RawExtension{Raw: []byte(`{"apiVersion":"meta.k8s.io/v1","kind":"CreateOptions"}`)},
	}}
}

func inject(req *request) (answer, error) {
	objs, err := objects(req)
	if err != nil {
		return nil, err
	}
	pod := &corev1.Pod{}
	if err := json.Unmarshal(req.Pod, pod); err != nil {
		return nil, err
	}
	h := &podmutating.PodCreateHandler{Client: newClient(objs), Decoder: admission.NewDecoder(scheme.Scheme)}
	resp := h.Handle(context.Background(), podRequest(req.Pod, pod))
	if !resp.Allowed {
		msg := ""
		if resp.Result != nil {
			msg = resp.Result.Message
		}
		return answer{"allowed": false, "message": msg}, nil
	}
	// The patch is computed against the pod's Go round trip (as the API server
	// applies it to its own serialisation), not against the request's bytes.
	mutated, err := json.Marshal(pod)
	if err != nil {
		return nil, err
	}
	if len(resp.Patches) > 0 {
		ops, err := json.Marshal(resp.Patches)
		if err != nil {
			return nil, err
		}
		patch, err := jsonpatch.DecodePatch(ops)
		if err != nil {
			return nil, err
		}
		if mutated, err = patch.Apply(mutated); err != nil {
			return nil, err
		}
	}
	return answer{"allowed": true, "changed": len(resp.Patches) > 0, "pod": json.RawMessage(mutated),
		"warnings": resp.Warnings}, nil
}

func validate(req *request) (answer, error) {
	objs, err := objects(req)
	if err != nil {
		return nil, err
	}
	var meta metav1.TypeMeta
	if err := json.Unmarshal(req.SidecarSet, &meta); err != nil {
		return nil, err
	}
	version := "v1beta1"
	if meta.APIVersion == "apps.kruise.io/v1alpha1" {
		version = "v1alpha1"
	}
	defaulted, err := admitted(req.SidecarSet, version)
	if err != nil {
		return nil, err
	}
	// patchPodMetadata needs an admin's whitelist in Kruise; ours has none (README: Choices), so
	// Kruise is given one that allows every key and the rest of its validation is compared.
	objs = append(objs, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kruise-system", Name: "kruise-configuration"},
		Data: map[string]string{
			"SidecarSet_PatchPodMetadata_WhiteList": `{"rules":[{"allowedAnnotationKeyExprs":[".*"]}]}`,
		},
	})
	h := &ssvalidating.SidecarSetCreateUpdateHandler{Client: newClient(objs), Decoder: admission.NewDecoder(scheme.Scheme)}
	resp := h.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       "oracle",
		Kind:      metav1.GroupVersionKind{Group: "apps.kruise.io", Version: version, Kind: "SidecarSet"},
		Resource:  metav1.GroupVersionResource{Group: "apps.kruise.io", Version: version, Resource: "sidecarsets"},
		Operation: admissionv1.Create,
		Object:    kruntime.RawExtension{Raw: defaulted},
	}})
	msg := ""
	if resp.Result != nil {
		msg = resp.Result.Message
	}
	return answer{"allowed": resp.Allowed, "message": msg}, nil
}

// admitted returns a SidecarSet as Kruise's SidecarSet mutating webhook leaves
// it at its own version: the API server runs that webhook before the
// validating one.
func admitted(raw json.RawMessage, version string) ([]byte, error) {
	if version == "v1alpha1" {
		return defaulted(raw, defaults.SetDefaultsSidecarSet, defaults.SetHashSidecarSet)
	}
	return defaulted(raw, defaults.SetDefaultsSidecarSetV1beta1, defaults.SetHashSidecarSetV1beta1)
}

// defaulted decodes a SidecarSet of either version, applies Kruise's defaults
// and hashes for that version, and encodes it again.
func defaulted[T any](raw json.RawMessage, setDefaults func(*T), setHash func(*T) error) ([]byte, error) {
	obj := new(T)
	if err := json.Unmarshal(raw, obj); err != nil {
		return nil, err
	}
	setDefaults(obj)
	if err := setHash(obj); err != nil {
		return nil, err
	}
	return json.Marshal(obj)
}

func sortPods(req *request) (answer, error) {
	var strategy appsv1beta1.SidecarSetUpdateStrategy
	if len(req.Strategy) > 0 {
		if err := json.Unmarshal(req.Strategy, &strategy); err != nil {
			return nil, err
		}
	}
	pods := make([]*corev1.Pod, len(req.Pods))
	indexes := make([]int, len(req.Pods))
	for i, raw := range req.Pods {
		pods[i] = &corev1.Pod{}
		if err := json.Unmarshal(raw, pods[i]); err != nil {
			return nil, err
		}
		indexes[i] = i
	}
	return answer{"order": sidecarset.SortUpdateIndexes(strategy, pods, indexes)}, nil
}

// scatter runs Kruise's scatter sorter alone (what its own scatter sort tables test): `strategy`
// is the list of terms, `pods` may hold nulls (a missing pod), `indexes` are the candidates.
func scatter(req *request) (answer, error) {
	var terms appsv1beta1.UpdateScatterStrategy
	if err := json.Unmarshal(req.Strategy, &terms); err != nil {
		return nil, err
	}
	pods := make([]*corev1.Pod, len(req.Pods))
	for i, raw := range req.Pods {
		if err := json.Unmarshal(raw, &pods[i]); err != nil {
			return nil, err
		}
	}
	indexes := append([]int{}, req.Indexes...)
	return answer{"order": updatesort.NewScatterSorterV1beta1(terms).Sort(pods, indexes)}, nil
}

func convert(req *request) (answer, error) {
	switch req.To {
	case "v1beta1":
		beta, err := toBeta(req.Object, false)
		if err != nil {
			return nil, err
		}
		beta.APIVersion, beta.Kind = "apps.kruise.io/v1beta1", "SidecarSet"
		return answer{"object": beta}, nil
	case "v1alpha1":
		beta, err := toBeta(req.Object, false)
		if err != nil {
			return nil, err
		}
		alpha := &appsv1alpha1.SidecarSet{}
		if err := alpha.ConvertFrom(beta); err != nil {
			return nil, err
		}
		alpha.APIVersion, alpha.Kind = "apps.kruise.io/v1alpha1", "SidecarSet"
		return answer{"object": alpha}, nil
	}
	return nil, fmt.Errorf("convert: unknown version %q", req.To)
}

// bench times PodCreateHandler.Handle on one pod, on the calling thread (one
// core: GOMAXPROCS is set to 1 for the measurement).
func bench(req *request) (answer, error) {
	objs, err := objects(req)
	if err != nil {
		return nil, err
	}
	pod := &corev1.Pod{}
	if err := json.Unmarshal(req.Pod, pod); err != nil {
		return nil, err
	}
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	h := &podmutating.PodCreateHandler{Client: newClient(objs), Decoder: admission.NewDecoder(scheme.Scheme)}
	areq := podRequest(req.Pod, pod)
	for i := 0; i < 50; i++ {
		h.Handle(context.Background(), areq)
	}
	runtime.GC()
	n, start := 0, time.Now()
	deadline := start.Add(time.Duration(req.Seconds * float64(time.Second)))
	for time.Now().Before(deadline) {
		if resp := h.Handle(context.Background(), areq); !resp.Allowed {
			return nil, fmt.Errorf("bench: pod refused: %v", resp.Result)
		}
		n++
	}
	took := time.Since(start)
	// The fake client copies every object it lists (through JSON), where Kruise's informer cache
	// with DisableDeepCopy hands out shared objects: time the handler's SidecarSet lists alone so
	// the report can take them out.
	c := h.Client
	m, start := 0, time.Now()
	deadline = start.Add(time.Duration(req.Seconds * float64(time.Second) / 2))
	for time.Now().Before(deadline) {
		for _, scope := range []string{pod.Namespace, fieldindex.IndexValueSidecarSetClusterScope} {
			list := &appsv1beta1.SidecarSetList{}
			if err := c.List(context.Background(), list, client.MatchingFields{fieldindex.IndexNameForSidecarSetNamespace: scope}); err != nil {
				return nil, err
			}
		}
		m++
	}
	lists := time.Since(start)
	return answer{"pods": n, "perPodMicros": float64(took.Microseconds()) / float64(n),
		"listsMicros": float64(lists.Microseconds()) / float64(m)}, nil
}
