package directory_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(nodeProcessEnv) != "" {
		runNodeProcess()
		return
	}
	goleak.VerifyTestMain(m)
}
