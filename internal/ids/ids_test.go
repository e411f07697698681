package ids

import "testing"

func TestString(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{NodeID(0).String(), "n-"},
		{NodeID(7).String(), "n7"},
		{RegionID(3).String(), "r3"},
		{PageNo(12).String(), "p12"},
		{Epoch(9).String(), "e9"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
