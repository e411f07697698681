// Package k8s holds the Kubernetes manifests of the DSM service (kustomize
// bases under base/, overlays/ and app/) and their test: every manifest is
// decoded strictly into the k8s.io/api types (an unknown field fails), the
// StatefulSet's dsmd arguments are parsed by dsmd's own flag parser, and
// kubectl kustomize builds every kustomization where kubectl is installed.
// It also checks deploy/compose/compose.yaml the same way (strictly decoded,
// dsmd's arguments parsed by dsmd's parser): this module has the YAML
// decoder.
//
// It is a module of its own so that the Kubernetes API packages stay out of
// the service's module; make test and make lint run it too.
package k8s
