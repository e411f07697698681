package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dsmkit/dsm/internal/ids"
	dsmpb "github.com/dsmkit/dsm/internal/rpc/dsm/v1"
)

// table collects rows and writes them aligned, two spaces between columns.
// It measures cells without their ANSI color sequences, which
// text/tabwriter would count as width.
type table struct {
	rows [][]string
}

func newTable(header ...string) *table { return &table{rows: [][]string{header}} }

func (t *table) row(cells ...any) {
	r := make([]string, len(cells))
	for i, c := range cells {
		r[i] = fmt.Sprint(c)
	}
	t.rows = append(t.rows, r)
}

func (t *table) write(w io.Writer) error {
	var widths []int
	for _, r := range t.rows {
		for i, c := range r {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], visibleLen(c))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		var line strings.Builder
		for i, c := range r {
			line.WriteString(c)
			if i < len(r)-1 {
				line.WriteString(strings.Repeat(" ", widths[i]-visibleLen(c)+2))
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " "))
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// visibleLen is the width of s on a terminal: runes, less ANSI sequences.
func visibleLen(s string) int {
	n := 0
	for i := 0; i < len(s); {
		if s[i] == 0x1b {
			j := strings.IndexByte(s[i:], 'm')
			if j < 0 {
				break
			}
			i += j + 1
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
		n++
	}
	return n
}

// paint wraps s in an ANSI SGR sequence when on is set.
func paint(on bool, sgr, s string) string {
	if !on || sgr == "" {
		return s
	}
	return "\x1b[" + sgr + "m" + s + "\x1b[0m"
}

func node(id uint32) string {
	if id == 0 {
		return "-"
	}
	return ids.NodeID(id).String()
}

func nodes(list []uint32) string {
	if len(list) == 0 {
		return "-"
	}
	s := make([]string, len(list))
	for i, n := range list {
		s[i] = node(n)
	}
	return strings.Join(s, ",")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// enumName turns DURABILITY_DURABLE into "durable": the enum's value name
// less its type prefix, lower case.
func enumName(full, prefix string) string {
	s := strings.TrimPrefix(full, prefix)
	if s == "UNSPECIFIED" {
		return "unknown"
	}
	return strings.ToLower(s)
}

// stateOf is memberState, or "draining" for an alive member that is
// leaving gracefully.
func stateOf(s dsmpb.MemberState, draining bool) string {
	if draining && s == dsmpb.MemberState_MEMBER_STATE_ALIVE {
		return "draining"
	}
	return memberState(s)
}

func memberState(s dsmpb.MemberState) string {
	return enumName(s.String(), "MEMBER_STATE_")
}

func durability(d dsmpb.Durability) string {
	if d == dsmpb.Durability_DURABILITY_UNSPECIFIED {
		return "memory"
	}
	return enumName(d.String(), "DURABILITY_")
}

// latency writes nanoseconds with three significant digits: 850ns, 12.3µs,
// 1.25ms, 2.00s.
func latency(ns uint64) string {
	if ns == 0 {
		return "-"
	}
	f := float64(ns)
	unit := "ns"
	switch {
	case ns >= 1e9:
		f, unit = f/1e9, "s"
	case ns >= 1e6:
		f, unit = f/1e6, "ms"
	case ns >= 1e3:
		f, unit = f/1e3, "µs"
	default:
		return strconv.FormatUint(ns, 10) + "ns"
	}
	prec := 2
	if f >= 100 {
		prec = 0
	} else if f >= 10 {
		prec = 1
	}
	return strconv.FormatFloat(f, 'f', prec, 64) + unit
}

// rate writes a per-second rate compactly: 0, 12, 3.4k, 1.2M.
func rate(v float64) string {
	switch {
	case v >= 1e9:
		return strconv.FormatFloat(v/1e9, 'f', 1, 64) + "G"
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 1, 64) + "M"
	case v >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

// age writes how long ago t was, coarsely; "-" for a time of zero, which
// is not reported (dsmd does not fill Member.last_seen_unix_nano yet), not
// a member never seen.
func age(now time.Time, unixNano int64) string {
	if unixNano == 0 {
		return "-"
	}
	d := now.Sub(time.Unix(0, unixNano))
	switch {
	case d < 0:
		return "now"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms ago"
	case d < time.Minute:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s ago"
	case d < time.Hour:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m ago"
	}
	return strconv.FormatInt(int64(d/time.Hour), 10) + "h ago"
}

// jsonEncode writes v as one line of JSON and a newline.
func jsonEncode(w io.Writer, v any) error {
	e := json.NewEncoder(w)
	e.SetEscapeHTML(false)
	return e.Encode(v)
}
