package directory

import (
	"bytes"
	"context"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// hclogFor builds the hclog.Logger that hashicorp/raft wants, writing into
// slog. hclog renders "[LEVEL] name: message"; the level is mapped back.
func hclogFor(l *slog.Logger, name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:        name,
		Level:       hclog.Info,
		Output:      slogWriter{l: l, component: name},
		DisableTime: true,
	})
}

type slogWriter struct {
	l         *slog.Logger
	component string
}

func (w slogWriter) Write(p []byte) (int, error) {
	msg := bytes.TrimSpace(p)
	level := slog.LevelInfo
	switch {
	case bytes.HasPrefix(msg, []byte("[ERROR]")):
		level = slog.LevelError
	case bytes.HasPrefix(msg, []byte("[WARN]")):
		level = slog.LevelWarn
	case bytes.HasPrefix(msg, []byte("[DEBUG]")), bytes.HasPrefix(msg, []byte("[TRACE]")):
		level = slog.LevelDebug
	}
	if i := bytes.IndexByte(msg, ']'); i >= 0 && msg[0] == '[' {
		msg = bytes.TrimSpace(msg[i+1:])
	}
	w.l.Log(context.Background(), level, string(msg), "component", w.component)
	return len(p), nil
}
