package cli

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// transfer counts the bytes and pages of a long copy (region export and
// import) and, when shown, redraws a progress line on w ten times a
// second: bytes done of total, pages per second, MB per second and the
// time left.
type transfer struct {
	label string
	total int64 // bytes; 0 when not known
	// noPages: the transfer counts bytes only (the line shows no pages/s).
	noPages bool
	bytes   atomic.Int64
	pages   atomic.Int64
	start   time.Time

	w    io.Writer // nil: not shown
	stop chan struct{}
	done sync.WaitGroup
}

// startTransfer starts counting; with w set it draws until finish.
func startTransfer(label string, total int64, w io.Writer) *transfer {
	return startTransferOf(&transfer{label: label, total: total, w: w})
}

// startTransferOf starts t, whose label, total, noPages and w are set.
func startTransferOf(t *transfer) *transfer {
	t.start, t.stop = time.Now(), make(chan struct{})
	w := t.w
	if w == nil {
		return t
	}
	t.done.Add(1)
	go func() {
		defer t.done.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-t.stop:
				fmt.Fprintf(t.w, "\r%s\x1b[K\n", t.line(time.Since(t.start)))
				return
			case <-tick.C:
				fmt.Fprintf(t.w, "\r%s\x1b[K", t.line(time.Since(t.start)))
			}
		}
	}()
	return t
}

// add counts n bytes and p pages done.
func (t *transfer) add(n, p int64) {
	t.bytes.Add(n)
	t.pages.Add(p)
}

// finish draws the last line and returns the time taken.
func (t *transfer) finish() time.Duration {
	select {
	case <-t.stop:
	default:
		close(t.stop)
	}
	t.done.Wait()
	return time.Since(t.start)
}

// line is the progress line after elapsed.
func (t *transfer) line(elapsed time.Duration) string {
	done, pages := t.bytes.Load(), t.pages.Load()
	var b strings.Builder
	b.WriteString(t.label)
	b.WriteByte(' ')
	if t.total > 0 {
		d := min(max(done, 0), t.total)
		fill := int(d * 30 / t.total)
		fmt.Fprintf(&b, "[%s%s] %3d%% %s/%s", strings.Repeat("=", fill), strings.Repeat(" ", 30-fill),
			d*100/t.total, FormatSize(uint64(d)), FormatSize(uint64(t.total)))
	} else {
		b.WriteString(FormatSize(uint64(max(done, 0))))
	}
	s := elapsed.Seconds()
	if s <= 0 {
		return b.String()
	}
	if !t.noPages {
		fmt.Fprintf(&b, " · %s pages/s", rate(float64(pages)/s))
	}
	fmt.Fprintf(&b, " · %sB/s", rate(float64(done)/s))
	if t.total > 0 && done > 0 && done < t.total {
		left := time.Duration(float64(t.total-done) / (float64(done) / s) * float64(time.Second))
		fmt.Fprintf(&b, " · ETA %s", left.Round(time.Second))
	}
	return b.String()
}
