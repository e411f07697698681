package directory

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dsmkit/dsm/internal/ids"
)

var testLease = leaseParams{Period: 250 * time.Millisecond, Length: 1500 * time.Millisecond, Revoke: 300 * time.Millisecond}

// TestLeaseArithmetic: with every clock within 1±ε of real time, a lease
// is over (its revocation included) before a fencing voter answers, at
// the extremes of drift: the holder's clock slow, the voter's fast.
func TestLeaseArithmetic(t *testing.T) {
	p := testLease
	if got, want := p.hold(), 1185*time.Millisecond; got != want {
		t.Fatalf("hold %v, want %v", got, want)
	}
	if got, want := p.fenceWait(), 1515*time.Millisecond; got != want {
		t.Fatalf("fence wait %v, want %v", got, want)
	}
	for _, holderRate := range []float64{1 - leaseDrift, 1, 1 + leaseDrift} {
		for _, voterRate := range []float64{1 - leaseDrift, 1, 1 + leaseDrift} {
			// Real time 0: the holder sends. Real time g >= 0: the voter
			// grants. The holder's lease, revocation included, ends when
			// its clock has advanced hold + Revoke: real time
			// (hold+Revoke)/holderRate. The voter answers a fence when its
			// clock has advanced fenceWait since the grant: real time
			// g + fenceWait/voterRate.
			for _, g := range []time.Duration{0, 10 * time.Millisecond, time.Second} {
				leaseEnd := time.Duration(float64(p.hold()+p.Revoke) / holderRate)
				answer := g + time.Duration(float64(p.fenceWait())/voterRate)
				if leaseEnd > answer {
					t.Fatalf("holder rate %v, voter rate %v, grant at %v: the lease ends at %v, after the fence answer at %v",
						holderRate, voterRate, g, leaseEnd, answer)
				}
			}
		}
	}
}

// TestGrantTable: a voter grants nothing during its quiet period, stops
// granting a fenced incarnation, answers a fence only a fence wait after
// its last grant, grants the next incarnation, and lifts a fence only
// after the fenced incarnation's departure was committed and it was
// admitted again.
func TestGrantTable(t *testing.T) {
	p := testLease
	start := 100 * time.Second
	g := newGrantTable(p, start)
	const n, a, b = ids.NodeID(2), uint64(0xa), uint64(0xb)
	if r := g.grant(start+time.Second, n, a, 0); r != refuseStarting {
		t.Fatalf("grant during the quiet period: %q", r)
	}
	// A fence during the quiet period waits it out: the voter may have
	// granted before it restarted.
	if until := g.fence(start+time.Second, 7, 0x7, 3); until != start+p.fenceWait() {
		t.Fatalf("fence during the quiet period answers at %v, want %v", until, start+p.fenceWait())
	}
	now := start + 2*time.Second
	if r := g.grant(now, n, a, 0); r != "" {
		t.Fatalf("grant: %q", r)
	}
	if until := g.fence(now+100*time.Millisecond, n, a, 5); until != now+p.fenceWait() {
		t.Fatalf("fence answers at %v, want a fence wait after the grant at %v", until, now)
	}
	if r := g.grant(now+200*time.Millisecond, n, a, 0); r != refuseFenced {
		t.Fatalf("grant to a fenced incarnation: %q", r)
	}
	// A fence of an incarnation never granted (or granted long ago)
	// answers at once.
	later := now + 10*time.Second
	if until := g.fence(later, 3, 0x3, 5); until != later {
		t.Fatalf("fence of an ungranted incarnation answers at %v, want now %v", until, later)
	}
	// The next incarnation is granted.
	if r := g.grant(later, n, b, 0); r != "" {
		t.Fatalf("grant to the next incarnation: %q", r)
	}
	// The fenced incarnation admitted again without a failure verdict
	// after the fence: still refused.
	g.fence(later, n, b, 9)
	if r := g.grant(later+time.Second, n, b, 9); r != refuseFenced {
		t.Fatalf("grant after a fence, no verdict since: %q", r)
	}
	// After a verdict (epoch 10) and a return to alive: granted again.
	if r := g.grant(later+2*time.Second, n, b, 10); r != "" {
		t.Fatalf("grant after the verdict and a return: %q", r)
	}
}

