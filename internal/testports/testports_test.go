package testports

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

func TestPortsAreNeverGivenTwice(t *testing.T) {
	seen := map[string]bool{}
	for range 3 * blockSize { // crosses into other blocks
		a := Addr(t)
		if seen[a] {
			t.Fatalf("%s given twice", a)
		}
		seen[a] = true
	}
	base := Range(t, 26)
	for p := base; p < base+26; p++ {
		a := "127.0.0.1:" + strconv.Itoa(p)
		if seen[a] {
			t.Fatalf("range from %d overlaps %s", base, a)
		}
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("port of the range not free: %v", err)
		}
		ln.Close()
	}
}

// Another process never takes a block this one holds.
func TestBlocksAreExclusiveAcrossProcesses(t *testing.T) {
	if os.Getenv("TESTPORTS_CHILD") != "" {
		os.Stdout.WriteString(Addr(t) + "\n")
		return
	}
	mine := Addr(t)
	myBlock := blockOf(t, mine)
	for range 5 {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestBlocksAreExclusiveAcrossProcesses$")
		cmd.Env = append(os.Environ(), "TESTPORTS_CHILD=1")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		for _, line := range strings.Fields(string(out)) {
			if strings.HasPrefix(line, "127.0.0.1:") && blockOf(t, line) == myBlock {
				t.Fatalf("child got %s from block %d, which this process holds", line, myBlock)
			}
		}
	}
}

func blockOf(t *testing.T, addr string) int {
	_, port, _ := net.SplitHostPort(addr)
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return (p - first) / blockSize
}
