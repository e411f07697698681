// Command dsmd is the daemon of the DSM service on one machine. It only
// reads its flags and the signals (SIGTERM, SIGINT: leave; SIGHUP: reload
// the TLS files), runs package node, and tells systemd (sd_notify, when
// $NOTIFY_SOCKET is set) when it serves and when it stops; dsmd --help
// explains every setting.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dsmkit/dsm/internal/sdnotify"
	"github.com/dsmkit/dsm/node"
)

func main() {
	for _, a := range os.Args[1:] {
		if a == "-h" || a == "-help" || a == "--help" {
			node.Usage(os.Stdout)
			return
		}
	}
	cfg, err := node.ParseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dsmd:", err)
		fmt.Fprintln(os.Stderr, "dsmd: try dsmd --help")
		os.Exit(2)
	}
	log := cfg.NewLogger(os.Stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	// Under systemd (Type=notify) the service manager learns when dsmd
	// serves and when it begins to leave; elsewhere nothing is sent.
	notify := func(states ...string) {
		if _, err := sdnotify.Notify(states...); err != nil {
			log.Warn("telling the service manager failed", "states", states, "err", err)
		}
	}
	if err := node.Run(ctx, cfg, node.Options{Logger: log, Reload: hup, Notify: notify}, time.Duration(cfg.LeaveTimeout)); err != nil {
		log.Error("dsmd failed", "err", err)
		os.Exit(1)
	}
}
