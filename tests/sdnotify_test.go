package tests

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSdNotify runs dsmd as systemd runs a Type=notify service: with
// $NOTIFY_SOCKET naming a datagram socket. dsmd must say READY=1 once it
// serves (dsmctl status then answers) and STOPPING=1 when SIGTERM makes it
// leave.
func TestSdNotify(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dsmd process; skipped with -short")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	data := filepath.Join(dir, "n1")
	cmd := exec.Command(dsmdBin, "--id", "1", "--data-dir", data,
		"--gossip-addr", freeAddr(t), "--raft-addr", freeAddr(t), "--rpc-addr", freeAddr(t), "--verbs-addr", freeAddr(t),
		"--bootstrap-expect", "1")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	var log syncWriter
	log.w = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			log.mu.Lock()
			t.Logf("dsmd log:\n%s", tail(log.w.String(), 4000))
			log.mu.Unlock()
		}
	}()

	read := func() string {
		t.Helper()
		buf := make([]byte, 4096)
		ln.SetReadDeadline(time.Now().Add(60 * time.Second))
		n, err := ln.Read(buf)
		if err != nil {
			t.Fatalf("no message from dsmd on $NOTIFY_SOCKET: %v", err)
		}
		return string(buf[:n])
	}
	msg := read()
	if !strings.Contains(msg, "READY=1") || !strings.Contains(msg, "STATUS=serving as n1") {
		t.Fatalf("first message %q, want READY=1 and a STATUS", msg)
	}
	// READY means the local socket serves.
	eventually(t, "dsmctl status after READY=1", 60*time.Second, func() error {
		out, errs, code := ctlAt(t, filepath.Join(data, "dsmd.sock"), "status")
		if code != 0 {
			return fmt.Errorf("exit %d: %s%s", code, out, errs)
		}
		return nil
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if msg := read(); !strings.Contains(msg, "STOPPING=1") {
		t.Fatalf("after SIGTERM: %q, want STOPPING=1", msg)
	}
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("dsmd after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("dsmd did not exit 30 s after SIGTERM")
	}
}