// TestLeaseExpiry: the leader judges an incarnation only after it had the
// expiry to ask, and only when it has not granted it for that long; an
// incarnation it never granted has the longer firstExpiry, which covers
// the leader's retry backoff towards a follower that was down.
func TestLeaseExpiry(t *testing.T) {
	p := testLease
	if p.firstExpiry() <= p.expiry()+10*time.Second {
		t.Fatalf("firstExpiry %v does not cover hashicorp/raft's retry backoff (10.24 s) beyond the expiry %v", p.firstExpiry(), p.expiry())
	}
	start := 50 * time.Second
	g := newGrantTable(p, start)
	const n, a = ids.NodeID(4), uint64(0x44)
	now := start + 5*time.Second
	if g.expired(now, n, a, 0) {
		t.Fatal("expired at first sight")
	}
	if g.expired(now+p.expiry()+time.Millisecond, n, a, 0) {
		t.Fatal("a new incarnation never granted expired after the expiry: it may not have its log yet")
	}
	if g.expired(now+p.firstExpiry(), n, a, 0) {
		t.Fatal("expired at exactly the first expiry after first sight")
	}
	if !g.expired(now+p.firstExpiry()+time.Millisecond, n, a, 0) {
		t.Fatal("not expired after the first expiry without grants")
	}
	if r := g.grant(now+3*time.Second, n, a, 0); r != "" {
		t.Fatal(r)
	}
	if g.expired(now+3*time.Second+p.expiry(), n, a, 0) {
		t.Fatal("expired within the expiry of a grant")
	}
	if !g.expired(now+3*time.Second+p.expiry()+time.Millisecond, n, a, 0) {
		t.Fatal("not expired after the expiry of its last grant")
	}
	// A new incarnation starts its own count, with the first expiry.
	seen := now + 20*time.Second
	if g.expired(seen, n, a+1, 0) {
		t.Fatal("a new incarnation expired at first sight")
	}
	if !g.expired(seen+p.firstExpiry()+time.Millisecond, n, a+1, 0) {
		t.Fatal("not expired")
	}
	// The same incarnation admitted again after a failure verdict starts
	// its count again too.
	if g.expired(seen+p.firstExpiry()+time.Millisecond, n, a+1, 7) {
		t.Fatal("an incarnation admitted again expired at first sight")
	}
}

// TestLeaseHolder: a lease only grows, from the send time of the latest
// round a majority granted, and each extension wakes the waiters.
func TestLeaseHolder(t *testing.T) {
	h := newLeaseHolder(testLease)
	until, ch, _ := h.get()
	if until != 0 {
		t.Fatalf("a lease before any grant: %v", until)
	}
	h.extend(10 * time.Second)
	select {
	case <-ch:
	default:
		t.Fatal("an extension did not wake the waiters")
	}
	until, ch, _ = h.get()
	if until != 10*time.Second+testLease.hold() {
		t.Fatalf("lease until %v", until)
	}
	h.extend(9 * time.Second) // a late answer to an older round
	if u, _, _ := h.get(); u != until {
		t.Fatalf("an older round shortened or moved the lease: %v", u)
	}
	select {
	case <-ch:
		t.Fatal("an older round woke the waiters")
	default:
	}
	why := fmt.Errorf("%w: test", ErrDeclaredFailed)
	h.depart(why)
	select {
	case <-ch:
	default:
		t.Fatal("a departure did not wake the waiters")
	}
	h.extend(20 * time.Second)
	if u, _, dep := h.get(); u != until || !errors.Is(dep, ErrDeclaredFailed) {
		t.Fatalf("after a departure: lease until %v (want %v, not extended), departed %v", u, until, dep)
	}
	h.depart(fmt.Errorf("%w: later", ErrDeparted))
	if _, _, dep := h.get(); dep != why {
		t.Fatalf("a second departure replaced the first: %v", dep)
	}
}
