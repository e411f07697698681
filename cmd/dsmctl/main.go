// Command dsmctl is the operator's CLI of the DSM service. Everything but
// the process boundary lives in package cli, so tests run it in-process.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/dsmkit/dsm/cmd/dsmctl/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], cli.OSEnv())
	stop()
	os.Exit(code)
}
