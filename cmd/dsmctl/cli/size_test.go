package cli

import (
	"errors"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
	}{
		{"0", 0}, {"4096", 4096}, {"0x1000", 4096}, {"0X10", 16},
		{"4KiB", 4 << 10}, {"4kib", 4 << 10}, {"4K", 4 << 10}, {"4 KiB", 4 << 10}, {"4Ki", 4 << 10},
		{"64GiB", 64 << 30}, {"64G", 64 << 30}, {"1TiB", 1 << 40}, {"2PiB", 2 << 50},
		{"1.5GiB", 3 << 29}, {"0.5KiB", 512}, {"10MB", 10_000_000}, {"1kB", 1000}, {"3TB", 3e12},
		{"512B", 512}, {" 8MiB ", 8 << 20}, {"16383PiB", 16383 << 50},
		{"18446744073709551615", 1<<64 - 1},
	} {
		got, err := ParseSize(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{
		"", "GiB", "-1", "1.5", "0.3KiB", "4XB", "4 K B", "1..2", ".5K", "5.K",
		"16384PiB", "18446744073709551616", "0xZZ", "1e3", "4KiB5",
	} {
		if got, err := ParseSize(in); !errors.Is(err, ErrSize) {
			t.Errorf("ParseSize(%q) = %d, %v; want an ErrSize", in, got, err)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for _, c := range []struct {
		in   uint64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1 KiB"}, {4096, "4 KiB"}, {1536, "1.5 KiB"},
		{64 << 30, "64 GiB"}, {1 << 40, "1 TiB"}, {3<<29 + 1, "1.5 GiB"}, {1<<64 - 1, "15.9 EiB"},
	} {
		if got := FormatSize(c.in); got != c.want {
			t.Errorf("FormatSize(%d) = %q, want %q", c.in, got, c.want)
		}
	}
	// What FormatSize writes exactly, ParseSize reads back.
	for _, n := range []uint64{1 << 10, 4 << 10, 64 << 30, 1 << 40, 7 << 50} {
		s := FormatSize(n)
		if got, err := ParseSize(s); err != nil || got != n {
			t.Errorf("ParseSize(FormatSize(%d) = %q) = %d, %v", n, s, got, err)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"4KiB", "0x10", "1.5GiB", "18446744073709551615", "9.99999999999TB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSize(s)
		if err != nil {
			if !errors.Is(err, ErrSize) {
				t.Fatalf("ParseSize(%q): error %v is not an ErrSize", s, err)
			}
			return
		}
		if s2 := FormatSize(v); s2 == "" {
			t.Fatalf("FormatSize(%d) is empty", v)
		}
	})
}
