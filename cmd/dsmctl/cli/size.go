package cli

import (
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

// ErrSize is wrapped by every error of ParseSize.
var ErrSize = errors.New("bad size")

// units maps a lower-case unit to its multiplier. Bare letters and the
// IEC forms (KiB) are powers of two, as memory sizes are; the SI forms (kB,
// MB) are powers of ten, for whoever means them.
var units = map[string]uint64{
	"": 1, "b": 1,
	"k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10, "kb": 1e3,
	"m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20, "mb": 1e6,
	"g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30, "gb": 1e9,
	"t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40, "tb": 1e12,
	"p": 1 << 50, "pi": 1 << 50, "pib": 1 << 50, "pb": 1e15,
}

// ParseSize reads a byte count: "4096", "0x1000", "4KiB", "64GiB",
// "1TiB", "1.5GiB", "2M" (binary) or "10MB" (decimal). Units are
// case-insensitive and may follow a space. The result must be a whole
// number of bytes that fits in 64 bits.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("%w: empty", ErrSize)
	}
	if h, ok := strings.CutPrefix(strings.ToLower(t), "0x"); ok {
		v, err := strconv.ParseUint(h, 16, 64)
		if err != nil {
			return 0, fmt.Errorf("%w %q: not a hexadecimal number of bytes", ErrSize, s)
		}
		return v, nil
	}
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	if num == "" || strings.Count(num, ".") > 1 || strings.HasPrefix(num, ".") || strings.HasSuffix(num, ".") {
		return 0, fmt.Errorf("%w %q: want a number and an optional unit, like 4KiB or 64GiB", ErrSize, s)
	}
	mult, ok := units[unit]
	if !ok {
		return 0, fmt.Errorf("%w %q: unknown unit %q (use B, KiB, MiB, GiB, TiB, PiB, or kB, MB, GB, TB, PB)", ErrSize, s, t[i:])
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("%w %q: not a number", ErrSize, s)
	}
	r.Mul(r, new(big.Rat).SetUint64(mult))
	if !r.IsInt() {
		return 0, fmt.Errorf("%w %q: not a whole number of bytes", ErrSize, s)
	}
	if !r.Num().IsUint64() {
		return 0, fmt.Errorf("%w %q: larger than 16 EiB", ErrSize, s)
	}
	return r.Num().Uint64(), nil
}

// FormatSize writes a byte count for people: exact when it is a whole
// number of a binary unit ("64 GiB", "4 KiB"), else with one decimal
// ("1.5 GiB"); below 1 KiB in bytes.
func FormatSize(n uint64) string {
	names := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	u := 0
	for u+1 < len(names) && n >= 1<<(10*(u+1)) {
		u++
	}
	if u == 0 {
		return strconv.FormatUint(n, 10) + " B"
	}
	div := uint64(1) << (10 * u)
	if n%div == 0 {
		return strconv.FormatUint(n/div, 10) + " " + names[u]
	}
	// Tenths rounded down, in integers: (n%div)*10 fits since div <= 2^60.
	return strconv.FormatUint(n/div, 10) + "." + strconv.FormatUint((n%div)*10/div, 10) + " " + names[u]
}
