package k8s

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/dsmkit/dsm/node"
)

// kustomization is the part of kustomize's Kustomization that these files
// use; decoding it strictly refuses any other field (a typo, or a feature
// this test does not check).
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Resources  []string `json:"resources"`
	Labels     []struct {
		Pairs map[string]string `json:"pairs"`
	} `json:"labels,omitempty"`
	Images []struct {
		Name   string `json:"name"`
		NewTag string `json:"newTag"`
	} `json:"images,omitempty"`
	Replicas []struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
	} `json:"replicas,omitempty"`
	Patches []struct {
		Path string `json:"path"`
	} `json:"patches,omitempty"`
}

// object decodes one manifest strictly into its k8s.io/api type.
func object(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	var obj any
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 StatefulSet":
		obj = &appsv1.StatefulSet{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "v1 Namespace":
		obj = &corev1.Namespace{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "batch/v1 Job":
		obj = &batchv1.Job{}
	default:
		return nil, fmt.Errorf("kind %q of %q: not one this test knows; add it", tm.Kind, tm.APIVersion)
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// documents splits a multi-document YAML stream.
func documents(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(b, []byte("\n---")) {
		if len(bytes.TrimSpace(d)) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

// manifests decodes every YAML file under the module, strictly: the
// kustomizations into kustomization, the rest into the API types.
func manifests(t *testing.T) (objs map[string][]any, kusts map[string]*kustomization) {
	t.Helper()
	objs, kusts = map[string][]any{}, map[string]*kustomization{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if filepath.Base(path) == "kustomization.yaml" {
			k := &kustomization{}
			if err := yaml.UnmarshalStrict(b, k); err != nil {
				return fmt.Errorf("%s: %v", path, err)
			}
			kusts[filepath.Dir(path)] = k
			return nil
		}
		for _, doc := range documents(b) {
			obj, err := object(doc)
			if err != nil {
				return fmt.Errorf("%s: %v", path, err)
			}
			objs[path] = append(objs[path], obj)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return objs, kusts
}

func TestManifestsDecodeStrictly(t *testing.T) {
	objs, kusts := manifests(t)
	if len(objs) == 0 || len(kusts) == 0 {
		t.Fatal("no manifests found")
	}
	// Every file a kustomization names exists, and every manifest is named
	// by one (none is forgotten).
	named := map[string]bool{}
	for dir, k := range kusts {
		if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
			t.Errorf("%s/kustomization.yaml: %s %s", dir, k.APIVersion, k.Kind)
		}
		paths := slices.Clone(k.Resources)
		for _, p := range k.Patches {
			paths = append(paths, p.Path)
		}
		for _, r := range paths {
			p := filepath.Join(dir, r)
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s/kustomization.yaml names %s: %v", dir, r, err)
			}
			named[p] = true
		}
	}
	for p := range objs {
		if !named[p] {
			t.Errorf("%s is in no kustomization", p)
		}
	}
}

// base returns the base's StatefulSet, Service and PodDisruptionBudget.
func base(t *testing.T) (*appsv1.StatefulSet, *corev1.Service, *policyv1.PodDisruptionBudget) {
	t.Helper()
	objs, _ := manifests(t)
	var (
		ss  *appsv1.StatefulSet
		svc *corev1.Service
		pdb *policyv1.PodDisruptionBudget
	)
	for path, list := range objs {
		if filepath.Dir(path) != "base" {
			continue
		}
		for _, o := range list {
			switch o := o.(type) {
			case *appsv1.StatefulSet:
				ss = o
			case *corev1.Service:
				svc = o
			case *policyv1.PodDisruptionBudget:
				pdb = o
			}
		}
	}
	if ss == nil || svc == nil || pdb == nil {
		t.Fatalf("base lacks a StatefulSet, Service or PodDisruptionBudget")
	}
	return ss, svc, pdb
}

func TestStatefulSet(t *testing.T) {
	ss, svc, pdb := base(t)
	spec := ss.Spec
	if spec.Ordinals == nil || spec.Ordinals.Start != 1 {
		t.Error("ordinals must start at 1: pod dsm-N is node N, and node ids start at 1")
	}
	if spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Error("podManagementPolicy must be Parallel: no pod is ready before three nodes bootstrap together")
	}
	if spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
		t.Error("updateStrategy must be OnDelete: a restarted node's homed pages are lost, the operator decides when")
	}
	if spec.ServiceName != svc.Name || svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("serviceName %q: want the headless Service %q (clusterIP None, publishNotReadyAddresses)", spec.ServiceName, svc.Name)
	}
	podLabels := labels.Set(spec.Template.Labels)
	for what, sel := range map[string]*metav1.LabelSelector{"StatefulSet": spec.Selector, "PodDisruptionBudget": pdb.Spec.Selector} {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil || !s.Matches(podLabels) {
			t.Errorf("the %s selector does not select the pods: %v", what, err)
		}
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Error("the Service does not select the pods")
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Error("the PodDisruptionBudget must allow at most one pod away")
	}
	// dsmd's leave (drain, hand-over and Raft removal) is bounded by
	// --leave-timeout, 20 s by default.
	if g := spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g < 30 {
		t.Error("terminationGracePeriodSeconds must leave dsmd its 20 s leave and a margin")
	}

	if len(spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want dsmd alone", len(spec.Template.Spec.Containers))
	}
	c := spec.Template.Spec.Containers[0]
	if p := c.ReadinessProbe; p == nil || p.Exec == nil || !slices.Contains(p.Exec.Command, "status") ||
		!strings.HasSuffix(p.Exec.Command[0], "dsmctl") {
		t.Error("readiness must come from dsmctl status")
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Privileged != nil && *sc.Privileged {
		t.Error("dsmd's container must drop every capability, add none, and run read-only without privilege escalation")
	}

	// The arguments are dsmd's: its own parser accepts them, with the
	// environment Kubernetes substitutes and a keyring where the Secret is.
	keyring := filepath.Join(t.TempDir(), "keyring.json")
	if err := os.WriteFile(keyring, []byte(`["`+strings.Repeat("A", 43)+`="]`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.labels['apps.kubernetes.io/pod-index']":
			env[e.Name] = "2"
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			env[e.Name] = "10.1.2.3"
		default:
			env[e.Name] = e.Value
		}
	}
	var args []string
	for _, a := range c.Args {
		for k, v := range env {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		if strings.Contains(a, "$(") {
			t.Errorf("argument %q names a variable the container does not define", a)
		}
		if v, ok := strings.CutPrefix(a, "--gossip-keyring-file="); ok {
			a = "--gossip-keyring-file=" + keyring
			if !mountedAt(c, filepath.Dir(v)) {
				t.Errorf("--gossip-keyring-file %s is on no volume", v)
			}
		}
		args = append(args, a)
	}
	cfg, err := node.ParseFlags(args, io.Discard)
	if err != nil {
		t.Fatalf("dsmd refuses the StatefulSet's arguments: %v\n%s", err, strings.Join(args, "\n"))
	}
	if cfg.ID != 2 {
		t.Errorf("--id from the pod-index label: got %d, want 2", cfg.ID)
	}
	addrs := cfg.Resolve()
	ports := map[string]bool{}
	for _, p := range c.Ports {
		ports[fmt.Sprintf("%d/%s", p.ContainerPort, p.Protocol)] = true
	}
	for name, a := range map[string]string{"gossip": addrs.Gossip, "raft": addrs.Raft, "rpc": addrs.RPC, "verbs": addrs.Verbs, "metrics": cfg.MetricsAddr} {
		_, port, _ := strings.Cut(a, ":")
		if n, _ := strconv.Atoi(port); !ports[fmt.Sprintf("%d/TCP", n)] && !ports[fmt.Sprintf("%d/", n)] {
			t.Errorf("%s listens on %s, which the container does not declare", name, a)
		}
	}
	for _, dir := range []string{cfg.DataDir, filepath.Dir(addrs.Socket), filepath.Dir(addrs.MapSocket), cfg.TLSDir} {
		if !mountedAt(c, dir) {
			t.Errorf("%s is on no volume (the root file system is read-only)", dir)
		}
	}
	var data bool
	for _, v := range spec.VolumeClaimTemplates {
		if v.Name == "data" {
			data = true
		}
	}
	if !data || !mountedAt(c, cfg.DataDir) {
		t.Error("the data directory must be on the persistent volume claim \"data\"")
	}
	// Every node of the first three is a --join target, by its stable name.
	for i := 1; i <= 3; i++ {
		if !slices.Contains(cfg.Join, fmt.Sprintf("%s-%d.%s:%d", ss.Name, i, svc.Name, cfg.PortBase)) {
			t.Errorf("--join lacks node %d's stable name: %v", i, cfg.Join)
		}
	}
	// The probe asks the socket dsmd serves.
	if !slices.Contains(c.ReadinessProbe.Exec.Command, addrs.Socket) {
		t.Errorf("the readiness probe does not ask %s", addrs.Socket)
	}
}

// mountedAt reports whether dir is a volume mount of c.
func mountedAt(c corev1.Container, dir string) bool {
	for _, m := range c.VolumeMounts {
		if m.MountPath == dir {
			return true
		}
	}
	return false
}

// TestKustomizeBuild builds every kustomization with kubectl kustomize
// (offline: the manifests are local) and decodes the output strictly.
func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("SKIPPED: kubectl is not installed; the manifests were decoded without kustomize")
	}
	_, kusts := manifests(t)
	for dir := range kusts {
		t.Run(dir, func(t *testing.T) {
			out, err := exec.Command(kubectl, "kustomize", dir).Output()
			if err != nil {
				var stderr []byte
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = ee.Stderr
				}
				t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr)
			}
			for _, doc := range documents(out) {
				obj, err := object(doc)
				if err != nil {
					t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, doc)
				}
				if ss, ok := obj.(*appsv1.StatefulSet); ok && dir == filepath.Join("overlays", "five-nodes") {
					if ss.Spec.Replicas == nil || *ss.Spec.Replicas != 5 || ss.Namespace != "dsm" {
						t.Errorf("the five-nodes overlay: replicas %v in %q", ss.Spec.Replicas, ss.Namespace)
					}
				}
			}
		})
	}
}
