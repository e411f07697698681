package dsmpb

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// files returns the descriptors; they are set by the generated init
// functions, after package variables are initialised.
func files() []protoreflect.FileDescriptor {
	return []protoreflect.FileDescriptor{File_types_proto, File_client_proto, File_admin_proto}
}

// TestEnumsStartUnspecified checks that the zero value of every enum is the
// UNSPECIFIED one, so that an unset field never reads as a real value.
func TestEnumsStartUnspecified(t *testing.T) {
	n := 0
	check := func(es protoreflect.EnumDescriptors) {
		for i := 0; i < es.Len(); i++ {
			e := es.Get(i)
			n++
			zero := e.Values().ByNumber(0)
			if zero == nil || !strings.HasSuffix(string(zero.Name()), "_UNSPECIFIED") {
				t.Errorf("enum %s: zero value is %v, want *_UNSPECIFIED", e.FullName(), zero)
			}
		}
	}
	var walk func(protoreflect.MessageDescriptors)
	walk = func(ms protoreflect.MessageDescriptors) {
		for i := 0; i < ms.Len(); i++ {
			check(ms.Get(i).Enums())
			walk(ms.Get(i).Messages())
		}
	}
	for _, f := range files() {
		check(f.Enums())
		walk(f.Messages())
	}
	if n < 5 {
		t.Fatalf("found %d enums, want at least 5: descriptors not walked", n)
	}
}

// TestServicesDocumented checks that the services have the methods the
// callers rely on; a rename in a .proto file shows up here, not in dsmctl.
func TestServicesDocumented(t *testing.T) {
	want := map[string][]string{
		"dsm.v1.Client": {"Session", "CreateRegion", "DeleteRegion", "ListRegions", "GetRegion",
			"Load", "Store", "Add", "CompareAndSwap", "Sync", "SessionsAlive"},
		"dsm.v1.Admin": {"Status", "Members", "Raft", "Regions", "RegionInfo",
			"Mappings", "CreateRegion", "DeleteRegion", "Pages", "Stats", "ReadMemory", "WriteMemory",
			"SetRegionAccess", "Keyring", "RemoveMember"},
	}
	for _, f := range files() {
		for i := 0; i < f.Services().Len(); i++ {
			s := f.Services().Get(i)
			methods, ok := want[string(s.FullName())]
			if !ok {
				t.Errorf("unexpected service %s", s.FullName())
				continue
			}
			for _, m := range methods {
				if s.Methods().ByName(protoreflect.Name(m)) == nil {
					t.Errorf("%s has no method %s", s.FullName(), m)
				}
			}
			if got := s.Methods().Len(); got != len(methods) {
				t.Errorf("%s has %d methods, want %d", s.FullName(), got, len(methods))
			}
			delete(want, string(s.FullName()))
		}
	}
	for s := range want {
		t.Errorf("service %s missing", s)
	}
}

// TestGeneratedUpToDate regenerates the Go code into a temporary directory
// and compares it with the checked-in files.
func TestGeneratedUpToDate(t *testing.T) {
	for _, tool := range []string{"protoc", "protoc-gen-go", "protoc-gen-go-grpc"} {
		if _, err := exec.LookPath(tool); err != nil {
			gobin := filepath.Join(os.Getenv("HOME"), "go", "bin", tool)
			if _, err := os.Stat(gobin); err != nil {
				t.Skipf("%s not installed: cannot check the generated code", tool)
			}
		}
	}
	out := t.TempDir()
	cmd := exec.Command("protoc", "-I", ".",
		"--go_out="+out, "--go_opt=paths=source_relative",
		"--go-grpc_out="+out, "--go-grpc_opt=paths=source_relative",
		"types.proto", "client.proto", "admin.proto")
	cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":"+filepath.Join(os.Getenv("HOME"), "go", "bin"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, b)
	}
	gen, _ := filepath.Glob(filepath.Join(out, "*.go"))
	if len(gen) != 5 {
		t.Fatalf("protoc produced %d Go files, want 5", len(gen))
	}
	for _, g := range gen {
		name := filepath.Base(g)
		want, _ := os.ReadFile(g)
		have, err := os.ReadFile(name)
		if err != nil {
			t.Errorf("%s: generated but not checked in: %v", name, err)
			continue
		}
		if !bytes.Equal(have, want) {
			t.Errorf("%s differs from what the installed generators produce: run go generate ./internal/rpc/... (tool versions in generate.go)", name)
		}
	}
}

// FuzzUnmarshalRequest feeds arbitrary bytes to the decoder of every
// request message a server receives: decoding must fail cleanly or yield a
// message that encodes again, never panic.
func FuzzUnmarshalRequest(f *testing.F) {
	reqs := []proto.Message{
		&CreateRegionRequest{}, &DeleteRegionRequest{}, &GetRegionRequest{},
		&LoadRequest{}, &StoreRequest{}, &AddRequest{}, &CompareAndSwapRequest{},
		&SyncRequest{}, &PagesRequest{}, &StatsRequest{}, &RegionInfoRequest{},
		&ReadMemoryRequest{}, &WriteMemoryRequest{},
	}
	seed, _ := proto.Marshal(&CreateRegionRequest{Name: "feat", Size: 1 << 30, PageSize: 4096, Durability: Durability_DURABILITY_DURABLE})
	f.Add(seed)
	seed, _ = proto.Marshal(&WriteMemoryRequest{Region: "r", Offset: 8, Data: []byte("hello"), Sync: true})
	f.Add(seed)
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, r := range reqs {
			m := r.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(b, m); err != nil {
				continue
			}
			if _, err := proto.Marshal(m); err != nil {
				t.Fatalf("%T decoded but does not encode: %v", m, err)
			}
		}
	})
}
