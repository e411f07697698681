package k8s

import (
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/dsmkit/dsm/node"
)

// composeFile is the part of the Compose specification that
// deploy/compose/compose.yaml uses; decoding it strictly refuses any other
// field. (The Compose file is checked here because this module has a YAML
// decoder and the service's module has none.)
type composeFile struct {
	XDsmd    composeService            `json:"x-dsmd"`
	Services map[string]composeService `json:"services"`
	Volumes  map[string]any            `json:"volumes"`
}

type composeService struct {
	Image           string   `json:"image"`
	NetworkMode     string   `json:"network_mode"`
	ReadOnly        bool     `json:"read_only"`
	CapDrop         []string `json:"cap_drop"`
	SecurityOpt     []string `json:"security_opt"`
	Restart         string   `json:"restart"`
	StopGracePeriod string   `json:"stop_grace_period"`
	Command         []string `json:"command"`
	Volumes         []string `json:"volumes"`
}

// TestComposeFile: the three services run dsmd with arguments dsmd accepts,
// on distinct loopback ports, with the least privilege of the image test,
// and their data and sockets on volumes.
func TestComposeFile(t *testing.T) {
	b, err := os.ReadFile("../compose/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f composeFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	if len(f.Services) != 3 {
		t.Fatalf("%d services, want 3", len(f.Services))
	}
	ports := map[int]string{}
	for name, s := range f.Services {
		if s.NetworkMode != "host" || !s.ReadOnly || !slices.Equal(s.CapDrop, []string{"ALL"}) ||
			!slices.Contains(s.SecurityOpt, "no-new-privileges:true") {
			t.Errorf("%s: want host networking, a read-only root, every capability dropped and no new privileges", name)
		}
		cfg, err := node.ParseFlags(s.Command, io.Discard)
		if err != nil {
			t.Fatalf("%s: dsmd refuses %v: %v", name, s.Command, err)
		}
		if other, dup := ports[cfg.PortBase]; dup {
			t.Errorf("%s and %s both use port base %d", name, other, cfg.PortBase)
		}
		ports[cfg.PortBase] = name
		a := cfg.Resolve()
		for _, dir := range []string{cfg.DataDir, "/run/dsm"} {
			if !slices.ContainsFunc(s.Volumes, func(v string) bool { return strings.HasSuffix(v, ":"+dir) }) {
				t.Errorf("%s: %s is on no volume (the root is read-only)", name, dir)
			}
		}
		if a.Socket != node.DefaultSocket {
			t.Errorf("%s: socket %s, want %s (the image's DSM_ADDR)", name, a.Socket, node.DefaultSocket)
		}
		if len(cfg.Join) == 0 || cfg.BootstrapExpect != 3 {
			t.Errorf("%s: want --join and --bootstrap-expect 3", name)
		}
	}
}
